"""Typed contracts of the three supporter roles: what the loop sends, what it gets back.

Every response model carries its provenance (``backend``, ``fallback_cause``, the raw answer)
so that a log line always says whether a rule or a model produced it. Bounds live here, in
one place, because they are part of the contract: the embedded rules respect them by
construction and every LLM answer is checked against them before it can reach the loop.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from atlas.knobs import HARD_BOUNDS, KNOBS
from atlas.tasks.base import PromptSpec
from atlas.types import GateDecision, Program

Backend = str  # "embedded" (the rules), "openai" or the import path of a chat backend
#: why a supporter answer was not used: no connection, no answer in time, an HTTP error
#: status (unknown model, server error), an unreadable body, numbers out of range, prose,
#: not asked because the role's circuit breaker is open (atlas/supporters/health.py)
FallbackCause = Literal["unreachable", "timeout", "http_error", "malformed", "out_of_range",
                        "prose", "breaker_open"]
FALLBACK_CAUSES: tuple[str, ...] = ("unreachable", "timeout", "http_error", "malformed",
                                    "out_of_range", "prose", "breaker_open")
#: the causes of an answer the server gave but that could not be used
INVALID_CAUSES: tuple[str, ...] = ("malformed", "out_of_range", "prose")

RAW_CHARS = 2000  # raw answer text kept in a response record


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Response(_Model):
    """Provenance every advice/verdict carries into the logs."""

    backend: Backend = "embedded"
    fallback_cause: FallbackCause | None = None
    raw: str = Field("", description="the model's answer text, truncated; empty for rules")
    output_mode: str | None = Field(None, description="how the model was asked for JSON "
                                    "(json_schema, json_object_schema, json_object, text); "
                                    "None when no model was asked")

    def to_record(self) -> dict:
        """JSON-ready dict for events.jsonl (non-finite floats already excluded by schema)."""
        return self.model_dump(mode="json")


# --------------------------------------------------------------------------- exploration

class ProgramView(_Model):
    """One program as the supporter sees it (a view of ``atlas.types.Program``)."""

    code: str
    score: float | None = Field(None, description="None (or -inf) for a failed program")
    passed: bool
    failure_kind: str = "ok"
    message: str = ""

    @field_validator("score")
    @classmethod
    def _finite_or_none(cls, v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    @classmethod
    def of(cls, program: Program) -> ProgramView:
        """The view of a stored ``atlas.types.Program``."""
        ev = program.evaluation
        return cls(code=program.code, score=ev.score, passed=ev.passed,
                   failure_kind=ev.failure_kind, message=ev.message[:500])


class ExplorationRequest(_Model):
    """An island's state: best/recent programs with scores, the task's prompt spec fields."""

    task_name: str
    island: int = Field(ge=0)
    round: int = Field(0, ge=0)
    system: str = ""
    problem: str = ""
    signature: str = ""
    entry_point: str
    hints: tuple[str, ...] = ()
    task_hints: tuple[str, ...] = ()  # Task.supporter_hints: switch on task-specific rules
    programs: list[ProgramView] = Field(default_factory=list)
    temperature: float = Field(gt=0.0, description="the island's current sampling temperature")
    temperature_bounds: tuple[float, float] = Field(
        description="explore.temperature_bounds: the range a suggested temperature must keep")

    @classmethod
    def build(cls, task_name: str, spec: PromptSpec, island: int, programs: list[Program],
              temperature: float, temperature_bounds: tuple[float, float], round: int = 0,
              task_hints: tuple[str, ...] = ()) -> ExplorationRequest:
        """A request from what the loop holds: the task's PromptSpec and stored Programs."""
        return cls(task_name=task_name, island=island, round=round, system=spec.system,
                   problem=spec.problem, signature=spec.signature,
                   entry_point=spec.entry_point, hints=tuple(spec.hints),
                   programs=[ProgramView.of(p) for p in programs], temperature=temperature,
                   temperature_bounds=temperature_bounds, task_hints=tuple(sorted(task_hints)))


class ExplorationAdvice(_Response):
    """A critique for the island's next prompt, full-program patches, a temperature."""

    critique: str = ""
    patches: list[str] = Field(default_factory=list, description="full program sources")
    temperature: float | None = Field(
        None, gt=0.0, description="suggested island temperature, inside the request's "
        "temperature_bounds; None = keep the current one")
    patches_dropped: int = Field(0, ge=0, description="LLM patches that did not parse")


# --------------------------------------------------------------------------- strategist

class Knobs(_Model):
    """The DPO hyper-parameters the strategist may change for the next phase."""

    beta: float = Field(gt=0.0)
    lr: float = Field(gt=0.0)
    epochs: int = Field(ge=1)
    score_threshold: float | None = None


#: the knobs in declaration order (how advice lists and explains its changes)
KNOB_FIELDS: tuple[str, ...] = tuple(Knobs.model_fields)


class KnobBounds(_Model):
    """Limits for beta / lr / epochs; they are intersected with ``HARD_BOUNDS``."""

    beta: tuple[float, float] = HARD_BOUNDS["beta"]
    lr: tuple[float, float] = HARD_BOUNDS["lr"]
    epochs: tuple[int, int] = HARD_BOUNDS["epochs"]

    @model_validator(mode="after")
    def _within_hard_bounds(self) -> KnobBounds:
        for name in HARD_BOUNDS:
            lo, hi = getattr(self, name)
            hlo, hhi = HARD_BOUNDS[name]
            if not (hlo <= lo <= hi <= hhi):
                raise ValueError(f"bounds.{name}={[lo, hi]} must satisfy {hlo} <= low <= high "
                                 f"<= {hhi}; fix dpo.bounds.{name} in the config")
        return self


assert set(KNOB_FIELDS) == set(KNOBS) and set(KnobBounds.model_fields) == set(HARD_BOUNDS), \
    "atlas.knobs and the Knobs / KnobBounds schemas must name the same knobs"


class ScoreStats(_Model):
    """Score distribution of the phase's programs (passed programs only for best/median/min)."""

    best: float | None = None
    median: float | None = None
    min: float | None = None
    valid_rate: float = Field(0.0, ge=0.0, le=1.0)
    n: int = Field(0, ge=0)
    n_passed: int | None = Field(None, ge=0, description="passed programs (None: valid_rate*n)")

    @property
    def passed(self) -> int:
        """Passed programs of the phase (given, or estimated from ``valid_rate * n``)."""
        return self.n_passed if self.n_passed is not None else round(self.valid_rate * self.n)


class DpoMetrics(_Model):
    loss: float | None = None
    accuracy: float | None = Field(None, ge=0.0, le=1.0)
    margin: float | None = None


class StrategistRequest(_Model):
    """Phase telemetry the strategist reads."""

    phase: int = Field(ge=0)
    knobs: Knobs
    bounds: KnobBounds = Field(default_factory=KnobBounds)
    pairs_built: int | None = Field(None, ge=0, description="pairs of the last trained phase; "
                                    "None before the first one")
    scores: ScoreStats = Field(default_factory=ScoreStats)
    diversity: float = Field(1.0, ge=0.0, le=1.0,
                             description="distinct normalised / total of the agent's programs")
    gate_decisions: list[GateDecision] = Field(
        default_factory=list, description="recent first; the gate's own records "
        "(atlas.types.GateDecision), numbers it did not measure are NaN")
    dpo: DpoMetrics = Field(default_factory=DpoMetrics)
    gate_epsilon: float = 0.0
    gate_delta: float | None = Field(None, description="KL trust region, to read rejections")


class StrategistAdvice(_Response):
    """The knobs for the next phase (always within bounds) and which of them changed."""

    knobs: Knobs
    changed: list[str] = Field(default_factory=list)
    rationale: str = ""
    reasons: dict[str, str] = Field(default_factory=dict,
                                    description="changed knob -> why it changed")

    # flat access for callers that copy the knobs into their own config
    @property
    def beta(self) -> float:
        return self.knobs.beta

    @property
    def lr(self) -> float:
        return self.knobs.lr

    @property
    def epochs(self) -> int:
        return self.knobs.epochs

    @property
    def score_threshold(self) -> float | None:
        return self.knobs.score_threshold


# --------------------------------------------------------------------------- inspector

class GateNumbers(_Model):
    gain: float
    kl: float
    epsilon: float
    delta: float
    accepted: bool
    reason: str = ""


class QualityMetricView(_Model):
    """A quality metric the task declares (``atlas.tasks.base.QualityMetric``): only these
    are compared, in this direction."""

    name: str
    direction: Literal["min", "max"] = Field(description="max: higher is better; min: lower")
    description: str = ""


class InspectorRequest(_Model):
    """An (accepted) promotion to review, with per-metric means of both policies' programs.

    ``quality_metrics`` is the task's declaration (name, direction); ``candidate_metrics`` /
    ``reference_metrics`` are means over the programs each policy prefers on the gate subset,
    restricted to declared metrics by ``atlas.supporters.requests.inspector_request``.
    Undeclared metrics (timings, flags, a candidate's own loss) are never compared.
    """

    phase: int = Field(ge=0)
    gate: GateNumbers
    candidate_metrics: dict[str, float] = Field(default_factory=dict)
    reference_metrics: dict[str, float] = Field(default_factory=dict)
    quality_metrics: list[QualityMetricView] = Field(default_factory=list)

    @property
    def directions(self) -> dict[str, str]:
        """Declared metrics as ``{name: "max" | "min"}``."""
        return {m.name: m.direction for m in self.quality_metrics}


class InspectorVerdict(_Response):
    """``accepted`` is the final decision: the gate's, unless vetoed (never forced)."""

    accepted: bool
    veto: bool = False
    reason: str = ""
    regressions: dict[str, list[float | None]] = Field(
        default_factory=dict, description="component -> [candidate, reference]")

    @model_validator(mode="after")
    def _veto_never_forces(self) -> InspectorVerdict:
        if self.veto and self.accepted:
            raise ValueError("a vetoed promotion cannot be accepted")
        return self


# --------------------------------------------------------------------------- answer schemas

def _nullable(kind: str) -> dict:
    return {"anyOf": [{"type": kind}, {"type": "null"}]}


def _object(props: dict[str, dict]) -> dict:
    # OpenAI's strict form: every property required, no others (bounds are checked after)
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


#: the JSON each role's model must answer with, sent as a structured-output schema; the
#: answer parsers (atlas/supporters/answers.py) still validate types and bounds
ANSWER_SCHEMAS: dict[str, dict] = {
    "exploration": _object({"critique": {"type": "string"},
                            "patches": {"type": "array", "items": {"type": "string"}},
                            "temperature": _nullable("number")}),
    "strategist": _object({"beta": {"type": "number"}, "lr": {"type": "number"},
                           "epochs": {"type": "integer"},
                           "score_threshold": _nullable("number"),
                           "rationale": {"type": "string"}}),
    "inspector": _object({"veto": {"type": "boolean"}, "reason": {"type": "string"}}),
}

