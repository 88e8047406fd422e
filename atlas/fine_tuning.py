"""One fine-tuning phase k of EvoTune / EvoDPO / ATLAS (paper 2.2, App. B.1, B.4).

Order inside a phase: efficiency check (skip without improvement) -> strategist adjusts
the knobs -> G_k held out, D_k built -> DPO on the ``policy`` adapter against the method's
reference, in a Lightning fit that carries the reference's owner (``ReferenceCallback``,
adaptive reference only): it keeps C_k and, when the fit ends, applies Eq. 4 and Eq. 5 on
G_k, asks the inspector's review and copies an accepted, unvetoed c* into ``ref``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

from atlas.agent.adapters import REF, get_adapter_state
from atlas.checkpoint import CheckpointError
from atlas.dpo import DPOConfig, GateConfig, train_phase
from atlas.dpo.attention import resolve_attention
from atlas.dpo.evidence import HOLDOUT, Evidence, choose_evidence
from atlas.dpo.online_inspection import OnlineInspector
from atlas.dpo.reference import (
    GateJudge,
    Promoter,
    ReferenceCallback,
    ReferenceOutcome,
    ReferenceState,
)
from atlas.evolution.buffer import failure_floor
from atlas.evolution.preferences import PAIR_KINDS, build_pairs
from atlas.evolution.prompts import prompt_hash
from atlas.knobs import KNOBS
from atlas.probe import LearningProbe
from atlas.schema import MethodConfig, ProbeConfig
from atlas.supporters import Supporters
from atlas.supporters import requests as supporter_requests
from atlas.supporters.schemas import KNOB_FIELDS
from atlas.types import (
    GateDecision,
    PhaseRecord,
    PreferencePair,
    Program,
    ProgramSource,
    ReferenceMode,
)

if TYPE_CHECKING:  # annotations only: the run's collaborators, built by EvolutionLoop
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo.phase import PhaseLogger
    from atlas.evolution.database import ProgramDatabase
    from atlas.evolution.explorer import Explorer
    from atlas.tasks.base import QualityMetric

log = logging.getLogger("atlas.fine_tuning")


def phase_seed(seed: int, phase: int) -> int:
    """The seed of phase ``phase``'s draws (D_k, G_k, held-out prompts, DPO, the gate): one
    per phase, so G_k is not reused across phases (paper B.7), and the same on a resume."""
    return seed * 1000 + phase


def score_stats(programs: list[Program]) -> dict[str, float | None]:
    scores = sorted(p.score for p in programs if p.passed and math.isfinite(p.score))
    return {
        "best": scores[-1] if scores else None,
        "median": median(scores) if scores else None,
        "min": scores[0] if scores else None,
        "valid_rate": (sum(p.passed for p in programs) / len(programs)) if programs else None,
        "n": len(programs),
    }


@dataclasses.dataclass(frozen=True)
class PhaseSettings:
    """What configures a phase, as the run's ``Settings`` validated it: the method (its
    reference), the DPO knobs' starting values and bounds, the gate, and the learning probe
    (None or not enabled: no probe)."""

    method: MethodConfig
    dpo: DPOConfig
    gate: GateConfig
    probe: ProbeConfig | None = None


class FineTuner:
    """Holds what persists across phases: the knobs, optimiser state, gate history."""

    def __init__(self, agent: ResearchAgent, settings: PhaseSettings, seed: int, *,
                 supporters: Supporters | None = None, explorer: Explorer | None = None,
                 quality_metrics: Sequence[QualityMetric] = ()) -> None:
        """``supporters``: the run's, or None for a method without them; ``explorer``: the
        run's, for ``gate.score_mode=online`` and the learning probe; ``quality_metrics``:
        the task's declared ones, the only metrics the Policy Inspector compares."""
        method, dpo_cfg, gate_cfg, probe = (settings.method, settings.dpo, settings.gate,
                                            settings.probe)
        if gate_cfg.score_mode == "online" and explorer is None:
            raise ValueError("gate.score_mode=online samples and scores programs: pass the "
                             "run's Explorer (EvolutionLoop does)")
        if probe is not None and probe.enabled and explorer is None:
            raise ValueError("the learning probe samples and scores programs: pass the run's "
                             "Explorer (EvolutionLoop does), or probe=None")
        resolve_attention(dpo_cfg.attention, agent.model)  # a kernel the model can't run: now
        self.probe_cfg = probe if probe is not None and probe.enabled else None
        self.explorer = explorer
        self.quality_metrics = tuple(quality_metrics)
        self.agent = agent
        self.method = method
        self.dpo_cfg = dpo_cfg
        self.gate_cfg = gate_cfg
        self.supporters = supporters
        self.seed = seed
        self.optimizer_state: dict | None = None
        self.history: list[PhaseRecord] = []  # the phases so far, which the strategist reads
        self.reference_state = ReferenceState()  # what `ref` is (the reference callback's state)

    # -- persistence (crash-safe resume) -----------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"dpo_cfg": dataclasses.asdict(self.dpo_cfg), "optimizer_state": self.optimizer_state,
                "history": [r.to_state() for r in self.history],
                "reference": self.reference_state.to_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the phase state (``atlas.checkpoint.load`` has migrated older formats)."""
        if "reference_swap" in state:
            raise CheckpointError("this checkpoint queues a promotion (reference_swap): load it "
                                  "with atlas.checkpoint.load, which migrates it")
        self.dpo_cfg = DPOConfig(**state["dpo_cfg"])
        self.optimizer_state = state["optimizer_state"]
        self.history = [PhaseRecord.from_state(r) for r in state["history"]]
        self.reference_state = ReferenceState.from_state(state.get("reference"))

    # -- the phase ---------------------------------------------------------------------
    def run_phase(self, phase: int, phase_programs: list[Program], best_before: float,
                  db: ProgramDatabase | None = None, logger: PhaseLogger = None,
                  copies: Sequence[Any] = ()) -> PhaseRecord:
        """Run phase ``phase`` on this phase's programs (``copies``: its proposals that were
        not evaluated as copies, for ``dpo.lazy_pairs``); returns its record (the caller logs
        ``record.to_event()``)."""
        record = self._run_phase(phase, phase_programs, best_before, db, logger, copies)
        self.history.append(record)
        return record

    def _run_phase(self, phase: int, phase_programs: list[Program], best_before: float,
                   db: ProgramDatabase | None, logger: PhaseLogger,
                   copies: Sequence[Any] = ()) -> PhaseRecord:
        """The phase as the module docstring reads; the record is built from what each step
        returns, at the point where the phase ends."""
        t0 = time.time()
        head = self._phase_head(phase, phase_programs, best_before)
        if self.method.skip_without_improvement and not head["improved"]:
            return PhaseRecord(**head, skip_reason="no score improvement this phase (paper B.4)")

        strategist = self._consult_strategist(phase, phase_programs, head["scores"])
        # G_k first: when it is held out, D_k never sees its prompts (atlas.dpo.evidence)
        evidence = self._choose_evidence(phase, phase_programs)
        held = evidence.held if evidence is not None else []
        pairs = build_pairs(db, [p for p in phase_programs if p.prompt not in held],
                            top_k=self.dpo_cfg.top_k, max_pairs=self.dpo_cfg.max_pairs,
                            score_threshold=self.dpo_cfg.score_threshold,
                            seed=phase_seed(self.seed, phase),
                            copies=[c for c in copies if c.prompt not in held],
                            lazy=self.dpo_cfg.lazy_pairs)
        built = dict(built=True, strategist=strategist,
                     **dk_fields(pairs, held, self.dpo_cfg))
        if not pairs:
            return PhaseRecord(**head, **built, skip_reason="no preference pairs could be built")

        probe = self._probe_before(phase, phase_programs)
        reference_state = (get_adapter_state(self.agent.model, REF)
                           if self.method.reference == ReferenceMode.ADAPTIVE else None)
        owner = self._reference_owner(phase, phase_programs, evidence) if evidence else None
        trained, outcome = self._train(phase, pairs, owner, logger)
        gate = (gate_fields(owner, evidence, outcome)
                if owner is not None and evidence is not None and outcome is not None else {})
        learned = self._probe_after(probe, reference_state)
        return PhaseRecord(**head, **built, **trained, **gate, **learned,
                           seconds=time.time() - t0 - learned.get("seconds_probe", 0.0))

    def _probe_before(self, phase: int, programs: list[Program]) -> LearningProbe | None:
        """The learning probe's prompts and its programs from the policy entering the phase
        (``atlas.probe``); None when the probe is off."""
        if self.probe_cfg is None or self.explorer is None:
            return None
        probe = LearningProbe.for_phase(self.probe_cfg, self.explorer, programs,
                                        phase_seed(self.seed, phase))
        probe.before()
        return probe

    def _probe_after(self, probe: LearningProbe | None, reference_state: dict | None
                     ) -> dict[str, Any]:
        """The record's probe fields: the trained policy's programs and the measures."""
        if probe is None:
            return {}
        probe.after()
        record = probe.record(self.agent.model, self.agent.tokenizer,
                              reference_state=reference_state, beta=self.dpo_cfg.beta,
                              max_length=self.dpo_cfg.max_length)
        return dict(probe=record, seconds_probe=record["seconds"]["total"])

    def _phase_head(self, phase: int, programs: list[Program], best_before: float
                    ) -> dict[str, Any]:
        """The fields every phase event has: the phase's scores and whether they improved."""
        best_now = max((p.score for p in programs if p.passed), default=-math.inf)
        return dict(phase=phase,
                    scores=score_stats([p for p in programs if p.source != ProgramSource.SEED]),
                    improved=best_now > best_before,
                    best_before=best_before if math.isfinite(best_before) else None,
                    reference=self.method.reference)

    def _choose_evidence(self, phase: int, programs: list[Program]) -> Evidence | None:
        """G_k, for the adaptive reference only (a fixed reference is never gated)."""
        if self.method.reference != ReferenceMode.ADAPTIVE:
            return None
        return choose_evidence(programs, self.gate_cfg, phase_seed(self.seed, phase),
                               gated=bool(self.method.gate))

    def _train(self, phase: int, pairs: list[PreferencePair], owner: ReferenceCallback | None,
               logger: PhaseLogger) -> tuple[dict[str, Any], ReferenceOutcome | None]:
        """DPO on D_k, with the reference's owner, which decides at the end of the fit: the
        record's training fields and the owner's outcome (None without an owner)."""
        t1 = time.time()
        result = train_phase(self.agent.model, self.agent.tokenizer, pairs, self.dpo_cfg,
                             self.method.reference, seed=phase_seed(self.seed, phase),
                             logger=logger, optimizer_state=self.optimizer_state,
                             reference_callback=owner)
        self.optimizer_state = getattr(result, "optimizer_state", None)
        outcome = result.reference
        seconds_dpo = time.time() - t1 - (outcome.seconds if outcome is not None else 0.0)
        return dict(dpo=result.metrics, seconds_dpo=seconds_dpo), outcome

    def _reference_owner(self, phase: int, programs: list[Program], evidence: Evidence
                         ) -> ReferenceCallback:
        """The adaptive reference's owner for this phase's fit: the judge (G_k, the gate's
        settings), the promoter (the inspector's review, the run's ``ReferenceState``)."""
        t0 = time.time()
        gated = bool(self.method.gate)
        items = evidence.items
        sufficient = not gated or evidence.sufficient
        judge = GateJudge(self.agent.tokenizer, items, self.gate_cfg, gated=gated,
                          seed=phase_seed(self.seed, phase), sufficient=sufficient,
                          online_score=self._online_inspector(phase, items, programs)
                          if sufficient else None)
        review = None
        if gated and self.supporters is not None:
            inspector = self.supporters.inspector

            def review(decision: GateDecision) -> Any:
                return inspector.review(supporter_requests.inspector_request(
                    phase, decision, items, programs, quality_metrics=self.quality_metrics))
        owner = ReferenceCallback(Promoter(judge, phase=phase, state=self.reference_state,
                                           review=review))
        owner.prepare_seconds = time.time() - t0
        return owner

    def _online_inspector(self, phase: int, items: list, programs: list[Program]
                          ) -> OnlineInspector | None:
        """gate.score_mode=online: each policy writes fresh programs for G_k's prompts, scored
        under the task context of the phase's last round."""
        if self.gate_cfg.score_mode != "online" or not items:
            return None
        last_round = max((p.round for p in programs), default=0)
        return OnlineInspector(self.explorer, [it.prompt for it in items],
                               self.explorer.task.context(last_round),
                               samples=self.gate_cfg.online_samples,
                               temperature=self.gate_cfg.online_temperature,
                               failure_score=failure_floor(programs),
                               seed=phase_seed(self.seed, phase))

    def _consult_strategist(self, phase: int, programs: list[Program],
                            stats: dict[str, Any]) -> dict[str, Any] | None:
        """ATLAS only: the strategist may change beta / lr / epochs / score_threshold."""
        if self.supporters is None:
            return None
        request = supporter_requests.strategist_request(phase, self.dpo_cfg, self.gate_cfg,
                                                        programs, stats, self.history)
        advice = self.supporters.strategist.advise(request)
        before = dataclasses.asdict(self.dpo_cfg)
        updated = dataclasses.replace(self.dpo_cfg, beta=advice.beta, lr=advice.lr,
                                      epochs=int(advice.epochs),
                                      score_threshold=advice.score_threshold).clamped()
        changed = [k for k in KNOBS if getattr(updated, k) != before[k]]
        self.dpo_cfg = updated
        return {"changed": changed, "backend": advice.backend,
                "fallback_cause": advice.fallback_cause,
                "rationale": getattr(advice, "rationale", ""),
                "reasons": dict(getattr(advice, "reasons", {}) or {}),
                "values": {k: getattr(updated, k) for k in KNOB_FIELDS}}


def dk_fields(pairs: list[PreferencePair], held: list[str], cfg: DPOConfig) -> dict[str, Any]:
    """The record's D_k fields: its pairs, their prompts and kinds, the knobs it trains with."""
    return dict(pairs=len(pairs), pair_prompts=len({p.prompt for p in pairs}),
                held_out_prompts=len(held),
                dk_prompt_hashes=sorted({prompt_hash(p.prompt) for p in pairs}),
                pair_kinds={k: sum(1 for p in pairs if p.kind == k) for k in PAIR_KINDS},
                knobs={k: getattr(cfg, k) for k in KNOB_FIELDS})


def gate_fields(owner: ReferenceCallback, evidence: Evidence, outcome: ReferenceOutcome
                ) -> dict[str, Any]:
    """The record's gate fields: the owner's decision on G_k and the promotion."""
    judge = owner.promoter.judge
    online = judge.online_score
    return dict(gate=outcome.decision, evidence=evidence.to_event(),
                held_out=evidence.mode == HOLDOUT, gate_prompts=len(judge.items),
                gk_prompt_hashes=sorted({prompt_hash(it.prompt) for it in judge.items}),
                online=online.records if online is not None else None,
                promoted=outcome.promoted, vetoed=outcome.vetoed, inspector=outcome.verdict,
                seconds_gate=outcome.seconds + owner.prepare_seconds,
                seconds_gate_parts={"evidence": owner.prepare_seconds, **outcome.parts})


def adapter_snapshot(agent: Any) -> dict[str, Any]:
    """Both adapters' tensors, for the checkpoint."""
    return {"policy": get_adapter_state(agent.model, "policy"),
            "ref": get_adapter_state(agent.model, "ref")}
