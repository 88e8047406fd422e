"""Numerical check of the paper's dynamic-regret theory (Sec. 2.3, App. A).

The setting is the stylised one the theorem is about: a non-stationary preference-based
contextual bandit with K arms, linear utilities r_t(x, a) = <phi(x, a), theta_t>, theta_t on the
unit sphere drifting with total variation sum_t ||theta_{t+1} - theta_t|| <= B_T, and
Bradley-Terry feedback P(a1 > a2) = sigmoid(r_t(x, a1) - r_t(x, a2)) (Eq. 6-8). The learner
fits theta by sliding-window regularised logistic regression (Eq. 20-22) and acts with the
KL-regularised policy pi_t(a|x) ~ pi_ref,t(a|x) exp(r_hat_t(x, a) / beta) (Rafailov et al.).

The methods differ ONLY in the reference:

* ``fixed``: pi_ref,t = uniform for every t (DPO / EvoTune).
* ``evolving``: pi_ref,t = pi_{t-1}, the previous KL-regularised policy (EvoDPO, App. A.4).
  With linear utilities the recursion has a closed form,
  pi_t(a|x) ~ exp(<phi(x, a), sum_{s<=t} theta_hat_s> / beta), so it is exact for any context.
* ``evolving_floor`` (optional): pi_ref,t = (1 - K p_min) pi_{t-1} + p_min, which enforces the
  paper's Assumption 2 (reference support >= p_min) the way fixed-share does. It has no closed
  form, so the policy is tracked on every remaining context of the run (O(T^2) work).

The duel pair is drawn uniformly (two distinct arms), independently of the policy: the
covariance-diversity Assumption A.1 needs it (a concentrated policy duelling itself gives z = 0),
and it means every method sees the same data and the same estimates theta_hat_t under one seed.
Dynamic regret is measured in expectation over the policy's action at the revealed context,
against the instantaneous optimal policy (Eq. 13-14), and split into the reference-induced bias
V(pi*_t) - V(pi_beta,t) and the learning error V(pi_beta,t) - V(pi_t), where
pi_beta,t ~ pi_ref,t exp(r_t / beta) is the KL-regularised comparator with the TRUE utilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

METHODS: tuple[str, ...] = ("fixed", "evolving")
FLOOR_METHOD = "evolving_floor"


@dataclass(frozen=True)
class TheoryConfig:
    """Knobs of the simulated bandit and learner; defaults are the settings of
    docs/results.md's theory check and its plot."""

    n_arms: int = 5
    dim: int = 5
    beta: float = 0.1  # KL-regularisation strength of the policy
    window: int | None = 50  # sliding-window size w; None -> ceil(window_coef * (T/B_T)^(2/3))
    window_coef: float = 1.0
    budget: float = 1.0  # total-variation budget B_T (a constant, as in the paper)
    reg: float = 1.0  # ridge lambda of the logistic regression (Eq. 21)
    segments: int = 4  # theta_t follows this many great-circle arcs, each in a random direction
    newton_steps: int = 2  # warm-started Newton steps per round for the window fit
    floor: float | None = None  # p_min of the optional ``evolving_floor`` method

    def __post_init__(self) -> None:
        checks = [
            (self.n_arms >= 2, "n_arms", self.n_arms, "use at least 2 arms (--arms 5)"),
            (self.dim >= 1, "dim", self.dim, "use a feature dimension >= 1 (--dim 5)"),
            (self.beta > 0, "beta", self.beta, "use a positive KL strength (--beta 0.1)"),
            (self.window is None or self.window >= 1, "window", self.window,
             "use a window >= 1 or 'auto' (--window 100)"),
            (self.window_coef > 0, "window_coef", self.window_coef,
             "use a positive coefficient (--window-coef 1.0)"),
            (self.budget >= 0, "budget", self.budget,
             "use a non-negative total-variation budget B_T (--budget 1.0)"),
            (self.reg > 0, "reg", self.reg, "use a positive ridge lambda (--reg 1.0)"),
            (self.segments >= 1, "segments", self.segments, "use >= 1 drift arcs (--segments 4)"),
            (self.newton_steps >= 1, "newton_steps", self.newton_steps,
             "use >= 1 Newton step per round (--newton-steps 2)"),
            (self.floor is None or 0 < self.floor * self.n_arms < 1, "floor", self.floor,
             "use 0 < floor < 1/n_arms (--floor 1e-3)"),
        ]
        for ok, name, value, fix in checks:
            if not ok:
                raise ValueError(f"TheoryConfig.{name}={value!r} is invalid: {fix}")

    def window_for(self, horizon: int) -> int:
        """The window used at horizon T; 'auto' is the paper's tuning w ~ (T / B_T)^(2/3)."""
        if self.window is not None:
            return self.window
        return max(1, math.ceil(self.window_coef * (horizon / max(self.budget, 1e-12)) ** (2 / 3)))

    def methods(self) -> tuple[str, ...]:
        """Methods this configuration simulates, in display order."""
        return METHODS + ((FLOOR_METHOD,) if self.floor is not None else ())

    def to_dict(self) -> dict:
        """Plain dict for the JSON record."""
        return asdict(self)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def drift_path(rng: np.random.Generator, horizon: int, dim: int, budget: float,
               segments: int) -> np.ndarray:
    """theta_1..theta_T on the unit sphere: great-circle arcs of total length ``budget``.

    Each arc turns in a fresh random tangent direction, so the budget is spent on real movement
    (a per-step random direction would mostly cancel out). The chord sum, i.e. the total
    variation of Eq. 8, is (T - 1) * 2 sin(B_T / 2T) <= B_T.
    """
    step = budget / horizon
    theta = np.empty((horizon, dim))
    cur = _unit(rng.standard_normal(dim))
    bounds = np.linspace(0, horizon, segments + 1).round().astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi <= lo:
            continue
        u = rng.standard_normal(dim)
        u = u - (u @ cur) * cur
        norm = np.linalg.norm(u)
        u = u / norm if norm > 0 else np.zeros(dim)  # dim == 1: nowhere to rotate
        ang = step * np.arange(hi - lo + 1)
        arc = np.cos(ang)[:, None] * cur + np.sin(ang)[:, None] * u
        theta[lo:hi] = arc[:-1]
        cur = _unit(arc[-1])
    return theta


def total_variation(theta: np.ndarray) -> np.ndarray:
    """sum_t ||theta_{t+1} - theta_t|| along the time axis (second to last)."""
    return np.linalg.norm(np.diff(theta, axis=-2), axis=-1).sum(axis=-1)


def _environment(seed: int, horizon: int, cfg: TheoryConfig) -> dict[str, np.ndarray]:
    """One seed's exogenous world: drift, contexts, duel pairs and Bradley-Terry labels.

    Each component has its own stream, so one seed gives the same drift shape (in t / T) and the
    same leading contexts, duels and label noise at every horizon: common random numbers make
    the regret-vs-T slope far less noisy than independent worlds per horizon would.
    """
    g_drift, g_ctx, g_duel, g_label = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    theta = drift_path(g_drift, horizon, cfg.dim, cfg.budget, cfg.segments)
    x = _unit(g_ctx.standard_normal((horizon, cfg.n_arms, cfg.dim)))  # phi(x_t, a), unit norm
    u = g_duel.random((horizon, 2))  # one draw per round keeps the prefix property
    a1 = (u[:, 0] * cfg.n_arms).astype(int)
    a2 = (a1 + 1 + (u[:, 1] * (cfg.n_arms - 1)).astype(int)) % cfg.n_arms  # a2 != a1, uniform
    steps = np.arange(horizon)
    z = x[steps, a1] - x[steps, a2]
    y = (g_label.random(horizon) < _sigmoid(np.einsum("td,td->t", z, theta))).astype(float)
    return {"theta": theta, "x": x, "z": z, "y": y}


def window_estimates(z: np.ndarray, y: np.ndarray, window: int, reg: float,
                     newton_steps: int) -> np.ndarray:
    """theta_hat_t for t = 1..T from the duels of rounds [t - w, t) (Eq. 21), batched over seeds.

    z: (S, T, d) duel feature differences, y: (S, T) labels. Returns (S, T, d); theta_hat_1 = 0
    (no data yet). The objective moves by one datum per round, so a few Newton steps from the
    previous estimate track the exact minimiser (checked in the tests).
    """
    n_seeds, horizon, dim = z.shape
    out = np.zeros((n_seeds, horizon, dim))
    est = np.zeros((n_seeds, dim))
    eye = reg * np.eye(dim)
    for t in range(1, horizon):
        zw, yw = z[:, max(0, t - window):t], y[:, max(0, t - window):t]
        for _ in range(newton_steps):
            p = _sigmoid(np.einsum("snd,sd->sn", zw, est))
            grad = np.einsum("snd,sn->sd", zw, p - yw) + reg * est
            hess = np.einsum("snd,sn,sne->sde", zw, p * (1 - p), zw) + eye
            est = est - np.linalg.solve(hess, grad[..., None])[..., 0]
        out[:, t] = est
    return out


def _regret_parts(ref_logits: np.ndarray, r_hat: np.ndarray, r: np.ndarray,
                  beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(regret, reference bias, learning error) of pi ~ ref * exp(r_hat / beta) at one context."""
    best = r.max(axis=-1)
    v_pi = (_softmax(ref_logits + r_hat / beta) * r).sum(axis=-1)
    v_cmp = (_softmax(ref_logits + r / beta) * r).sum(axis=-1)
    return best - v_pi, best - v_cmp, v_cmp - v_pi


def simulate(horizon: int, seeds: Sequence[int], cfg: TheoryConfig) -> dict[str, dict]:
    """Run every method for one horizon; per-step regret and its split, shape (n_seeds, T).

    Returns {method: {"regret", "bias", "learning"}} plus "_env": {"tv": realised total
    variation per seed, "window": w}. All methods share each seed's world and estimates.
    """
    if horizon < 2:
        raise ValueError(f"horizon={horizon} is invalid: use horizons >= 2 (--horizons 250,500)")
    if len(seeds) == 0:
        raise ValueError("seeds is empty: pass at least one seed (--seeds 0-4)")
    envs = [_environment(int(s), horizon, cfg) for s in seeds]
    theta, x, z, y = (np.stack([e[k] for e in envs]) for k in ("theta", "x", "z", "y"))
    window = cfg.window_for(horizon)
    theta_hat = window_estimates(z, y, window, cfg.reg, cfg.newton_steps)
    r = np.einsum("stkd,std->stk", x, theta)  # true utilities at the revealed contexts
    r_hat = np.einsum("stkd,std->stk", x, theta_hat)
    n_seeds = len(seeds)
    uniform = np.zeros((n_seeds, horizon, cfg.n_arms))
    # evolving: pi_ref,t = pi_{t-1} ~ exp(<phi, sum_{s<t} theta_hat_s> / beta)
    past = np.cumsum(theta_hat, axis=1) - theta_hat
    evolving_ref = np.einsum("stkd,std->stk", x, past) / cfg.beta
    out: dict[str, dict] = {}
    for name, ref in (("fixed", uniform), ("evolving", evolving_ref)):
        reg_, bias, learn = _regret_parts(ref, r_hat, r, cfg.beta)
        out[name] = {"regret": reg_, "bias": bias, "learning": learn}
    if cfg.floor is not None:
        out[FLOOR_METHOD] = _simulate_floor(x, theta_hat, r, cfg)
    out["_env"] = {"tv": total_variation(theta), "window": window}
    return out


def _simulate_floor(x: np.ndarray, theta_hat: np.ndarray, r: np.ndarray,
                    cfg: TheoryConfig) -> dict[str, np.ndarray]:
    """Evolving reference mixed with p_min (Assumption 2), tracked on all future contexts."""
    n_seeds, horizon, k, _ = x.shape
    log_pi = np.full((n_seeds, horizon, k), -math.log(k))  # pi_0 = uniform on every context
    parts = {key: np.zeros((n_seeds, horizon)) for key in ("regret", "bias", "learning")}
    keep = 1.0 - k * cfg.floor
    for t in range(horizon):
        ref = np.log(keep * np.exp(log_pi[:, t:]) + cfg.floor)  # rows t.. are contexts to come
        r_hat = np.einsum("stkd,sd->stk", x[:, t:], theta_hat[:, t])
        logits = ref + r_hat / cfg.beta
        log_pi[:, t:] = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        now = _regret_parts(ref[:, 0], r_hat[:, 0], r[:, t], cfg.beta)
        for key, val in zip(("regret", "bias", "learning"), now):
            parts[key][:, t] = val
    return parts


def loglog_slope(horizons: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(T): ~1 linear, < 1 sub-linear."""
    h, v = np.asarray(horizons, float), np.asarray(values, float)
    if h.size < 2 or np.any(h <= 0) or np.any(v <= 0):
        raise ValueError("loglog_slope needs >= 2 horizons and positive regrets; "
                         "pass at least two horizons (--horizons 250,500)")
    return float(np.polyfit(np.log(h), np.log(v), 1)[0])


def sweep(horizons: Sequence[int], seeds: Sequence[int], cfg: TheoryConfig,
          curve_points: int = 200) -> dict:
    """Simulate every horizon; the JSON-ready record behind the table and the plot."""
    horizons = sorted({int(h) for h in horizons})
    methods = cfg.methods()
    rows = []
    curves: dict[str, list[float]] = {}
    for h in horizons:
        res = simulate(h, seeds, cfg)
        row = {"T": h, "window": res["_env"]["window"],
               "tv_max": float(res["_env"]["tv"].max())}
        for m in methods:
            tot = {k: res[m][k].sum(axis=1) for k in ("regret", "bias", "learning")}
            row[m] = {"per_seed": tot["regret"].tolist(), "mean": float(tot["regret"].mean()),
                      "std": float(tot["regret"].std()), "bias": float(tot["bias"].mean()),
                      "learning": float(tot["learning"].mean())}
        rows.append(row)
        if h == horizons[-1]:  # cumulative curve of the largest horizon, downsampled
            idx = np.unique(np.linspace(0, h - 1, min(curve_points, h)).round().astype(int))
            curves = {"t": (idx + 1).tolist()}
            for m in methods:
                curves[m] = np.cumsum(res[m]["regret"], axis=1).mean(axis=0)[idx].tolist()
    slopes, local = {}, {}
    for m in methods:
        means = [row[m]["mean"] for row in rows]
        slopes[m] = loglog_slope(horizons, means) if len(horizons) > 1 else float("nan")
        local[m] = [loglog_slope(horizons[i:i + 2], means[i:i + 2])
                    for i in range(len(horizons) - 1)]
    return {"config": cfg.to_dict(), "horizons": horizons, "seeds": [int(s) for s in seeds],
            "methods": list(methods), "rows": rows, "slopes": slopes, "local_slopes": local,
            "curve": curves}
