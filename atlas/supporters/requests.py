"""Build the roles' requests from what the loop holds (tasks, Programs, settings, history).

Kept apart from the schemas so the contracts stay free of loop details. The inputs are the
run's typed settings (``DPOConfig``, ``GateConfig``) and the gate's own records
(``GateDecision``, ``PhaseRecord``): every number a request carries is one the run was
configured with or the gate recorded, never a default of this module's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import mean
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from atlas.knobs import INTEGER_KNOBS
from atlas.supporters.patching import normalise
from atlas.supporters.schemas import (
    HARD_BOUNDS,
    DpoMetrics,
    ExplorationRequest,
    GateNumbers,
    InspectorRequest,
    KnobBounds,
    Knobs,
    QualityMetricView,
    ScoreStats,
    StrategistRequest,
)
from atlas.tasks.base import QualityMetric
from atlas.types import GateDecision, GateItem, PhaseRecord, Program, ProgramSource

if TYPE_CHECKING:
    from atlas.dpo.config import DPOConfig, GateConfig


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def exploration_request(task: Any, island: int, programs: Sequence[Program], temperature: float,
                        temperature_bounds: tuple[float, float], round: int = 0, best: int = 3,
                        recent: int = 3) -> ExplorationRequest:
    """The island's ``best`` passed programs plus its ``recent`` newest other programs."""
    spec = task.prompt_spec()
    ranked = sorted((p for p in programs if p.passed), key=lambda p: p.score, reverse=True)
    chosen = ranked[:best]
    ids = {id(p) for p in chosen}
    others = [p for p in reversed(list(programs)) if id(p) not in ids][:recent]
    return ExplorationRequest.build(task.name, spec, island, chosen + others, temperature,
                                    temperature_bounds, round=round,
                                    task_hints=tuple(getattr(task, "supporter_hints", ())))


def code_diversity(programs: Sequence[Program]) -> float:
    """Distinct normalised programs / total over the agent's own programs (seed and supporter
    patches excluded: they say nothing about how repetitive the agent is); 1.0 for none."""
    codes = [p.code for p in programs if p.source not in ("seed", "supporter")]
    return len({normalise(c) for c in codes}) / len(codes) if codes else 1.0


def _bounds(dpo_cfg: DPOConfig) -> KnobBounds:
    raw = dpo_cfg.bounds or {}
    out: dict[str, tuple[float, float]] = {}
    for name, (hlo, hhi) in HARD_BOUNDS.items():
        lo, hi = raw.get(name, (hlo, hhi))
        lo, hi = max(float(lo), hlo), min(float(hi), hhi)  # config may only narrow
        if lo > hi:
            lo, hi = hlo, hhi
        out[name] = (int(math.ceil(lo)), int(hi)) if name in INTEGER_KNOBS else (lo, hi)
    return KnobBounds(**out)


def strategist_request(phase: int, dpo_cfg: DPOConfig, gate_cfg: GateConfig,
                       programs: Sequence[Program], stats: Mapping[str, Any],
                       history: Sequence[PhaseRecord]) -> StrategistRequest:
    """Phase telemetry: knobs and bounds from ``dpo_cfg``, the gate's epsilon and delta from
    ``gate_cfg``, score stats of this phase, and the last trained phase's pairs / DPO metrics
    / gate decisions from ``history`` (oldest first)."""
    th = dpo_cfg.score_threshold
    knobs = Knobs(beta=float(dpo_cfg.beta), lr=float(dpo_cfg.lr), epochs=int(dpo_cfg.epochs),
                  score_threshold=None if th is None else float(th))
    trained = [h for h in history if h.trained]
    built = [h for h in history if h.built]  # phases that built D_k (0 pairs included)
    dpo = (trained[-1].dpo if trained else None) or {}
    gates = [h.gate for h in reversed(history) if h.gate is not None][:5]
    scores = ScoreStats(best=_finite(stats.get("best")), median=_finite(stats.get("median")),
                        min=_finite(stats.get("min")),
                        valid_rate=_finite(stats.get("valid_rate")) or 0.0,
                        n=int(stats.get("n") or 0),
                        n_passed=sum(1 for p in programs
                                     if p.passed and p.source != ProgramSource.SEED
                                     and math.isfinite(p.score)) if programs else None)
    return StrategistRequest(
        phase=phase, knobs=knobs, bounds=_bounds(dpo_cfg),
        pairs_built=built[-1].pairs if built else None,
        scores=scores, diversity=code_diversity(programs),
        gate_decisions=gates,
        dpo=DpoMetrics(loss=_finite(dpo.get("loss")),
                       accuracy=_clip01(_finite(dpo.get("accuracy", dpo.get("reward_accuracy")))),
                       margin=_finite(dpo.get("margin", dpo.get("reward_margin")))),
        gate_epsilon=gate_cfg.epsilon, gate_delta=gate_cfg.delta)


def _clip01(v: float | None) -> float | None:
    return None if v is None else min(max(v, 0.0), 1.0)


def component_means(completions: Sequence[str], programs: Sequence[Program]) -> dict[str, float]:
    """Per-metric means over the programs whose completion is in ``completions``."""
    by_completion = {p.completion: p for p in programs if p.completion}
    rows = [by_completion[c].evaluation.metrics for c in completions if c in by_completion]
    names = sorted({k for r in rows for k in r})
    out: dict[str, float] = {}
    for n in names:
        vals = [float(r[n]) for r in rows if n in r]
        out[n] = mean(vals) if all(math.isfinite(v) for v in vals) else math.inf
    return out


def _resolve(preferred: Sequence[Any], items: Sequence[GateItem]) -> list[str]:
    out = []
    for i, p in enumerate(preferred):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, int) and i < len(items) and 0 <= p < len(items[i].completions):
            out.append(items[i].completions[p])
    return out


#: one declared metric: the task's own (``Task.quality_metrics``), a view already built, or
#: a mapping with name / direction / description (validated as a view)
QualityMetricLike: TypeAlias = "QualityMetric | QualityMetricView | Mapping[str, Any]"
#: a task's declaration: its metrics, or ``{name: direction}`` (``Task.metric_directions()``)
QualityDeclaration: TypeAlias = ("Sequence[QualityMetricLike] | "
                                 "Mapping[str, Literal['max', 'min']]")


def quality_view(metric: QualityMetricLike) -> QualityMetricView:
    """One declared metric as the inspector's view; a type it cannot be is a ``TypeError``
    (a silent ``None`` name would compare nothing)."""
    if isinstance(metric, QualityMetricView):
        return metric
    if isinstance(metric, QualityMetric):
        return QualityMetricView(name=metric.name, direction=metric.direction,
                                 description=metric.description or "")
    if isinstance(metric, Mapping):
        return QualityMetricView.model_validate(
            {**metric, "description": metric.get("description") or ""})
    raise TypeError(f"a quality metric is a QualityMetric, a QualityMetricView or a mapping "
                    f"with name and direction, not {type(metric).__name__}")


def quality_views(declared: QualityDeclaration | None) -> list[QualityMetricView]:
    """The task's declared quality metrics as views: a sequence of ``QualityMetric`` (or of
    views, or of mappings with name/direction/description), or a ``{name: direction}``
    mapping."""
    if not declared:
        return []
    if isinstance(declared, Mapping):
        return [QualityMetricView(name=str(n), direction=d) for n, d in declared.items()]
    return [quality_view(m) for m in declared]


def inspector_request(phase: int, decision: GateDecision, items: Sequence[GateItem],
                      programs: Sequence[Program],
                      candidate_preferred: Sequence[str] | None = None,
                      reference_preferred: Sequence[str] | None = None,
                      quality_metrics: QualityDeclaration | None = None) -> InspectorRequest:
    """The gate's decision as it recorded it (its numbers, epsilon and delta, verdict and
    reason) and the declared quality metrics of the programs each policy prefers.

    ``quality_metrics`` is the task's declaration (``Task.quality_metrics`` or
    ``Task.metric_directions()``); only those metrics enter the request, so timings, flags and
    candidate-relative numbers are never compared. The preferred completions (one per gate
    item: the completion text, or its index in ``items[i].completions``) come from the
    arguments or from the decision's ``candidate_preferred`` / ``reference_preferred``;
    without them (or without a declaration) there is nothing to compare and the embedded
    inspector keeps the gate's decision.
    """
    cand = _resolve(candidate_preferred or decision.candidate_preferred, items)
    ref = _resolve(reference_preferred or decision.reference_preferred, items)
    gate = GateNumbers(gain=decision.gain, kl=decision.kl, epsilon=decision.epsilon,
                       delta=decision.delta, accepted=decision.accepted, reason=decision.reason)
    views = quality_views(quality_metrics)
    names = {m.name for m in views}

    def declared(means: dict[str, float]) -> dict[str, float]:
        return {n: v for n, v in means.items() if n in names}

    return InspectorRequest(phase=phase, gate=gate,
                            candidate_metrics=declared(component_means(cand, programs)),
                            reference_metrics=declared(component_means(ref, programs)),
                            quality_metrics=views)
