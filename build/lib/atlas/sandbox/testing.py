"""A toy bandit evaluator for the sandbox's own tests (no dependency on the real task).

Why: the sandbox must be testable before, and independently of, the real bandit task. It
runs ``policy(contexts, history, t, state) -> int`` for a few dozen steps on random
contexts and scores negative mean regret, classifying returns the way tasks must.
``evaluator_factory="atlas.sandbox.testing:make_toy_evaluator"``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.types import Evaluation, FailureKind


class ToyEvaluator:
    """Callable evaluator; ``fork_safe`` comes from the config so tests cover both modes."""

    def __init__(self, arms: int, dim: int, steps: int, seed: int, fork_safe: bool) -> None:
        self.arms, self.dim, self.steps, self.seed = arms, dim, steps, seed
        self.fork_safe = fork_safe

    def __call__(self, code: str, context: dict[str, Any]) -> Evaluation:
        start = time.perf_counter()
        policy = load_candidate(code, "policy")
        rng = np.random.default_rng(self.seed + int(context.get("round", 0)))
        theta = rng.normal(size=self.dim)
        history: list[tuple[int, np.ndarray, float]] = []
        state: dict[str, Any] = {}
        regrets = []
        for t in range(self.steps):
            contexts = rng.normal(size=(self.arms, self.dim))
            arm = policy(contexts.copy(), history, t, state)
            if isinstance(arm, (float, np.floating)) and not math.isfinite(arm):
                raise CandidateError(FailureKind.NON_FINITE, f"policy returned {arm} at t={t}")
            if isinstance(arm, (bool, np.bool_)) or not isinstance(arm, (int, np.integer)):
                raise CandidateError(FailureKind.WRONG_RETURN,
                                     f"policy returned {repr(arm)[:60]} at t={t}; it must "
                                     f"return an int arm in [0, {self.arms})")
            if not 0 <= arm < self.arms:
                raise CandidateError(FailureKind.WRONG_RETURN,
                                     f"policy returned arm {int(arm)} at t={t}; valid arms are "
                                     f"0..{self.arms - 1}")
            means = contexts @ theta
            regrets.append(float(means.max() - means[int(arm)]))
            history.append((int(arm), contexts[int(arm)], float(means[int(arm)])))
        score = -float(np.mean(regrets))
        if not math.isfinite(score):
            raise CandidateError(FailureKind.NON_FINITE, f"score is {score}")
        return Evaluation(score=score, passed=True, metrics={"mean_regret": -score},
                          seconds=time.perf_counter() - start)


def make_toy_evaluator(config: dict[str, Any]) -> ToyEvaluator:
    """Factory (called once per worker). Keys: arms, dim, steps, seed, fork_safe, jax."""
    if config.get("jax"):  # warm-up like the PINN task: JAX must work under the limits
        import jax.numpy as jnp

        if float(jnp.ones(3).sum()) != 3.0:
            raise RuntimeError("jax warm-up computed a wrong sum")
    return ToyEvaluator(int(config.get("arms", 5)), int(config.get("dim", 5)),
                        int(config.get("steps", 30)), int(config.get("seed", 0)),
                        bool(config.get("fork_safe", True)))
