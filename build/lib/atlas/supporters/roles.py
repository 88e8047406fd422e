"""The three supporter roles of paper 2.1, each a ``Role`` bound to its prompt, parser, rule."""

from __future__ import annotations

import random

from atlas.supporters import answers, embedded, prompts
from atlas.supporters.base import Role
from atlas.supporters.config import ExplorationConfig, InspectorConfig, StrategistConfig
from atlas.supporters.schemas import (
    ExplorationAdvice,
    ExplorationRequest,
    InspectorRequest,
    InspectorVerdict,
    StrategistAdvice,
    StrategistRequest,
)


class ExplorationSupporter(Role[ExplorationRequest, ExplorationAdvice]):
    """Critiques an island's programs, proposes patched programs and an island temperature.

    The caller puts ``critique`` in the island's next prompt, evaluates ``patches`` like any
    candidate (``Program.source="supporter"``) and applies ``temperature`` if not None.
    """

    name = "exploration"
    cfg: ExplorationConfig

    def advise(self, req: ExplorationRequest) -> ExplorationAdvice:
        return self._answer(req)

    def _prompt(self, req: ExplorationRequest) -> tuple[str, str]:
        return prompts.exploration(req, self.cfg)

    def _parse(self, text: str, req: ExplorationRequest) -> ExplorationAdvice:
        return answers.parse_exploration(text, req, self.cfg)

    def _rule(self, req: ExplorationRequest) -> ExplorationAdvice:
        # deterministic per (seed, island, call): same run, same advice
        rng = random.Random(self.seed * 1_000_003 + req.island * 7_919 + self.stats.calls)
        return embedded.explore(req, self.cfg, rng)


class FineTuningStrategist(Role[StrategistRequest, StrategistAdvice]):
    """Sets beta / lr / epochs / score_threshold for the next phase from phase telemetry.

    ``advice.changed`` lists the knobs whose value differs from ``req.knobs``: the caller
    counts an intervention per listed knob.
    """

    name = "strategist"
    cfg: StrategistConfig

    def advise(self, req: StrategistRequest) -> StrategistAdvice:
        return self._answer(req)

    def _prompt(self, req: StrategistRequest) -> tuple[str, str]:
        return prompts.strategist(req)

    def _parse(self, text: str, req: StrategistRequest) -> StrategistAdvice:
        return answers.parse_strategist(text, req, self.cfg)

    def _rule(self, req: StrategistRequest) -> StrategistAdvice:
        return embedded.strategize(req, self.cfg)


class PolicyInspector(Role[InspectorRequest, InspectorVerdict]):
    """Reviews a promotion the numeric gate accepted and may veto it; it never forces one.

    A promotion the gate rejected is passed through without asking the model.
    """

    name = "inspector"
    cfg: InspectorConfig

    def review(self, req: InspectorRequest) -> InspectorVerdict:
        # the model is only asked about accepted promotions, and its answer can only keep or
        # veto them (parse_inspector sets accepted = not veto): it cannot force one
        return self._answer(req, ask_model=req.gate.accepted)

    def _prompt(self, req: InspectorRequest) -> tuple[str, str]:
        return prompts.inspector(req)

    def _parse(self, text: str, req: InspectorRequest) -> InspectorVerdict:
        return answers.parse_inspector(text, req, self.cfg)

    def _rule(self, req: InspectorRequest) -> InspectorVerdict:
        return embedded.inspect(req, self.cfg)
