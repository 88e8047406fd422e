"""Scorer and runner of the linefit example task.

The scorer (trusted, never runs candidate code) draws the hidden lines from the run secret,
sends each line's noisy points, checks each answer and scores it. The runner (untrusted, one
process per candidate) calls the candidate's ``fit`` and sends back what it returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.link import Link
from atlas.sandbox.secret import derive_seed
from atlas.types import Evaluation, FailureKind


class LineFitScorer:
    """Trusted half: hidden lines in, one squared error per line out."""

    def __init__(self, config: dict[str, Any], secret: str | None = None) -> None:
        self.config = config
        self.secret = secret or "00"  # None outside the sandbox (tests): a fixed secret

    def public_config(self) -> dict[str, Any]:
        return {}  # the runner needs nothing: the points come in messages

    def score(self, code: str, context: dict[str, Any], link: Link) -> Evaluation:
        start = time.perf_counter()
        errors = []
        for k in range(int(self.config["problems"])):
            rng = np.random.default_rng(derive_seed(self.secret, "linefit", k))
            a, b = rng.normal(0, 2, 2)
            xs = rng.uniform(-1, 1, int(self.config["points"]))
            ys = a * xs + b + rng.normal(0, float(self.config["noise"]), xs.shape)
            link.send({"xs": xs.tolist(), "ys": ys.tolist()})
            answer = link.recv().get("ab")
            # every answer is untrusted: two finite numbers, or the runner was tampered with
            if (type(answer) is not list or len(answer) != 2
                    or not all(type(v) is float and math.isfinite(v) for v in answer)):
                raise CandidateError(FailureKind.TAMPERED, f"runner answered {answer!r:.60}")
            errors.append((answer[0] - a) ** 2 + (answer[1] - b) ** 2)
        link.send({"done": True})
        mse = float(np.mean(errors))
        return Evaluation(score=-mse, passed=True, metrics={"mse": mse},
                          seconds=time.perf_counter() - start)


def make_scorer(config: dict[str, Any], secret: str | None = None) -> LineFitScorer:
    return LineFitScorer(config, secret)


def make_runner(config: dict[str, Any]) -> Callable[[str, dict[str, Any], Link], None]:
    def run(code: str, context: dict[str, Any], link: Link) -> None:
        fit = load_candidate(code, "fit")
        while not (msg := link.recv()).get("done"):
            out = fit(np.array(msg["xs"]), np.array(msg["ys"]))
            try:
                a, b = (float(v) for v in out)
            except (TypeError, ValueError):
                raise CandidateError(FailureKind.WRONG_RETURN, f"fit returned {out!r:.60}; "
                                     f"return a tuple of two floats (a, b)") from None
            if not (math.isfinite(a) and math.isfinite(b)):
                raise CandidateError(FailureKind.NON_FINITE, f"fit returned ({a}, {b})")
            link.send({"ab": [a, b]})

    return run
