"""PyTorch eager PINN training with the same network, points and loss statistics.

Only for the benchmark (``python -m atlas.bench pinn``) and a cross-check test: it is the
"obvious" implementation (autograd with ``create_graph`` for u_t, u_x, u_xx, one eager
step at a time) that the compiled JAX evaluator is measured against. Candidate source
written with ``jnp`` runs here through ``TorchNumpy``, a shim with the handful of jnp
functions the benchmark strategies use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from atlas.tasks.pinn.problem import PinnConfig, PointSet, init_params, regime_draw


class TorchNumpy:
    """The subset of ``jax.numpy`` that benchmark candidates call, mapped onto torch."""

    pi = math.pi
    mean = staticmethod(torch.mean)
    sum = staticmethod(torch.sum)
    abs = staticmethod(torch.abs)
    sqrt = staticmethod(torch.sqrt)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    tanh = staticmethod(torch.tanh)
    square = staticmethod(torch.square)

    @staticmethod
    def asarray(x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32)

    @staticmethod
    def where(c: Any, a: Any, b: Any) -> torch.Tensor:
        as_t = TorchNumpy.asarray
        return torch.where(torch.as_tensor(c), as_t(a), as_t(b))

    @staticmethod
    def maximum(a: Any, b: Any) -> torch.Tensor:
        return torch.maximum(TorchNumpy.asarray(a), TorchNumpy.asarray(b))

    @staticmethod
    def minimum(a: Any, b: Any) -> torch.Tensor:
        return torch.minimum(TorchNumpy.asarray(a), TorchNumpy.asarray(b))

    @staticmethod
    def clip(a: Any, lo: Any = None, hi: Any = None) -> torch.Tensor:
        return torch.clamp(TorchNumpy.asarray(a), lo, hi)


def _mlp(params: list[tuple[torch.Tensor, torch.Tensor]], t: torch.Tensor,
         x: torch.Tensor) -> torch.Tensor:
    h = torch.stack([x, 2.0 * t - 1.0], dim=-1)
    for w, b in params[:-1]:
        h = torch.tanh(h @ w + b)
    w, b = params[-1]
    return (h @ w + b)[:, 0]


def torch_train(fn: Callable[..., Any], cfg: PinnConfig, points: PointSet, nu: float,
                draw: int | None = None) -> dict[str, float]:
    """Train with ``fn`` as the loss for ``cfg.n_steps`` Adam steps; return final train MSEs.
    ``draw``: the initial weights' draw (default: the regime's, as the evaluator uses)."""
    params = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True))
              for w, b in init_params(cfg, regime_draw(nu) if draw is None else draw)]
    flat = [p for pair in params for p in pair]
    opt = torch.optim.Adam(flat, lr=cfg.lr)
    f32 = torch.float32
    t_f = torch.tensor(points.t_f, dtype=f32, requires_grad=True)
    x_f = torch.tensor(points.x_f, dtype=f32, requires_grad=True)
    x_i = torch.tensor(points.x_i, dtype=f32)
    u_i = -torch.sin(math.pi * x_i)
    t_b = torch.tensor(points.t_b, dtype=f32)
    x_b = torch.tensor(points.x_b, dtype=f32)
    decay = cfg.stats_decay
    stats: dict[str, list[float]] = {}

    def residuals() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        u = _mlp(params, t_f, x_f)
        u_t, u_x = torch.autograd.grad(u.sum(), (t_f, x_f), create_graph=True)
        u_xx = torch.autograd.grad(u_x.sum(), x_f, create_graph=True)[0]
        return (u_t + u * u_x - nu * u_xx, _mlp(params, torch.zeros_like(x_i), x_i) - u_i,
                _mlp(params, t_b, x_b))

    for step in range(cfg.n_steps):
        res, ic, bc = residuals()
        extras: dict[str, Any] = {"step": step, "epoch": step, "n_steps": cfg.n_steps,
                                  "progress": step / cfg.n_steps, "viscosity": nu,
                                  "x": x_f.detach(), "t": t_f.detach()}
        for name, vec in (("pde", res), ("ic", ic), ("bc", bc)):
            m = float((vec.detach() ** 2).mean())
            ema, ema_sq, init, lo, hi = stats.get(name, [m, m * m, m, m, m])
            if name in stats:
                ema, ema_sq = decay * ema + (1 - decay) * m, decay * ema_sq + (1 - decay) * m * m
                lo, hi = min(lo, m), max(hi, m)
            stats[name] = [ema, ema_sq, init, lo, hi]
            extras.update({f"{name}_mse": m, f"{name}_ema": ema,
                           f"{name}_std": math.sqrt(max(ema_sq - ema * ema, 0.0)),
                           f"{name}_init": init, f"{name}_min": lo, f"{name}_max": hi})
        loss = fn(res, ic, bc, extras)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    final = [float((v.detach() ** 2).mean()) for v in residuals()]
    return {"train_pde": final[0], "train_ic": final[1], "train_bc": final[2],
            "loss": float(np.asarray(loss.detach()))}
