"""The PINN problem: Burgers' equation, its drifting viscosity, and the sampled point sets.

    u_t + u u_x = nu u_xx,  x in [-1, 1], t in [0, 1],  u(0, x) = -sin(pi x),  u(t, +-1) = 0.

The paper's schedule formula was lost in extraction; docs/design.md fixes the regimes (viscous
~0.1/pi, shock ~0.01/pi) and we drift log(nu) between them, because stiffness grows with
1/nu: a linear drift in nu would spend almost every round in the easy regime.
nu is held for ``hold_rounds`` rounds (default: a fine-tuning phase) and moves only at the
boundaries, so every score of a phase is on one equation and can be compared like for like.
All randomness is seeded from (seed, round, purpose) so a round's training points and the
network initialisation are the same for every candidate (only the loss strategy differs).
The held-out validation points come from the run's secret and the regime (the viscosity)
alone: every candidate of a regime faces the same hidden evaluation, and nothing in a
program's text (a comment) can draw it other points.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from atlas.fields import check_known_fields, number, require

SCHEDULES = ("geometric", "cosine", "constant")
SCORES = ("composite", "paper", "rel_l2")


@dataclass(frozen=True)
class PinnConfig:
    """Every knob of the PINN task (conf/task/pinn.yaml documents each one)."""

    name: str = "pinn"
    timeout_s: float = 60.0
    # viscosity schedule over exploration rounds
    nu_start: float = 0.1 / math.pi
    nu_end: float = 0.01 / math.pi
    schedule: str = "geometric"
    drift_rounds: int = 8
    hold_rounds: int | None = 4  # nu constant over blocks of this many rounds (None: per round)
    # network and inner optimisation
    depth: int = 4
    width: int = 32
    n_steps: int = 500
    lr: float = 1e-3
    # point sets
    n_collocation: int = 1024
    n_initial: int = 128
    n_boundary: int = 128
    n_val_collocation: int = 2048
    n_val_initial: int = 256
    n_val_boundary: int = 256
    # scoring and statistics handed to the candidate
    score: str = "composite"
    stats_decay: float = 0.9
    exact_nx: int = 256
    exact_nt: int = 101
    seed: int = 0
    # worker options
    jit_candidate: bool = True
    compilation_cache_dir: str | None = None

    def __post_init__(self) -> None:
        g = "task"
        require(self.name == "pinn", g, "name", self.name, "must be 'pinn' for PinnTask")
        require(self.schedule in SCHEDULES, g, "schedule", self.schedule, f"use one of {SCHEDULES}")
        require(self.score in SCORES, g, "score", self.score, f"use one of {SCORES}")
        for f in ("nu_start", "nu_end", "lr", "timeout_s", "stats_decay"):
            low_open = f != "stats_decay"
            object.__setattr__(self, f, number(g, f, getattr(self, f), low=0.0,
                                               low_open=low_open))
        for f in ("depth", "width", "n_steps", "n_collocation", "n_initial", "n_boundary",
                  "n_val_collocation", "n_val_initial", "n_val_boundary", "drift_rounds",
                  "exact_nx", "exact_nt", "seed"):
            object.__setattr__(self, f, number(g, f, getattr(self, f), integer=True,
                                               low=0 if f == "seed" else 1))
        if self.hold_rounds is not None:
            object.__setattr__(self, "hold_rounds", number(g, "hold_rounds", self.hold_rounds,
                                                           integer=True, low=1))
        require(self.n_boundary >= 2 and self.n_val_boundary >= 2, g, "n_boundary",
                self.n_boundary, "n_boundary and n_val_boundary must be >= 2 (points on both walls)")
        require(self.stats_decay < 1.0, g, "stats_decay", self.stats_decay, "must lie in [0, 1)")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> PinnConfig:
        """Build from a config mapping; unknown keys are an error naming the key."""
        check_known_fields((f.name for f in fields(cls)), config, "task",
                           hint=" (see conf/task/pinn.yaml)")
        return cls(**config)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def viscosity(round_index: int, cfg: PinnConfig) -> float:
    """nu at an exploration round: log-space drift from ``nu_start`` towards ``nu_end``.

    geometric: monotone, reaches nu_end at ``drift_rounds`` and stays there;
    cosine: smooth there-and-back with period 2 * drift_rounds (regime returns);
    constant: nu_start for every round.
    With ``hold_rounds`` = H, rounds form blocks 1..H, H+1..2H, ... (round 0, the seed, joins
    the first) and nu steps once per block: block b of the ceil(drift_rounds / H) blocks that
    span the drift sits at position b / (blocks - 1), so the first block is at nu_start and
    the last at nu_end (with one block, nu_start).
    """
    if round_index < 0:
        raise ValueError(f"round must be >= 0, got {round_index}")
    if cfg.schedule == "constant":
        return float(cfg.nu_start)
    if cfg.hold_rounds is None:
        r = round_index / cfg.drift_rounds
    else:
        block = max(0, math.ceil(round_index / cfg.hold_rounds) - 1)
        blocks = math.ceil(cfg.drift_rounds / cfg.hold_rounds)
        r = block / (blocks - 1) if blocks > 1 else 0.0
    s = min(r, 1.0) if cfg.schedule == "geometric" else 0.5 * (1.0 - math.cos(math.pi * r))
    return float(math.exp((1 - s) * math.log(cfg.nu_start) + s * math.log(cfg.nu_end)))


@dataclass(frozen=True)
class PointSet:
    """Collocation (t_f, x_f), initial (x_i at t=0) and boundary (t_b at x_b=+-1) points."""

    t_f: np.ndarray
    x_f: np.ndarray
    x_i: np.ndarray
    t_b: np.ndarray
    x_b: np.ndarray


def sample_points(rng: np.random.Generator, n_f: int, n_i: int, n_b: int) -> PointSet:
    """Uniform collocation in the domain, uniform x at t=0, half the boundary points per wall."""
    t_f = rng.uniform(0.0, 1.0, n_f)
    x_f = rng.uniform(-1.0, 1.0, n_f)
    x_i = rng.uniform(-1.0, 1.0, n_i)
    t_b = rng.uniform(0.0, 1.0, n_b)
    x_b = np.where(np.arange(n_b) % 2 == 0, -1.0, 1.0)
    return PointSet(t_f, x_f, x_i, t_b, x_b)


def initial_condition(x: np.ndarray) -> np.ndarray:
    return -np.sin(np.pi * x)


def regime_draw(nu: float) -> int:
    """The integer a regime's draws are seeded with: its viscosity's bits (12 significant
    digits, so a float's last-bit noise names the same regime)."""
    return int.from_bytes(struct.pack("<d", float(f"{float(nu):.12g}")), "little")


def training_points(cfg: PinnConfig, draw: int) -> PointSet:
    """Training points for one draw (``regime_draw(nu)`` in a run): every candidate of a
    regime trains on the same points, whatever its round, so its scores compare."""
    rng = np.random.default_rng([cfg.seed, draw, 0])
    return sample_points(rng, cfg.n_collocation, cfg.n_initial, cfg.n_boundary)


def validation_points(cfg: PinnConfig, nu: float, secret_key: int | None = None) -> PointSet:
    """The regime's held-out points, independent of the training draw: a function of the
    viscosity ``nu`` and ``secret_key`` only, never of the round or of the program.

    ``secret_key`` (derived from the run's secret by the trusted scorer) makes them unknowable
    to candidates, who can read this code and ``cfg.seed``.
    """
    rng = np.random.default_rng([cfg.seed, 1, regime_draw(nu)]
                                + ([] if secret_key is None else [secret_key]))
    return sample_points(rng, cfg.n_val_collocation, cfg.n_val_initial, cfg.n_val_boundary)


def init_params(cfg: PinnConfig, draw: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Glorot-normal weights, zero biases: 2 -> width x depth -> 1 (float32), one set per
    draw (a regime in a run, like ``training_points``)."""
    rng = np.random.default_rng([cfg.seed, draw, 2])
    sizes = [2] + [cfg.width] * cfg.depth + [1]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        std = math.sqrt(2.0 / (fan_in + fan_out))
        params.append((rng.normal(0.0, std, (fan_in, fan_out)).astype(np.float32),
                       np.zeros(fan_out, np.float32)))
    return params
