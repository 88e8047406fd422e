"""Records that cross module boundaries: a candidate's evaluation and a stored program.

They are plain dataclasses so that they pickle across worker processes and serialise
to one JSON line each (``programs.jsonl``) without custom encoders.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class FailureKind(str, Enum):
    """Why a candidate program did not produce a usable score (``ok`` when it did)."""

    OK = "ok"
    SYNTAX_ERROR = "syntax_error"
    MISSING_ENTRY_POINT = "missing_entry_point"
    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    KILLED = "killed"  # killed by a signal or out of memory
    WRONG_RETURN = "wrong_return"  # wrong type or out of range
    NON_FINITE = "non_finite"
    NO_CODE = "no_code"  # the completion held no extractable program
    TAMPERED = "tampered"  # a result no genuine program can produce (outside score_range, forged)


@dataclass
class Evaluation:
    """The outcome of running one candidate in the sandbox.

    ``score`` is always "higher is better" (bandit: negative mean regret; PINN: negative
    validation loss). A failed candidate has ``passed=False`` and ``score=-inf``.
    """

    score: float
    passed: bool
    failure_kind: str = FailureKind.OK.value
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def failure(cls, kind: FailureKind | str, message: str = "", seconds: float = 0.0,
                metrics: dict[str, float] | None = None) -> "Evaluation":
        kind = kind.value if isinstance(kind, FailureKind) else str(kind)
        return cls(score=-math.inf, passed=False, failure_kind=kind, message=message[:2000],
                   metrics=dict(metrics or {}), seconds=seconds)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["score"] = None if not math.isfinite(self.score) else self.score
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evaluation":
        score = d.get("score")
        return cls(score=-math.inf if score is None else float(score), passed=bool(d["passed"]),
                   failure_kind=d.get("failure_kind", FailureKind.OK.value),
                   message=d.get("message", ""), metrics=dict(d.get("metrics") or {}),
                   seconds=float(d.get("seconds", 0.0)))


@dataclass
class Program:
    """A candidate program as the program database stores it.

    ``prompt`` and ``completion`` are kept verbatim because preference pairs are built
    from them (the DPO loss is over the agent's own completion tokens).
    """

    id: int
    island: int
    round: int
    code: str
    evaluation: Evaluation
    prompt: str = ""
    completion: str = ""
    parents: list[int] = field(default_factory=list)
    cluster: str = ""
    source: str = "agent"  # agent | seed | supporter | rescore (an incumbent re-scored, parents=[original])
    phase: int = 0
    #: the equation it was scored on (the task context without the round, as JSON): scores
    #: compare only within one regime (the PINN viscosity drifts between phases)
    regime: str = ""

    @property
    def score(self) -> float:
        return self.evaluation.score

    @property
    def passed(self) -> bool:
        return self.evaluation.passed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evaluation"] = self.evaluation.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Program":
        d = dict(d)
        d["evaluation"] = Evaluation.from_dict(d["evaluation"])
        return cls(**d)


@dataclass
class PreferencePair:
    """One element of D_k: a prompt with a preferred and a less-preferred completion."""

    prompt: str
    chosen: str
    rejected: str
    chosen_score: float
    rejected_score: float
    island: int = 0
    kind: str = "passed_vs_passed"  # passed_vs_passed | passed_vs_failed
    chosen_id: int = -1
    rejected_id: int = -1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("chosen_score", "rejected_score"):
            d[key] = None if not math.isfinite(d[key]) else d[key]
        return d


@dataclass
class GateItem:
    """One element of the gate subset G_k (paper 2.2): a prompt, its evaluated completions
    and their task scores, and the preferred completion the KL estimator teacher-forces."""

    prompt: str
    completions: list[str]
    scores: list[float]  # task scores; failed completions carry a finite floor score
    preferred: str
