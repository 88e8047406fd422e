"""PINN task (paper 3.1, B.2.2): the agent writes the loss that trains a Burgers' PINN.

Host half only: prompt, seed program, the round's viscosity. In the sandbox, the candidate's
code runs in ``atlas.tasks.pinn.split:make_runner``, which only exports its loss (StableHLO),
and training and scoring with that export in ``make_scorer``; importing this module does
not import JAX.
"""

from __future__ import annotations

from typing import Any

from atlas.tasks.base import PromptSpec, QualityMetric, Task
from atlas.tasks.pinn.problem import PinnConfig, viscosity

SEED_PROGRAM = '''import jax.numpy as jnp


def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    """Mean squared error of each term, initial and boundary terms weighted up."""
    pde = jnp.mean(residuals ** 2)
    ic = jnp.mean(ic_err ** 2)
    bc = jnp.mean(bc_err ** 2)
    w_ic = 10.0
    w_bc = 10.0
    return pde + w_ic * ic + w_bc * bc
'''

PROBLEM = """Write the loss function that trains a physics-informed neural network (PINN) for the
1D viscous Burgers' equation u_t + u*u_x = nu*u_xx on x in [-1,1], t in [0,1], with
u(0,x) = -sin(pi*x) and u(t,-1) = u(t,1) = 0. The network is trained with Adam for
{n_steps} steps on your loss; the viscosity nu gets smaller over rounds, which makes a
steep front (a shock) at x = 0.

Arguments (jax arrays; use jax.numpy as jnp, not numpy, not torch):
- residuals: PDE residual at each collocation point, shape (N,)
- ic_err: u(0,x) - (-sin(pi*x)) at initial points, shape (M,)
- bc_err: u(t,+-1) at boundary points, shape (K,)
- extras: dict with 'step' (0..n_steps-1, alias 'epoch'), 'n_steps', 'progress'
  (step/n_steps), 'viscosity', 'x' and 't' (collocation coordinates, shape (N,)), and for
  each term c in pde, ic, bc: c_mse (now), c_ema (running mean), c_std (running std),
  c_init (at step 0), c_min, c_max. Those statistics are plain numbers (no gradient).
Return one scalar: the loss. Lower final error on fresh points is better."""

HINTS = (
    "Normalise each term by its running mean, e.g. jnp.mean(ic_err**2) / (extras['ic_ema'] + 1e-8).",
    "Weight the initial and boundary terms more early in training, using extras['progress'].",
    "Down-weight large residuals near the shock (x close to 0), e.g. with a Huber loss.",
    "Use jnp.where instead of Python if on array values; add 1e-8 before dividing.",
)


class PinnTask(Task):
    """Agent-designed PINN loss for Burgers' equation under drifting viscosity."""

    name = "pinn"
    evaluator_factory = "atlas.tasks.pinn.split:make_scorer"  # trusted: training, validation
    runner_factory = "atlas.tasks.pinn.split:make_runner"  # untrusted: exports the loss
    # train_* (the candidate's own training terms), own_val_loss (the candidate's own loss),
    # candidate_jit and timings are not quality: never compared
    quality_metrics = (
        QualityMetric("val_pde", "min", "mean squared PDE residual on held-out points"),
        QualityMetric("val_ic", "min", "initial-condition error on held-out points"),
        QualityMetric("val_bc", "min", "boundary error on held-out points"),
        QualityMetric("val_loss", "min", "val_pde + val_ic + val_bc"),
        QualityMetric("rel_l2", "min", "relative L2 error against the Cole-Hopf solution"),
    )
    score_range = (-float("inf"), 0.0)  # every score mode is minus a non-negative loss
    fork_safe = False  # XLA holds threads: a forked child can deadlock
    score_label = "-validation loss"
    supporter_hints = frozenset({"robust_loss"})  # embedded supporter: Huber rewrite (B.3.2)

    def __init__(self, **config: Any) -> None:
        self.settings = PinnConfig.from_dict(config)  # validates every field by name
        super().__init__(**self.settings.to_dict())  # sets timeout_s, as for every task
        self.score_label = {"composite": "-validation loss", "rel_l2": "-relative L2",
                            "paper": "-own validation loss"}.get(self.settings.score,
                                                                 "score")

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(
            system="You are a research agent in PDE-constrained optimization. "
                   "You write short, correct Python functions with jax.numpy.",
            problem=PROBLEM.format(n_steps=self.settings.n_steps),
            signature="def pinn_loss_strategy(residuals, ic_err, bc_err, extras):",
            entry_point="pinn_loss_strategy",
            hints=HINTS,
        )

    def seed_program(self) -> str:
        return SEED_PROGRAM

    def context(self, round_index: int) -> dict[str, Any]:
        """The round and its viscosity (plain JSON); the evaluator trains at that nu."""
        return {"round": int(round_index), "viscosity": viscosity(int(round_index),
                                                                   self.settings)}


__all__ = ["PinnTask", "SEED_PROGRAM"]
