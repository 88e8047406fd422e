"""The reference's promoter without a Trainer: Eq. 4, the gate's rule, the review and the
promotion on a C_k built by hand (tiny model, real forward passes on a real G_k)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from atlas.agent.adapters import POLICY, REF, attach_adapters, get_adapter_state
from atlas.agent.tiny import build_tiny_model
from atlas.dpo.config import GateConfig
from atlas.dpo.reference import GateJudge, Promoter, ReferenceState
from atlas.dpo.rules import ACCEPTED, DISABLED, INSUFFICIENT, NO_GAIN
from atlas.types import GateItem, PolicyCandidate

ITEMS = [
    GateItem(prompt="# bandit\ndef act(x):\n", completions=["    return 0\n",
                                                           "    return argmax(x)\n", "oops"],
             scores=[-0.6, -0.2, -5.0], preferred="    return argmax(x)\n"),
    GateItem(prompt="# pinn weights\n", completions=["w = 1.0", "w = [1, 10, 100]  # ic heavy"],
             scores=[-1.0, -0.5], preferred="w = [1, 10, 100]  # ic heavy"),
]
#: any measured gain clears -1 and any KL stays under 1e6: the rule accepts
ACCEPTING = GateConfig(epsilon=-1.0, delta=1e6, resamples=50)


def _policy(model, seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * scale
            for k, v in get_adapter_state(model, POLICY).items()}


@pytest.fixture()
def phase():
    """A tiny model with adapters and C_k: a snapshot at step 2 and the phase-final policy."""
    model, tok = build_tiny_model(seed=0)
    torch.manual_seed(0)
    model = attach_adapters(model, r=4, alpha=8)
    candidates = [PolicyCandidate(name="step_2", state=_policy(model, 1), step=2),
                  PolicyCandidate(name="final", state=_policy(model, 2), step=4)]
    return model, tok, candidates


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_accepted_candidate_is_promoted_without_a_trainer(phase):
    model, tok, candidates = phase
    policy_before = get_adapter_state(model, POLICY)
    state = ReferenceState()
    model.train()
    promoter = Promoter(GateJudge(tok, ITEMS, ACCEPTING, gated=True, seed=7), phase=2,
                        state=state)
    out = promoter.run(model, candidates)
    d = out.decision
    assert d.accepted and d.reason == ACCEPTED and d.enabled
    # Eq. 4 on the measured numbers: c* is the candidate with the larger objective
    objectives = {c.name: c.objective for c in d.candidates}
    assert d.chosen == max(objectives, key=objectives.get) and d.items == 2
    chosen = next(c for c in candidates if c.name == d.chosen)
    assert out.promoted and out.candidate == d.chosen and not out.vetoed
    assert _same(get_adapter_state(model, REF), chosen.state)  # ref now holds c*
    assert _same(get_adapter_state(model, POLICY), policy_before)  # the policy is untouched
    assert state.current == f"phase 2 {d.chosen}"
    assert state.promotions == [{"phase": 2, "candidate": d.chosen, "step": chosen.step}]
    assert model.training  # the caller's mode is restored
    assert {"pass", "estimate", "review", "other"} <= set(out.parts)


def test_a_rejected_or_vetoed_candidate_leaves_the_reference(phase):
    model, tok, candidates = phase
    ref = get_adapter_state(model, REF)
    # a gain of 2 score ranges cannot be reached: the rule rejects for no gain
    strict = GateConfig(epsilon=2.0, delta=1e6, resamples=50)
    out = Promoter(GateJudge(tok, ITEMS, strict, gated=True, seed=7), phase=2).run(model,
                                                                                    candidates)
    assert not out.decision.accepted and out.decision.reason == NO_GAIN
    assert not out.promoted and out.candidate is None

    reviewed = []

    def veto(decision):
        reviewed.append(decision.chosen)
        return SimpleNamespace(veto=True, model_dump=lambda: {"reason": "regression"})

    state = ReferenceState()
    out = Promoter(GateJudge(tok, ITEMS, ACCEPTING, gated=True, seed=7), phase=2, state=state,
                   review=veto).run(model, candidates)
    assert out.decision.accepted and out.vetoed and not out.promoted
    assert out.verdict == {"reason": "regression"} and reviewed == [out.decision.chosen]
    assert _same(get_adapter_state(model, REF), ref) and state.promotions == []


def test_gated_off_the_final_policy_is_promoted_unreviewed(phase):
    """EvoDPO: the numbers are measured and recorded, the phase-final policy promoted, and
    no review is asked for (the inspector reviews an applied gate only)."""
    model, tok, candidates = phase
    asked = []
    strict = GateConfig(epsilon=2.0, resamples=50)
    out = Promoter(GateJudge(tok, ITEMS, strict, gated=False, seed=7), phase=1,
                   review=asked.append).run(model, candidates)
    assert out.decision.reason == DISABLED and not out.decision.enabled
    assert out.promoted and out.candidate == "final" and asked == []
    assert out.decision.items == 2  # measured all the same
    assert _same(get_adapter_state(model, REF), candidates[-1].state)


def test_thin_evidence_decides_nothing_and_measures_nothing(phase):
    model, tok, candidates = phase
    ref = get_adapter_state(model, REF)
    out = Promoter(GateJudge(tok, ITEMS, ACCEPTING, gated=True, seed=7, sufficient=False),
                   phase=1).run(model, candidates)
    assert out.decision.reason == INSUFFICIENT and not out.promoted
    assert "pass" not in out.parts  # no forward pass ran
    assert _same(get_adapter_state(model, REF), ref)


def test_deciding_without_promoting_leaves_ref_and_state(phase):
    """The gate bench's use: the decision only."""
    model, tok, candidates = phase
    ref, state = get_adapter_state(model, REF), ReferenceState()
    out = Promoter(GateJudge(tok, ITEMS, ACCEPTING, gated=True, seed=7), state=state,
                   promote_accepted=False).run(model, candidates)
    assert out.decision.accepted and out.candidate is None
    assert _same(get_adapter_state(model, REF), ref) and state == ReferenceState()
