"""A program to the sandbox and back: what every path that scores a program shares.

The explorer's rounds, the seed, supporter patches, re-scores and the on-line inspector all
submit code with the task's context and file the outcome; a broken worker pool or a
completion without code becomes a failed ``Evaluation``, never an exception in the loop.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from atlas.types import Evaluation, FailureKind

NO_CODE_MESSAGE = "the completion held no extractable program"


class Sandbox(Protocol):
    def submit(self, code: str, context: dict[str, Any]) -> Future: ...


def regime_key(context: Mapping[str, Any]) -> str:
    """The equation a context scores on: the context without its round, as sorted JSON.

    Scores compare only within one regime: the PINN viscosity drifts between phases, so a
    loss at nu=0.1/pi and one at nu=0.01/pi measure different problems; the bandit's context
    is the round alone, so all its programs share the regime ``"{}"``.
    """
    return json.dumps({k: v for k, v in context.items() if k != "round"}, sort_keys=True)


def done(evaluation: Evaluation) -> Future:
    """A future that already holds ``evaluation``."""
    fut: Future = Future()
    fut.set_result(evaluation)
    return fut


def reused(evaluation: Evaluation) -> Evaluation:
    """A copy of an earlier program's evaluation for the same code on the same regime; its
    ``seconds`` is 0: no sandbox ran."""
    return dataclasses.replace(evaluation, metrics=dict(evaluation.metrics), seconds=0.0)


def outcome(fut: Future) -> Evaluation:
    """The evaluation ``fut`` holds; a sandbox error is the program's failure (``killed``)."""
    try:
        ev = fut.result()
    except Exception as exc:  # a broken worker pool must not kill the run
        return Evaluation.failure(FailureKind.KILLED, f"sandbox error: {exc!r}")
    if not isinstance(ev, Evaluation):
        return Evaluation.failure(FailureKind.KILLED, f"sandbox returned {type(ev).__name__}")
    return ev


def submit(sandbox: Sandbox, code: str | None, context: dict[str, Any]) -> Future:
    """``code`` on its way to the sandbox; None (nothing extracted) fails at once: ``no_code``."""
    if code is None:
        return done(Evaluation.failure(FailureKind.NO_CODE, NO_CODE_MESSAGE))
    return sandbox.submit(code, context)
