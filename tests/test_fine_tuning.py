"""A fine-tuning phase's promotion: ``ref`` moves when the phase decides, and only then.

The real tiny agent trains on hand-made programs (two completions a prompt, one better); the
gate's thresholds choose the verdict. A resumed checkpoint that still holds a promotion queued
for the next phase applies it on load.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from atlas.agent.adapters import POLICY, REF, get_adapter_state, set_adapter_state
from atlas.agent.research_agent import ResearchAgent
from atlas.dpo import DPOConfig, GateConfig
from atlas.evolution.database import ProgramDatabase
from atlas.fine_tuning import FineTuner, PhaseSettings
from atlas.schema import MethodConfig
from atlas.supporters import make_supporters
from atlas.supporters.config import role_configs
from atlas.supporters.schemas import InspectorVerdict
from atlas.types import Evaluation, Program
from tests.conftest import explore_settings, model_settings

DPO = DPOConfig(lr=1e-2, epochs=1, batch_size=2, max_length=96, checkpoints=0)
EVODPO = MethodConfig.from_cfg({"name": "evodpo", "reference": "adaptive", "gate": False,
                                "supporters": False, "skip_without_improvement": False})
ATLAS = MethodConfig.from_cfg({"name": "atlas", "reference": "adaptive", "gate": True,
                               "supporters": True, "skip_without_improvement": False})
# epsilon -1 and a wide trust region accept any candidate; epsilon 10 none; G_k held out
ACCEPT = GateConfig(epsilon=-1.0, delta=1e6, holdout=0.5, subset_size=4, evidence="holdout",
                    min_completions=2)
REJECT = dataclasses.replace(ACCEPT, epsilon=10.0)


def programs() -> list[Program]:
    """Four prompts, each with a better and a worse passed completion."""
    out = []
    for i in range(4):
        prompt = f"# task {i}\ndef solve(x):\n"
        for j, (body, score) in enumerate(((f"    return x * {i + 2}\n", -0.1 * i),
                                           ("    return 0\n", -1.0 - i))):
            out.append(Program(id=2 * i + j, island=i % 2, round=1, code=prompt + body,
                               evaluation=Evaluation(score=score, passed=True), prompt=prompt,
                               completion=body, phase=1))
    return out


def state(agent: ResearchAgent, name: str) -> dict[str, torch.Tensor]:
    return get_adapter_state(agent.model, name)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class VetoInspector:
    """An inspector that vetoes every promotion it reviews (an edge: the embedded one vetoes
    only on declared-metric regressions these programs do not carry)."""

    def __init__(self) -> None:
        self.reviews = 0

    def review(self, request: object) -> InspectorVerdict:
        self.reviews += 1
        return InspectorVerdict(accepted=False, veto=True, reason="Regression: test")


@pytest.fixture(scope="module")
def agent() -> ResearchAgent:
    return ResearchAgent(model_settings(), seed=0)


def run_phase(agent: ResearchAgent, method: MethodConfig, gate: GateConfig,
              supporters=None) -> tuple[FineTuner, object, dict[str, torch.Tensor]]:
    """One phase from a reference unlike the policy; returns the tuner, its record and ref
    before the phase."""
    g = torch.Generator().manual_seed(3)
    before = {k: torch.randn(v.shape, generator=g) * 0.05 for k, v in state(agent, REF).items()}
    set_adapter_state(agent.model, REF, before)
    tuner = FineTuner(agent, PhaseSettings(method, DPO, gate), seed=0, supporters=supporters)
    db = ProgramDatabase(explore_settings(islands=2), seed=0)
    record = tuner.run_phase(1, programs(), best_before=-5.0, db=db)
    assert record.built and record.pairs >= 1 and record.gate is not None
    return tuner, record, before


def test_evodpo_promotes_the_phase_final_policy_when_it_decides(agent):
    _, record, before = run_phase(agent, EVODPO, ACCEPT)
    assert record.gate.reason == "accepted: gate disabled" and record.promoted
    assert record.gate.chosen == "final"
    # C_k is only the final policy (dpo.checkpoints=0), which the gate leaves in the policy
    assert same(state(agent, REF), state(agent, POLICY))
    assert not same(state(agent, REF), before)
    assert "reference_swapped" not in record.dpo


def test_an_accepted_gate_promotes_and_a_rejected_or_vetoed_one_does_not(agent):
    _, record, before = run_phase(agent, ATLAS, ACCEPT)
    assert record.gate.accepted and record.promoted and record.held_out
    assert same(state(agent, REF), state(agent, POLICY)) and not same(state(agent, REF), before)

    _, record, before = run_phase(agent, ATLAS, REJECT)
    assert record.gate.reason == "rejected: no gain" and not record.promoted
    assert same(state(agent, REF), before)

    sup = make_supporters(role_configs(None), seed=0)
    veto = VetoInspector()
    _, record, before = run_phase(agent, ATLAS, ACCEPT, dataclasses.replace(sup, inspector=veto))
    assert record.gate.accepted and record.vetoed and not record.promoted
    assert veto.reviews == 1 and same(state(agent, REF), before)


def test_the_fine_tuner_checkpoints_what_the_reference_is(agent):
    """The reference callback's state (what `ref` is, every promotion) is in the run
    checkpoint; a resumed fine-tuner knows it."""
    tuner, record, _ = run_phase(agent, ATLAS, ACCEPT)
    saved = tuner.state_dict()
    assert record.promoted and saved["reference"]["current"] == f"phase 1 {record.gate.chosen}"
    assert saved["reference"]["promotions"] == [
        {"phase": 1, "candidate": record.gate.chosen,
         "step": next(c.step for c in record.gate.candidates if c.name == record.gate.chosen)}]
    fresh = FineTuner(agent, PhaseSettings(ATLAS, DPO, ACCEPT), seed=0)
    fresh.load_state_dict(saved)
    assert fresh.reference_state == tuner.reference_state


def test_an_old_checkpoint_with_a_queued_promotion_migrates_once_at_load(tmp_path):
    """Checkpoints written when an accepted promotion waited for the next phase's start hold
    it as ``finetuner.reference_swap.pending`` beside the old ``ref``: ``checkpoint.load``
    makes it the reference, the next save has no pending promotion, and a fine-tuner given
    the raw old state refuses it in one line."""
    from atlas import checkpoint
    from atlas.checkpoint import CheckpointError

    ref = {"w": torch.zeros(2)}
    pending = {"w": torch.ones(2)}
    old = {"next_round": 3, "adapters": {"policy": {"w": torch.full((2,), 2.0)}, "ref": ref},
           "finetuner": {"dpo_cfg": {}, "optimizer_state": None, "history": [],
                         "reference_swap": {"pending": pending, "pending_name": "final",
                                            "applied": []}}}
    with pytest.raises(CheckpointError, match="reference_swap"):
        FineTuner.load_state_dict(object.__new__(FineTuner), old["finetuner"])
    checkpoint.save(tmp_path, old)
    loaded = checkpoint.load(tmp_path)
    assert torch.equal(loaded["adapters"]["ref"]["w"], pending["w"])
    assert "reference_swap" not in loaded["finetuner"]
    checkpoint.save(tmp_path, loaded)
    again = checkpoint.load(tmp_path)
    assert torch.equal(again["adapters"]["ref"]["w"], pending["w"])
    # nothing pending: ref stays as saved
    old["finetuner"]["reference_swap"] = {"pending": None, "pending_name": "", "applied": ["final"]}
    old["adapters"]["ref"] = ref
    checkpoint.save(tmp_path, old)
    assert torch.equal(checkpoint.load(tmp_path)["adapters"]["ref"]["w"], ref["w"])


# -- the gate's evidence G_k ------------------------------------------------------------------
def test_auto_evidence_holds_out_when_it_is_rich_and_decides_on_the_buffer_otherwise():
    from atlas.dpo.evidence import BUFFER, HOLDOUT, choose_evidence

    progs = programs()  # 4 prompts x 2 completions: held out, 2 prompts x 2 = 4 informative
    auto = dataclasses.replace(ACCEPT, evidence="auto", min_holdout_completions=4)
    ev = choose_evidence(progs, auto, seed=1, gated=True)
    assert ev.mode == HOLDOUT and len(ev.held) == 2 and ev.informative == 4 and ev.sufficient
    assert {i for it in ev.items for i in it.ids} == {p.id for p in progs if p.prompt in ev.held}

    thin = dataclasses.replace(auto, min_holdout_completions=5)
    ev = choose_evidence(progs, thin, seed=1, gated=True)
    assert ev.mode == BUFFER and ev.held == [] and ev.informative == 8
    assert "4 held-out informative completions < gate.min_holdout_completions=5" in ev.why
    event = ev.to_event()
    assert event["in_sample"] and event["completions"] == 8
    assert sorted(i for ids in event["program_ids"] for i in ids) == list(range(8))

    # one prompt (a first phase: every island starts from the seed): nothing can be held out
    one = [p for p in progs if p.prompt == progs[0].prompt]
    ev = choose_evidence(one, auto, seed=1, gated=True)
    assert ev.mode == BUFFER and ev.informative == 2 and ev.sufficient
    stricter = dataclasses.replace(auto, min_completions=3)
    assert not choose_evidence(one, stricter, seed=1, gated=True).sufficient


def test_a_phase_below_the_minimum_evidence_is_insufficient_not_rejected(agent):
    """A G_k thinner than gate.min_completions makes no decision: the reference stays, the
    record says "insufficient evidence" (not a rejection), and the gate measured nothing."""
    thin = dataclasses.replace(ACCEPT, evidence="buffer", min_completions=9)
    _, record, before = run_phase(agent, ATLAS, thin)
    assert record.gate.reason == "insufficient evidence" and not record.gate.accepted
    assert not record.promoted and same(state(agent, REF), before)
    assert record.evidence["informative_completions"] == 8 and not record.evidence["sufficient"]
    assert record.gate.gain != record.gate.gain  # NaN: nothing measured
    assert "pass" not in record.seconds_gate_parts  # no forward pass ran

    enough = dataclasses.replace(thin, min_completions=8)
    _, record, _ = run_phase(agent, ATLAS, enough)
    assert record.gate.reason == "accepted" and record.promoted
    assert record.evidence["mode"] == "buffer" and record.evidence["in_sample"]
    assert record.to_event()["gate"]["evidence"] == record.evidence
    # the gate's seconds, split by part: they add up, and the forward passes are measured
    parts = record.to_event()["seconds_gate_parts"]
    assert set(parts) == {"evidence", "pass", "estimate", "review", "other"}
    assert all(v >= 0 for v in parts.values()) and parts["pass"] > 0
    assert sum(parts.values()) == pytest.approx(record.seconds_gate, rel=1e-9)
