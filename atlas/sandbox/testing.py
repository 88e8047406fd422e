"""A toy bandit task for the sandbox's own tests (no dependency on the real task).

Why: the sandbox must be testable before, and independently of, the real bandit task. It
plays ``policy(contexts, history, t, state) -> int`` for a few dozen steps on random contexts
and scores negative mean regret, split like every task: the trusted scorer
(``TOY_SCORER``) draws the contexts and counts regret, the untrusted runner (``TOY_RUNNER``)
calls the policy and classifies its returns the way tasks must.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.link import Link
from atlas.types import Evaluation, FailureKind

TOY_SCORER = "atlas.sandbox.testing:make_toy_scorer"
TOY_RUNNER = "atlas.sandbox.testing:make_toy_runner"


def toy_steps(config: dict[str, Any], context: dict[str, Any]
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(contexts, means)`` of each step: the toy's draw for ``context`` (same every time)."""
    arms, dim = int(config.get("arms", 5)), int(config.get("dim", 5))
    rng = np.random.default_rng(int(config.get("seed", 0)) + int(context.get("round", 0)))
    theta = rng.normal(size=dim)
    for _ in range(int(config.get("steps", 30))):
        contexts = rng.normal(size=(arms, dim))
        yield contexts, contexts @ theta


def toy_score(regrets: list[float]) -> Evaluation:
    """Negative mean regret; NON_FINITE when it is not finite."""
    score = -float(np.mean(regrets))
    if not math.isfinite(score):
        raise CandidateError(FailureKind.NON_FINITE, f"score is {score}")
    return Evaluation(score=score, passed=True, metrics={"mean_regret": -score})


def check_toy_arm(arm: Any, arms: int, t: int) -> int:
    """The runner's classification of one returned arm (NON_FINITE, WRONG_RETURN)."""
    if isinstance(arm, (float, np.floating)) and not math.isfinite(arm):
        raise CandidateError(FailureKind.NON_FINITE, f"policy returned {arm} at t={t}")
    if isinstance(arm, (bool, np.bool_)) or not isinstance(arm, (int, np.integer)):
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"policy returned {repr(arm)[:60]} at t={t}; it must "
                             f"return an int arm in [0, {arms})")
    if not 0 <= arm < arms:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"policy returned arm {int(arm)} at t={t}; valid arms are "
                             f"0..{arms - 1}")
    return int(arm)


def toy_in_process(config: dict[str, Any], context: dict[str, Any], code: str) -> Evaluation:
    """Both halves in this process, for a test's own trusted program: the score the sandbox
    must reproduce."""
    policy = load_candidate(code, "policy")
    arms = int(config.get("arms", 5))
    history: list[tuple[int, np.ndarray, float]] = []
    state: dict[str, Any] = {}
    regrets = []
    for t, (contexts, means) in enumerate(toy_steps(config, context)):
        arm = check_toy_arm(policy(contexts.copy(), history, t, state), arms, t)
        regrets.append(float(means.max() - means[arm]))
        history.append((arm, contexts[arm], float(means[arm])))
    return toy_score(regrets)


class ToyScorer:
    """Trusted half: draws the contexts, sends them one step at a time, counts regret."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.arms = int(self.config.get("arms", 5))

    def public_config(self) -> dict[str, Any]:
        return {"arms": self.arms, "jax": bool(self.config.get("jax", False))}

    def score(self, code: str, context: dict[str, Any], link: Link) -> Evaluation:
        start = time.perf_counter()
        regrets: list[float] = []
        reward: float | None = None  # the last arm's noise-free mean, for the history
        for t, (contexts, means) in enumerate(toy_steps(self.config, context)):
            link.send({"t": t, "x": contexts.tolist(),
                       **({} if reward is None else {"r": reward})})
            arm = link.recv().get("a")
            if type(arm) is not int or not 0 <= arm < self.arms:  # the runner checked it
                raise CandidateError(FailureKind.TAMPERED, f"the policy's process answered "
                                     f"{repr(arm)[:60]} at t={t}, not an arm in "
                                     f"[0, {self.arms})")
            regrets.append(float(means.max() - means[arm]))
            reward = float(means[arm])
        link.send({"done": True})
        ev = toy_score(regrets)
        ev.seconds = time.perf_counter() - start
        return ev


def make_toy_scorer(config: dict[str, Any]) -> ToyScorer:
    """Factory of the trusted half (once per worker). Keys: arms, dim, steps, seed, jax."""
    return ToyScorer(config)


def make_toy_runner(config: dict[str, Any]) -> Callable[[str, dict[str, Any], Link], None]:
    """Factory of the untrusted half (once per candidate, before it arrives). ``jax``: warm
    up JAX here, as the PINN task does, since JAX must work under the candidate's limits."""
    if config.get("jax"):
        import jax.numpy as jnp

        if float(jnp.ones(3).sum()) != 3.0:
            raise RuntimeError("jax warm-up computed a wrong sum")
    arms = int(config["arms"])

    def run(code: str, context: dict[str, Any], link: Link) -> None:
        policy = load_candidate(code, "policy")
        history: list[tuple[int, np.ndarray, float]] = []
        state: dict[str, Any] = {}
        played: tuple[int, np.ndarray] | None = None
        while not (msg := link.recv()).get("done"):
            t = int(msg["t"])
            if played is not None:
                history.append((*played, float(msg["r"])))
            contexts = np.array(msg["x"], dtype=np.float64)
            arm = check_toy_arm(policy(contexts.copy(), history, t, state), arms, t)
            played = (arm, contexts[arm])
            link.send({"a": arm})

    return run
