"""Records that cross module boundaries: a candidate's evaluation and a stored program, the
reference mode, C_k's candidates and the gate's decision.

They are plain dataclasses so that they pickle across worker processes and serialise
to one JSON line each (``programs.jsonl``) without custom encoders.
"""

from __future__ import annotations

import ast
import math
import warnings
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Label(str, Enum):
    """A str-valued enum that prints, formats, hashes and serialises as its value, so JSON
    output, dict keys and comparisons with the plain spelling are unchanged."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:
        return str.__hash__(self)


class ReferenceMode(Label):
    """``method.reference``: what DPO is anchored at and what the gate compares against.

    FIXED: the base model with adapters disabled (EvoTune), never promoted. ADAPTIVE: the
    ``ref`` LoRA adapter, moved forward by promotions (EvoDPO, ATLAS). The values are the
    YAML spellings, so run folders written before the enum existed still resume; a member
    compares equal to its string and prints as it.
    """

    FIXED = "fixed"
    ADAPTIVE = "adaptive"

    @classmethod
    def parse(cls, value: Any, field: str = "method.reference") -> "ReferenceMode":
        """The member for ``value``, or a ValueError naming ``field`` and the choices."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{field}={value!r} is not one of {[m.value for m in cls]}; "
                             f"override it, e.g. `{field}={cls.FIXED.value}`") from None


class FailureKind(Label):
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
    BLOCKED = "blocked"  # made a system call the sandbox does not allow (named in the message)
    # the task's own scorer raised: a bug in the task, not in the candidate. A scorer blames
    # the candidate only by raising CandidateError, RunnerFailed or ProtocolError; anything
    # else it raises is this kind, and a run stops when the seed program hits it
    TASK_ERROR = "task_error"


class ProgramSource(Label):
    """Who wrote a stored program."""

    AGENT = "agent"
    SEED = "seed"  # the task's seed program, one copy per island
    SUPPORTER = "supporter"  # an exploration supporter's patch
    RESCORE = "rescore"  # an incumbent re-scored on a new equation (parents=[original])


class PairKind(Label):
    """What a preference pair contrasts (D_k draws from each kind in turn)."""

    PASSED_VS_PASSED = "passed_vs_passed"
    PASSED_VS_FAILED = "passed_vs_failed"
    SUPPORTER_VS_AGENT = "supporter_vs_agent"  # a supporter's patch chosen over the agent's
    NEW_VS_COPY = "new_vs_copy"  # a new valid program chosen over a copy (dpo.lazy_pairs)


@dataclass
class Evaluation:
    """The outcome of running one candidate in the sandbox.

    ``score`` is always "higher is better" (bandit: negative mean regret; PINN: negative
    validation loss). A failed candidate has ``passed=False`` and ``score=-inf``.
    ``behaviour``: the fingerprint of the program's play on its task's public input
    (``atlas.sandbox.behaviour``), which ``atlas.novelty`` compares instead of the score;
    None where the task has none (PINN) or the program failed.
    """

    score: float
    passed: bool
    failure_kind: FailureKind = FailureKind.OK
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    behaviour: str | None = None

    def __post_init__(self) -> None:
        self.failure_kind = FailureKind(self.failure_kind)

    @classmethod
    def failure(cls, kind: FailureKind | str, message: str = "", seconds: float = 0.0,
                metrics: dict[str, float] | None = None) -> "Evaluation":
        return cls(score=-math.inf, passed=False, failure_kind=FailureKind(kind),
                   message=message[:2000],
                   metrics=dict(metrics or {}), seconds=seconds)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["score"] = None if not math.isfinite(self.score) else self.score
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evaluation":
        score = d.get("score")
        return cls(score=-math.inf if score is None else float(score), passed=bool(d["passed"]),
                   failure_kind=FailureKind(d.get("failure_kind", FailureKind.OK)),
                   message=d.get("message", ""), metrics=dict(d.get("metrics") or {}),
                   seconds=float(d.get("seconds", 0.0)),
                   behaviour=d.get("behaviour") if isinstance(d.get("behaviour"), str) else None)


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
    source: ProgramSource = ProgramSource.AGENT
    phase: int = 0
    #: the equation it was scored on (the task context without the round, as JSON): scores
    #: compare only within one regime (the PINN viscosity drifts between phases)
    regime: str = ""
    #: ``atlas.novelty``'s label when it was filed (copy, same_behaviour, constants_only, new;
    #: "" for the seed, re-scores and records written before labels existed)
    novelty: str = ""
    #: passed above the best parent of its prompt on the same equation (None: no such parent)
    beats_parents: bool | None = None

    def __post_init__(self) -> None:
        self.source = ProgramSource(self.source)

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
    kind: PairKind = PairKind.PASSED_VS_PASSED
    chosen_id: int = -1
    rejected_id: int = -1

    def __post_init__(self) -> None:
        self.kind = PairKind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("chosen_score", "rejected_score"):
            d[key] = None if not math.isfinite(d[key]) else d[key]
        return d


#: a phase whose G_k is below gate.min_completions: no decision is made (not a rejection)
INSUFFICIENT_EVIDENCE = "insufficient evidence"


@dataclass
class GateItem:
    """One element of the gate subset G_k (paper 2.2): a prompt, its evaluated completions
    and their task scores, and the preferred completion the KL estimator teacher-forces."""

    prompt: str
    completions: list[str]
    scores: list[float]  # task scores; failed completions carry a finite floor score
    preferred: str
    ids: list[int] = field(default_factory=list)  # the completions' program ids, when known

    @property
    def informative(self) -> bool:
        """Whether its completions' scores differ (otherwise every policy scores it alike)."""
        return len({round(float(s), 12) for s in self.scores}) >= 2


@dataclass
class PolicyCandidate:
    """An element of C_k: a named copy of the policy adapter's tensors."""

    name: str  # "step_3", "final", or e.g. "supporter_xyz" (C_k stays open)
    state: dict[str, Any]  # adapter tensor name -> torch.Tensor (CPU copy)
    step: int


@dataclass
class GateCandidate:
    """One element of C_k as the gate measured it (a row of ``GateDecision.candidates``)."""

    name: str
    step: int | None  # the training step it was copied at (None: not given)
    score: float  # S(c)
    gain: float  # S(c) - S(ref)
    lower: float  # paired lower confidence bound of the gain
    se: float  # bootstrap standard deviation of the gain
    kl: float  # KL(c || ref), nats per token
    objective: float  # Eq. 4

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "GateCandidate":
        """Back from a ``GateDecision.to_dict`` row (None -> NaN)."""
        def num(key: str) -> float:
            v = record.get(key)
            return math.nan if v is None else float(v)
        step = record.get("step")
        return cls(name=str(record["name"]), step=None if step is None else int(step),
                   score=num("score"), gain=num("gain"), lower=num("lower"), se=num("se"),
                   kl=num("kl"), objective=num("objective"))


@dataclass
class GateDecision:
    """The Policy Inspector's verdict for phase k, with every number that led to it.

    One type for the gate (``atlas.dpo.gate.decide`` fills every field) and the supporters
    (the strategist reads the recent decisions, rebuilt from phase records with
    ``from_record``; a number that was not measured is NaN).
    """

    accepted: bool
    reason: str = ""  # atlas.dpo.gate: ACCEPTED | NO_GAIN | KL_TOO_LARGE | DISABLED | NO_ITEMS
    chosen: str = ""  # name of c* (the promoted candidate when accepted)
    gain: float = math.nan  # S(c*) - S(ref), normalised score units
    kl: float = math.nan  # KL(c* || ref), nats per token
    candidates: list[GateCandidate] = field(default_factory=list)  # C_k, in order
    ref_score: float = math.nan
    epsilon: float = 0.0
    delta: float = 0.0
    lam: float = 0.0
    score: float = math.nan  # S(c*)
    enabled: bool = True
    argmax: str = ""  # Eq. 4's choice (== chosen unless the gate is disabled)
    lower_bound: float = math.nan  # paired lower confidence bound of c*'s gain (tested vs epsilon)
    se: float = math.nan  # bootstrap standard deviation of c*'s gain
    confidence: float = math.nan  # level of that bound
    scale: str = ""  # unit of S (gate.scale: subset | item)
    bound: str = ""  # how the bound was read off the bootstrap: bc | percentile | normal (gate.bound; bc falls back to percentile on a thin G_k, gate.bc_min_completions)
    gain_scale: float = math.nan  # G in Eq. 4: max |gain| over C_k
    kl_scale: float = math.nan  # K in Eq. 4: max KL over C_k
    items: int = 0  # informative gate items S was measured on
    # per gate item, the index of the completion each policy ranks highest (the programs it
    # "prefers"): the Policy Inspector compares their per-component metrics (paper B.3.2)
    candidate_preferred: list[int] = field(default_factory=list)
    reference_preferred: list[int] = field(default_factory=list)

    def promoted_state(self, candidates: list[PolicyCandidate]) -> dict[str, Any] | None:
        """The tensors to promote (the chosen candidate's), or None when rejected."""
        if not self.accepted:
            return None
        for c in candidates:
            if c.name == self.chosen:
                return c.state
        raise KeyError(f"chosen candidate {self.chosen!r} is not in the given candidates "
                       f"{[c.name for c in candidates]}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record for telemetry (NaN -> None)."""
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        return clean(asdict(self))

    @classmethod
    def from_record(cls, record: Any) -> "GateDecision":
        """Back from a ``to_dict`` record (a phase event's ``gate``, possibly with extra keys
        such as ``held_out``) or an object with those attributes; None/non-finite -> NaN."""
        get = record.get if isinstance(record, dict) else (
            lambda k, d=None: getattr(record, k, d))
        kw: dict[str, Any] = {}
        for f in cls.__dataclass_fields__.values():
            v = get(f.name, None)
            if v is None:
                continue
            if f.name in _FLOAT_FIELDS:
                v = float(v) if math.isfinite(float(v)) else math.nan
            if f.name == "candidates":
                v = [c if isinstance(c, GateCandidate) else GateCandidate.from_record(c)
                     for c in v]
            kw[f.name] = v
        kw["accepted"] = bool(get("accepted", False))
        kw["reason"] = str(kw.get("reason") or "")
        return cls(**kw)


_FLOAT_FIELDS = frozenset({"gain", "kl", "ref_score", "epsilon", "delta", "lam", "score",
                           "lower_bound", "se", "confidence", "gain_scale", "kl_scale"})


@dataclass
class PhaseRecord:
    """What one phase did: the ``phase`` event of ``events.jsonl`` (``to_event``) and what
    the strategist reads of earlier phases (``FineTuner.history``).

    A phase ends at one of three points, and the event holds the fields filled up to there,
    in this order: skipped for no improvement (App. B.4: the first five fields), skipped for
    no pairs (the D_k fields too), or trained (DPO's numbers, then, with the adaptive
    reference, the gate's and the promotion's).
    """

    phase: int
    scores: dict[str, Any]
    improved: bool
    best_before: float | None
    reference: str
    # D_k (absent when the phase was skipped for no improvement)
    built: bool = False
    strategist: dict[str, Any] | None = None
    pairs: int = 0
    pair_prompts: int = 0
    held_out_prompts: int = 0
    dk_prompt_hashes: list[str] = field(default_factory=list)
    pair_kinds: dict[str, int] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    # why nothing was trained (None: trained)
    skip_reason: str | None = None
    # training
    dpo: dict[str, float] | None = None
    seconds_dpo: float = 0.0
    # the gate and the promotion (adaptive reference only)
    gate: GateDecision | None = None
    evidence: dict[str, Any] | None = None  # G_k: mode, counts, program ids (Evidence.to_event)
    held_out: bool = False  # G_k's prompts are not in D_k
    gk_prompt_hashes: list[str] = field(default_factory=list)
    gate_prompts: int = 0
    online: list[dict[str, Any]] | None = None  # gate.score_mode=online: the measurements
    promoted: bool | None = None
    vetoed: bool = False
    inspector: dict[str, Any] | None = None
    seconds_gate: float = 0.0
    # seconds_gate's parts: evidence (gathering G_k), pass (C_k and the reference over G_k),
    # estimate (Eq. 4/5's bootstrap), review (the inspector), promote
    seconds_gate_parts: dict[str, float] = field(default_factory=dict)
    # the learning probe (``atlas.probe``): before/after programs on prompts D_k never saw
    probe: dict[str, Any] | None = None
    seconds_probe: float = 0.0
    seconds: float = 0.0  # the phase without its probe

    @property
    def trained(self) -> bool:
        return self.skip_reason is None

    def skip(self, reason: str) -> "PhaseRecord":
        self.skip_reason = reason
        return self

    def gate_event(self) -> dict[str, Any] | None:
        """The event's ``gate``: the decision's record and how G_k was drawn."""
        if self.gate is None:
            return None
        out = self.gate.to_dict()
        out.update(held_out=self.held_out, gate_prompts=self.gate_prompts,
                   gk_prompt_hashes=self.gk_prompt_hashes, evidence=self.evidence)
        if self.online is not None:
            out["online"] = self.online
        return out

    def to_event(self) -> dict[str, Any]:
        """The ``phase`` event's fields (keys and their order are part of the file format)."""
        out: dict[str, Any] = {"phase": self.phase, "scores": self.scores,
                               "improved": self.improved, "best_before": self.best_before,
                               "reference": self.reference}
        if self.built:
            out.update(strategist=self.strategist, pairs=self.pairs,
                       pair_prompts=self.pair_prompts, held_out_prompts=self.held_out_prompts,
                       dk_prompt_hashes=self.dk_prompt_hashes, pair_kinds=self.pair_kinds,
                       knobs=self.knobs)
        if self.skip_reason is not None:
            out.update(skipped=True, reason=self.skip_reason)
            return out
        out.update(dpo=self.dpo, seconds_dpo=self.seconds_dpo)
        if self.gate is not None:
            out.update(gate=self.gate_event(), promoted=self.promoted, vetoed=self.vetoed,
                       inspector=self.inspector, seconds_gate=self.seconds_gate,
                       seconds_gate_parts=self.seconds_gate_parts)
        if self.probe is not None:
            out.update(probe=self.probe, seconds_probe=self.seconds_probe)
        out["seconds"] = self.seconds
        return out

    def to_state(self) -> dict[str, Any]:
        """Plain data for the checkpoint (``from_state`` reads it back)."""
        state = asdict(self)
        state["gate"] = self.gate.to_dict() if self.gate is not None else None
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "PhaseRecord":
        state = dict(state)
        if "skipped" in state:  # the compact form (phase, skipped, pairs, dpo, gate, promoted)
            skipped = state.pop("skipped")
            state = {**state, "scores": {}, "improved": True, "best_before": None,
                     "reference": "", "built": "pairs" in state,
                     "skip_reason": "skipped" if skipped else None}
        if state.get("gate") is not None:
            state["gate"] = GateDecision.from_record(state["gate"])
        return cls(**state)


def parse_program(code: str) -> ast.Module:
    """``ast.parse`` without the warnings of a candidate's own source (an invalid escape such
    as ``"\\E"``: a SyntaxWarning from Python 3.12, a DeprecationWarning before), which would
    otherwise print from the host process into the user's log. Raises as ``ast.parse``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(code)
