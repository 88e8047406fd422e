"""The non-stationary linear contextual bandit (paper 3.1, App. B.2.1), pre-generated per seed.

Everything random (contexts, the drifting parameter, the reward noise) is drawn up front with
numpy from one environment seed, so that (i) every candidate is compared on exactly the same
environments and (ii) the per-step loop that calls candidate code does no random work.

Model. At step ``t`` each of ``K`` arms shows a unit-norm context ``x_{t,a}`` in ``R^d``; the
parameter ``theta_t`` lives on the unit sphere and drifts; the reward of arm ``a`` is
``<x_{t,a}, theta_t> + sigma * eps_{t,a}`` with ``eps ~ N(0, 1)``. Regret is the pseudo-regret
``max_a <x_{t,a}, theta_t> - <x_{t,a_t}, theta_t>`` (noise-free, so the oracle scores exactly 0).

Drift. ``theta`` moves along geodesics of the sphere with a persistent, slowly turning
direction; the horizon is split into ``drift_segments`` segments whose drift speeds are random
(some phases are nearly stable, others move fast, as in the paper's narrative), and the step
sizes are scaled so that the total variation ``sum_t ||theta_{t+1} - theta_t||`` equals the
budget ``B_T`` (``drift_budget``).

Contexts. Each arm's raw context is standard normal; with ``center_contexts`` the raw contexts
of one step are centred across arms before normalising (a context says how an arm differs from
the others). Centring widens the spread of the arms' mean rewards, which is what sets the
random policy's regret (about 0.58 for K=d=5, against 0.52 for i.i.d. sphere contexts).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from atlas.fields import require


@dataclass(frozen=True)
class BanditConfig:
    """Environment parameters; see conf/task/bandit.yaml for what each one means. The
    defaults are that file's values (tests/test_schema.py keeps them equal)."""

    K: int = 5  # arms
    d: int = 5  # context dimension
    T: int = 2000  # horizon
    drift_budget: float = 8.0
    drift_segments: int = 4
    drift_persistence: float = 0.99
    noise_sigma: float = 3.0
    center_contexts: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, fix: str) -> None:
            require(ok, "task", name, getattr(self, name), fix)

        need(_is_int(self.K) and self.K >= 2, "K", "use an integer number of arms >= 2")
        need(_is_int(self.d) and self.d >= 2, "d", "use an integer dimension >= 2")
        need(_is_int(self.T) and self.T >= 2, "T", "use an integer horizon >= 2")
        need(_is_real(self.drift_budget) and 0.0 <= self.drift_budget <= 2.0 * (self.T - 1),
             "drift_budget", "use a number in [0, 2*(T-1)] (one step moves at most 2)")
        need(_is_int(self.drift_segments) and 1 <= self.drift_segments <= self.T - 1,
             "drift_segments", "use an integer in [1, T-1] (1 = constant drift speed)")
        need(_is_real(self.drift_persistence) and 0.0 <= self.drift_persistence < 1.0,
             "drift_persistence", "use a number in [0, 1) (0.99 = direction turns slowly)")
        need(_is_real(self.noise_sigma) and 0.0 <= self.noise_sigma <= 100.0,
             "noise_sigma", "use a number in [0, 100]")
        need(isinstance(self.center_contexts, bool), "center_contexts", "use true or false")

    @classmethod
    def from_mapping(cls, cfg: dict[str, Any]) -> "BanditConfig":
        """Pick the environment fields out of a task config (other keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)) and math.isfinite(float(v)))


@dataclass(frozen=True)
class BanditEnv:
    """One pre-generated environment. Arrays are read-only: candidates only ever get copies."""

    seed: int
    contexts: np.ndarray  # (T, K, d) unit-norm arm contexts
    thetas: np.ndarray  # (T, d) unit-norm parameter per step
    means: np.ndarray  # (T, K) expected rewards <x_{t,a}, theta_t>
    rewards: np.ndarray  # (T, K) realised rewards (means + noise) the policy would observe

    @property
    def horizon(self) -> int:
        return int(self.contexts.shape[0])

    @property
    def n_arms(self) -> int:
        return int(self.contexts.shape[1])

    @property
    def best(self) -> np.ndarray:
        """(T,) the oracle's expected reward per step."""
        return self.means.max(axis=1)

    def total_variation(self) -> float:
        """``sum_t ||theta_{t+1} - theta_t||``: the drift actually realised (<= budget)."""
        return float(np.linalg.norm(np.diff(self.thetas, axis=0), axis=1).sum())


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def drift_path(cfg: BanditConfig, rng: np.random.Generator) -> np.ndarray:
    """(T, d) unit vectors whose consecutive chord lengths sum to ``cfg.drift_budget``."""
    T, d = cfg.T, cfg.d
    # per-step chord lengths: a random speed per segment, scaled to spend the budget exactly
    seg = np.minimum(np.arange(T - 1) * cfg.drift_segments // (T - 1), cfg.drift_segments - 1)
    speed = rng.exponential(1.0, size=cfg.drift_segments)[seg]
    chords = cfg.drift_budget * speed / speed.sum()
    if chords.max(initial=0.0) > 2.0:  # a chord cannot exceed the sphere's diameter
        chords = np.minimum(chords, 2.0)
    angles = 2.0 * np.arcsin(np.clip(chords / 2.0, 0.0, 1.0))
    kicks = rng.standard_normal((T - 1, d))
    rho, mix = cfg.drift_persistence, math.sqrt(1.0 - cfg.drift_persistence ** 2)

    thetas = np.empty((T, d))
    theta = _unit(rng.standard_normal(d))
    v = rng.standard_normal(d)
    thetas[0] = theta
    for t in range(T - 1):  # sequential by nature: 2k steps of 5-vectors, a few ms
        v = rho * v + mix * kicks[t]
        v = v - (v @ theta) * theta  # keep the direction tangent to the sphere
        n = math.sqrt(float(v @ v))
        u = v / n if n > 1e-12 else _unit(kicks[t] - (kicks[t] @ theta) * theta)
        theta = math.cos(angles[t]) * theta + math.sin(angles[t]) * u
        theta = theta / math.sqrt(float(theta @ theta))
        thetas[t + 1] = theta
    return thetas


def make_env(cfg: BanditConfig, seed: int) -> BanditEnv:
    """Generate the environment for one seed (deterministic: same seed, same arrays)."""
    rng = np.random.default_rng([int(seed), 0xBA4D17])
    raw = rng.standard_normal((cfg.T, cfg.K, cfg.d))
    if cfg.center_contexts:
        raw = raw - raw.mean(axis=1, keepdims=True)
    contexts = _unit(raw)
    thetas = drift_path(cfg, rng)
    means = np.einsum("tkd,td->tk", contexts, thetas)
    rewards = means + cfg.noise_sigma * rng.standard_normal(means.shape)
    for arr in (contexts, thetas, means, rewards):
        arr.flags.writeable = False
    return BanditEnv(seed=int(seed), contexts=contexts, thetas=thetas, means=means,
                     rewards=rewards)
