"""Task-distributed supporters (paper 2.1): exploration, fine-tuning strategy, inspection.

``make_supporters(role_configs(cfg), seed=...)`` turns the ``supporters`` config group
into the three roles (a run passes its validated ``Settings.supporters``). Each role runs
on the ``embedded`` rules (default, no model) or an ``openai``-compatible endpoint, and
falls back to its rule whenever the model's answer is unusable; ``Supporters.stats()``
reports how often that happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from atlas.supporters.config import (
    ExplorationConfig,
    InspectorConfig,
    RoleConfig,
    StrategistConfig,
)
from atlas.supporters.roles import ExplorationSupporter, FineTuningStrategist, PolicyInspector
from atlas.supporters.schemas import (
    HARD_BOUNDS,
    DpoMetrics,
    ExplorationAdvice,
    ExplorationRequest,
    GateDecision,
    GateNumbers,
    InspectorRequest,
    InspectorVerdict,
    KnobBounds,
    Knobs,
    ProgramView,
    QualityMetricView,
    ScoreStats,
    StrategistAdvice,
    StrategistRequest,
)


@dataclass
class Supporters:
    """The three roles the loop calls (method=atlas)."""

    exploration: ExplorationSupporter
    strategist: FineTuningStrategist
    inspector: PolicyInspector

    def stats(self) -> dict:
        """Per role: backend, calls, llm_ok, embedded, fallbacks{cause: n},
        modes{output mode: {asked, ok}}."""
        return {r.name: r.stats.as_dict()
                for r in (self.exploration, self.strategist, self.inspector)}

    def load_stats(self, stats: Mapping[str, Mapping]) -> None:
        """Restore counters from ``stats()`` output (run resume); unknown roles are ignored."""
        for r in (self.exploration, self.strategist, self.inspector):
            s = stats.get(r.name)
            if s:
                r.stats.calls = int(s.get("calls", 0))
                r.stats.llm_ok = int(s.get("llm_ok", 0))
                r.stats.embedded = int(s.get("embedded", 0))
                r.stats.fallbacks.update({k: int(v) for k, v in (s.get("fallbacks") or {}).items()
                                          if k in r.stats.fallbacks})
                r.stats.modes = {k: {"asked": int(v.get("asked", 0)), "ok": int(v.get("ok", 0))}
                                 for k, v in (s.get("modes") or {}).items()}


def make_supporters(cfgs: Mapping[str, RoleConfig], *, seed: int) -> Supporters:
    """The three roles of validated settings (``role_configs``: a run's
    ``Settings.supporters``), each seeded with ``seed``."""
    exp, strat, insp = cfgs["exploration"], cfgs["strategist"], cfgs["inspector"]
    assert isinstance(exp, ExplorationConfig) and isinstance(strat, StrategistConfig)
    assert isinstance(insp, InspectorConfig)
    return Supporters(exploration=ExplorationSupporter(exp, seed=seed),
                      strategist=FineTuningStrategist(strat, seed=seed),
                      inspector=PolicyInspector(insp, seed=seed))


__all__ = [
    "HARD_BOUNDS", "DpoMetrics", "ExplorationAdvice", "ExplorationRequest",
    "ExplorationSupporter", "FineTuningStrategist", "GateDecision", "GateNumbers",
    "InspectorRequest", "InspectorVerdict", "KnobBounds", "Knobs", "PolicyInspector",
    "ProgramView", "QualityMetricView", "ScoreStats", "StrategistAdvice", "StrategistRequest", "Supporters",
    "make_supporters",
]
