"""The PINN network, its derivatives and the optimiser step, compiled once per worker.

Why this shape: every candidate's loss is different code, so jitting a whole 500-step
training per candidate recompiles everything each time (~3 s on 2 cores). Here the
compiled functions never see the candidate: ``forward`` returns the three residual
vectors (PDE at collocation points, initial error, boundary error) plus the running loss
statistics; the candidate maps those to a scalar and ``jax.grad`` of the candidate w.r.t.
the three vectors gives cotangents; ``step`` pulls them back through the network (VJP),
applies Adam and already computes the next step's residuals, so one compiled call plus
the candidate's own tiny function is all a training step costs.

Derivatives u_t, u_x, u_xx are propagated forward through the tanh MLP in closed form
(a second-order Taylor pass stacked into one matmul per layer) instead of nesting
``jax.grad``: the same numbers for a fraction of the work.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from atlas.tasks.pinn.problem import PinnConfig, PointSet

Params = list[tuple[jax.Array, jax.Array]]
COMPONENTS = ("pde", "ic", "bc")
#: per component: current MSE, EMA, EMA of squares, initial, min, max
STAT_FIELDS = ("mse", "ema", "ema_sq", "init", "min", "max")


class Points(NamedTuple):
    """Device copy of a ``PointSet`` plus the initial-condition targets."""

    t_f: jax.Array
    x_f: jax.Array
    x_i: jax.Array
    u_i: jax.Array
    t_b: jax.Array
    x_b: jax.Array


def to_device(points: PointSet) -> Points:
    f32 = np.float32
    return Points(jnp.asarray(points.t_f, f32), jnp.asarray(points.x_f, f32),
                  jnp.asarray(points.x_i, f32),
                  jnp.asarray(-np.sin(np.pi * points.x_i), f32),
                  jnp.asarray(points.t_b, f32), jnp.asarray(points.x_b, f32))


def mlp(params: Params, t: jax.Array, x: jax.Array) -> jax.Array:
    """u(t, x); t is mapped to [-1, 1] like x so both inputs have the same scale."""
    h = jnp.stack([x, 2.0 * t - 1.0], axis=-1)
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    return (h @ w + b)[:, 0]


def mlp_derivatives(params: Params, t: jax.Array, x: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(u, u_t, u_x, u_xx) by forward propagation of first and second derivatives."""
    n = x.shape[0]
    h = jnp.stack([x, 2.0 * t - 1.0], axis=-1)
    hx = jnp.broadcast_to(jnp.array([1.0, 0.0], h.dtype), (n, 2))
    ht = jnp.broadcast_to(jnp.array([0.0, 2.0], h.dtype), (n, 2))
    hxx = jnp.zeros_like(h)
    for w, b in params[:-1]:
        z, zx, zt, zxx = jnp.split(jnp.concatenate([h, hx, ht, hxx]) @ w, 4)
        a = jnp.tanh(z + b)
        d1 = 1.0 - a * a
        h, hx, ht, hxx = a, d1 * zx, d1 * zt, -2.0 * a * d1 * zx * zx + d1 * zxx
    w, b = params[-1]
    u, ux, ut, uxx = jnp.split((jnp.concatenate([h, hx, ht, hxx]) @ w)[:, 0], 4)
    return u + b[0], ut, ux, uxx


#: collocation points go through the Taylor pass in this many independent slices, which
#: XLA's CPU runtime executes concurrently: on 2 cores a candidate trains ~25% faster with 2
#: slices than with 1 (same time on 1 core); 4 or 8 slices were slower (per-op overhead)
COLLOCATION_CHUNKS = 2


def residuals(params: Params, pts: Points, nu: jax.Array
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PDE residual at collocation points, initial error, boundary error (vectors)."""
    n = pts.t_f.shape[0]
    bounds = np.linspace(0, n, min(COLLOCATION_CHUNKS, n) + 1).astype(int)
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        u, ut, ux, uxx = mlp_derivatives(params, pts.t_f[lo:hi], pts.x_f[lo:hi])
        parts.append(ut + u * ux - nu * uxx)
    res = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    ic = mlp(params, jnp.zeros_like(pts.x_i), pts.x_i) - pts.u_i
    bc = mlp(params, pts.t_b, pts.x_b)
    return res, ic, bc


def init_stats() -> jax.Array:
    return jnp.zeros((len(COMPONENTS), len(STAT_FIELDS)), jnp.float32)


def update_stats(stats: jax.Array, mses: jax.Array, step: jax.Array, decay: float
                 ) -> jax.Array:
    """Running statistics of each component's MSE, seeded with the first value at step 0."""
    first = step == 0
    ema = jnp.where(first, mses, decay * stats[:, 1] + (1 - decay) * mses)
    ema_sq = jnp.where(first, mses ** 2, decay * stats[:, 2] + (1 - decay) * mses ** 2)
    init = jnp.where(first, mses, stats[:, 3])
    lo = jnp.where(first, mses, jnp.minimum(stats[:, 4], mses))
    hi = jnp.where(first, mses, jnp.maximum(stats[:, 5], mses))
    return jnp.stack([mses, ema, ema_sq, init, lo, hi], axis=1)


def extras_from(stats: jax.Array, step: jax.Array, n_steps: jax.Array | int, nu: jax.Array,
                pts: Points) -> dict[str, Any]:
    """The ``extras`` dict a candidate sees (documented in the prompt and docs/tasks.md)."""
    out: dict[str, Any] = {"step": step, "epoch": step, "n_steps": jnp.asarray(n_steps, jnp.int32),
                           "progress": step / n_steps, "viscosity": nu,
                           "x": pts.x_f, "t": pts.t_f}
    for k, c in enumerate(COMPONENTS):
        mse, ema, ema_sq, init, lo, hi = (stats[k, j] for j in range(len(STAT_FIELDS)))
        out.update({f"{c}_mse": mse, f"{c}_ema": ema,
                    f"{c}_std": jnp.sqrt(jnp.maximum(ema_sq - ema * ema, 0.0)),
                    f"{c}_init": init, f"{c}_min": lo, f"{c}_max": hi})
    return out


def get_trainer(cfg: PinnConfig) -> Trainer:
    """One ``Trainer`` per compile-relevant configuration in this process: evaluators that
    differ only in scoring or schedule share the compiled functions."""
    key = (cfg.depth, cfg.width, cfg.lr, cfg.stats_decay, cfg.n_collocation,
           cfg.n_initial, cfg.n_boundary, cfg.n_val_collocation, cfg.n_val_initial,
           cfg.n_val_boundary, cfg.exact_nx, cfg.exact_nt)
    if key not in _TRAINERS:
        _TRAINERS[key] = Trainer(cfg)
    return _TRAINERS[key]


_TRAINERS: dict[tuple, Trainer] = {}


class Trainer:
    """Holds the jitted functions of one worker; shapes are fixed by the config."""

    def __init__(self, cfg: PinnConfig) -> None:
        self.cfg = cfg
        self.warm = False
        self.opt = optax.adam(cfg.lr)
        decay = float(cfg.stats_decay)

        def observe(params: Params, pts: Points, nu: jax.Array, stats: jax.Array,
                    step: jax.Array, n_steps: jax.Array
                    ) -> tuple[tuple[jax.Array, ...], dict, jax.Array]:
            vecs = residuals(params, pts, nu)
            mses = jnp.stack([jnp.mean(v * v) for v in vecs])
            stats = update_stats(stats, mses, step, decay)
            return vecs, extras_from(stats, step, n_steps, nu, pts), stats

        def step_fn(params: Params, opt_state: Any, pts: Points, nu: jax.Array,
                    cots: tuple[jax.Array, ...], loss: jax.Array, bad: jax.Array,
                    stats: jax.Array, step: jax.Array, n_steps: jax.Array) -> tuple:
            # re-running the forward inside the VJP is cheaper than shipping the saved
            # activations (~7 MB at 1024 points) between two compiled calls (measured)
            _, pull = jax.vjp(lambda p: residuals(p, pts, nu), params)
            (grads,) = pull(tuple(cots))
            finite = jnp.isfinite(loss) & jnp.all(jnp.stack(
                [jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]))
            bad = jnp.where((bad < 0) & ~finite, step, bad)
            updates, opt_state = self.opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            # the step counter stays on device: no host-to-device transfer per step
            return (params, opt_state, bad, step + 1) + observe(params, pts, nu, stats,
                                                                 step + 1, n_steps)

        self.observe = jax.jit(observe)
        self.step = jax.jit(step_fn)
        self.predict = jax.jit(mlp)
        self.init_opt = jax.jit(self.opt.init)
        self.extras = jax.jit(extras_from)
