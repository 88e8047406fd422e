"""The Policy Inspector gate: Eq. 3 KL (against brute force), inspector score, Eq. 4 and Eq. 5."""

from __future__ import annotations

import math

import pytest
import torch

from atlas.agent.adapters import POLICY, REF, attach_adapters, get_adapter_state, set_adapter_state
from atlas.agent.tiny import build_tiny_model
from atlas.dpo import (
    GateConfig,
    GateDecision,
    PolicyCandidate,
    ReferenceSwapCallback,
    decide,
    inspector_score,
    promote,
    select_and_gate,
    token_kl,
)
from atlas.dpo.scoring import weighted_score
from atlas.types import GateItem

ITEMS = [
    GateItem(prompt="# bandit\ndef act(x):\n", completions=["    return 0\n", "    return argmax(x)\n",
                                                           "oops"],
             scores=[-0.6, -0.2, -5.0], preferred="    return argmax(x)\n"),
    GateItem(prompt="# pinn weights\n", completions=["w = 1.0", "w = [1, 10, 100]  # ic heavy"],
             scores=[-1.0, -0.5], preferred="w = [1, 10, 100]  # ic heavy"),
    GateItem(prompt="a longer prompt so rows need padding ...", completions=["x"], scores=[0.0],
             preferred="a preferred text not among the completions"),
]


def tiny_peft(seed: int = 0):
    model, tok = build_tiny_model(seed=seed)
    torch.manual_seed(seed)
    return attach_adapters(model, r=4, alpha=8), tok


def random_state(model, seed: int, scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * scale
            for k, v in get_adapter_state(model, POLICY).items()}


# Tolerances for one number computed along two code paths (batched vs one sequence, packed vs
# plain): they must hold on every CPU's float32 kernels, not only the one a test was written on.
# A token's KL sums p * (log p - log q) over the vocabulary, each log near log(V) ~ 5.5 for the
# tiny model's bytes, so rounding alone moves it by ~ eps32 * log(V) ~ 7e-7 in absolute terms:
# relative checks fail for KLs near zero (2e-4 differed by 3.8e-5 relative on an AVX2 CPU).
KL_TOL = {"rel": 1e-4, "abs": 1e-6}
SCORE_TOL = {"rel": 1e-5, "abs": 1e-7}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- an independent brute force: one sequence at a time, explicit loop over positions ----------
def brute_logits(model, tok, prompt: str, completion: str, adapter_name: str | None):
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([p + c])
    with torch.no_grad():
        if adapter_name is None:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0].double()
        else:
            model.set_adapter(adapter_name)
            logits = model(input_ids=ids).logits[0].double()
            model.set_adapter(POLICY)
    return logits, len(p), c


def brute_kl(model, tok, items, cand: dict, ref_adapter: str | None) -> float:
    keep = get_adapter_state(model, POLICY)
    set_adapter_state(model, POLICY, cand)
    per_pair = []
    for item in items:
        lc, n_p, comp = brute_logits(model, tok, item.prompt, item.preferred, POLICY)
        lr, _, _ = brute_logits(model, tok, item.prompt, item.preferred, ref_adapter)
        total = 0.0
        for k in range(len(comp)):
            pos = n_p + k - 1  # the logits that predict completion token k
            pc = torch.softmax(lc[pos], -1)
            pr = torch.softmax(lr[pos], -1)
            total += float((pc * (torch.log(pc) - torch.log(pr))).sum())  # full vocabulary
        per_pair.append(total / len(comp))
    set_adapter_state(model, POLICY, keep)
    return sum(per_pair) / len(per_pair)


def brute_score(model, tok, items, adapter_name: str | None) -> float:
    per_item = []
    for item in items:
        means = []
        for comp_text in item.completions:
            logits, n_p, comp = brute_logits(model, tok, item.prompt, comp_text, adapter_name)
            lp = [float(torch.log_softmax(logits[n_p + k - 1], -1)[t]) for k, t in enumerate(comp)]
            means.append(sum(lp) / len(lp))
        z = [math.exp(m - max(means)) for m in means]
        per_item.append(sum(w * s for w, s in zip(z, item.scores)) / sum(z))
    return sum(per_item) / len(per_item)


@pytest.mark.parametrize("reference", ["ref", "fixed", "state"])
def test_token_kl_equals_brute_force(reference):
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 1, 0.3))
    set_adapter_state(model, POLICY, random_state(model, 3, 0.1))
    cand = random_state(model, 2, 0.3)
    policy_before, ref_before = get_adapter_state(model, POLICY), get_adapter_state(model, REF)
    if reference == "state":  # a reference given as tensors, loaded for the pass only
        ref_arg, expected = get_adapter_state(model, REF), brute_kl(model, tok, ITEMS, cand, REF)
    else:
        ref_arg = reference
        expected = brute_kl(model, tok, ITEMS, cand, REF if reference == "ref" else None)
    got = token_kl(model, tok, ITEMS, cand, ref_arg, batch_size=2)
    assert expected > 1e-3  # the policies really differ
    assert got == pytest.approx(expected, **KL_TOL)
    assert token_kl(model, tok, ITEMS, cand, cand, batch_size=3) == pytest.approx(0.0, abs=1e-6)
    assert same(get_adapter_state(model, POLICY), policy_before)
    assert same(get_adapter_state(model, REF), ref_before)


def test_inspector_score_hand_numbers_and_brute_force():
    items = [GateItem("p", ["a", "b"], [1.0, 0.0], "a"), GateItem("q", ["c"], [0.3], "c")]
    w = 1 / (1 + math.exp(-1))  # softmax([-1, -2])[0]
    assert weighted_score([[-1.0, -2.0], [-4.0]], items) == pytest.approx((w + 0.3) / 2)
    assert weighted_score([[-1.0, -2.0], [-4.0]], items, temperature=1e-6) == pytest.approx(0.65)

    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 4, 0.3))
    got = inspector_score(model, tok, ITEMS, "ref", batch_size=2)
    assert got == pytest.approx(brute_score(model, tok, ITEMS, REF), **SCORE_TOL)
    got_fixed = inspector_score(model, tok, ITEMS, "fixed")
    assert got_fixed == pytest.approx(brute_score(model, tok, ITEMS, None), **SCORE_TOL)


def test_policy_with_more_mass_on_the_better_completion_scores_higher():
    model, tok = tiny_peft()
    item = GateItem(prompt="def f():", completions=["    return 42", "    raise RuntimeError('x')"],
                    scores=[1.0, -1.0], preferred="    return 42")
    before = inspector_score(model, tok, [item], "policy")
    # move per-token mass from the worse completion to the better one (a contrastive nudge)
    from atlas.dpo.batching import encode_texts
    from atlas.dpo.logprobs import sequence_logps

    params = [p for n, p in model.named_parameters() if f".{POLICY}." in n]
    opt = torch.optim.Adam(params, lr=2e-2)
    batch = encode_texts(tok, [item.prompt] * 2, item.completions, 64)
    for _ in range(20):
        opt.zero_grad()
        good, bad = sequence_logps(model, batch, "mean")
        (bad - good).backward()
        opt.step()
    good, bad = sequence_logps(model, batch, "mean").tolist()
    trained = get_adapter_state(model, POLICY)
    after = inspector_score(model, tok, [item], trained)
    # S = 2 * sigmoid(good - bad) - 1 for scores (1, -1)
    assert after == pytest.approx(2 / (1 + math.exp(bad - good)) - 1, rel=1e-5)
    assert after > before + 0.15
    assert inspector_score(model, tok, [item], "ref") == pytest.approx(before, abs=1e-6)


# -- Eq. 4 and Eq. 5 on hand-made numbers -----------------------------------------------------
NAMES = ["step_2", "step_4", "final"]


def test_eq4_selection_and_eq5_accept():
    gate = GateConfig(epsilon=0.0, delta=0.05, lam=1.0)
    d = decide([0.5, 0.7, 0.6], [0.01, 0.2, 0.02], NAMES, ref_score=0.55, gate=gate)
    # objectives 0.49, 0.50, 0.58 -> final
    assert [c["objective"] for c in d.candidates] == pytest.approx([0.49, 0.5, 0.58])
    assert (d.accepted, d.reason, d.chosen) == (True, "accepted", "final")
    assert d.gain == pytest.approx(0.05) and d.kl == pytest.approx(0.02)


def test_eq5_rejects_kl_too_large():
    gate = GateConfig(epsilon=0.0, delta=0.05, lam=0.0)  # lam 0: c* = the best score, step_4
    d = decide([0.5, 0.7, 0.6], [0.01, 0.2, 0.02], NAMES, ref_score=0.55, gate=gate)
    assert (d.accepted, d.reason, d.chosen) == (False, "rejected: KL too large", "step_4")
    assert d.promoted_state([]) is None


def test_eq5_rejects_no_gain_and_epsilon_boundary():
    gate = GateConfig(epsilon=0.1, delta=1.0, lam=1.0)
    d = decide([0.5, 0.7, 0.6], [0.01, 0.2, 0.02], NAMES, ref_score=0.55, gate=gate)
    assert (d.accepted, d.reason, d.chosen) == (False, "rejected: no gain", "final")
    exact = decide([0.5, 0.625, 0.75], [0.0, 0.0, 0.0], NAMES, ref_score=0.5,
                   gate=GateConfig(epsilon=0.25, delta=0.0, lam=1.0))  # exact in binary
    assert exact.gain == 0.25 and exact.accepted  # gain == epsilon and KL == delta are enough
    both_fail = decide([0.1], [9.0], ["final"], ref_score=0.5, gate=GateConfig(delta=0.05))
    assert both_fail.reason == "rejected: no gain"


def test_gate_disabled_promotes_phase_final_and_records_numbers():
    gate = GateConfig(epsilon=0.0, delta=0.05, lam=1.0)
    d = decide([0.5, 0.7, 0.2], [0.01, 0.02, 3.0], NAMES, ref_score=0.9, gate=gate, enabled=False)
    assert (d.accepted, d.reason, d.chosen, d.argmax) == (True, "accepted: gate disabled", "final",
                                                          "step_4")
    assert d.gain == pytest.approx(-0.7) and d.kl == 3.0 and d.to_dict()["enabled"] is False


# -- the whole gate on a model ----------------------------------------------------------------
def test_select_and_gate_on_model_matches_parts_and_restores_adapters():
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 1, 0.2))
    ref = get_adapter_state(model, REF)
    final = {k: v + 0.02 * torch.randn_like(v) for k, v in ref.items()}
    set_adapter_state(model, POLICY, final)
    cands = [PolicyCandidate("step_1", {k: v + 0.3 * torch.randn_like(v) for k, v in ref.items()}, 1),
             PolicyCandidate("final", final, 2)]
    gate = GateConfig(epsilon=-10.0, delta=1e-2, lam=1.0, batch_size=2)
    d = select_and_gate(model, tok, cands, ITEMS, gate)
    kls = [token_kl(model, tok, ITEMS, c.state, "ref") for c in cands]
    scores = [inspector_score(model, tok, ITEMS, c.state) for c in cands]
    assert [c["kl"] for c in d.candidates] == pytest.approx(kls, **KL_TOL)
    assert [c["score"] for c in d.candidates] == pytest.approx(scores, **SCORE_TOL)
    assert d.ref_score == pytest.approx(inspector_score(model, tok, ITEMS, "ref"), **SCORE_TOL)
    assert kls[0] > gate.delta > kls[1]  # the far candidate breaks the trust region
    expected = decide(scores, kls, ["step_1", "final"], d.ref_score, gate)
    assert (d.chosen, d.reason) == (expected.chosen, expected.reason)
    assert same(get_adapter_state(model, POLICY), final) and same(get_adapter_state(model, REF), ref)
    assert model.active_adapter == POLICY

    off = select_and_gate(model, tok, cands, ITEMS, GateConfig(delta=0.0), enabled=False)
    assert off.accepted and off.reason == "accepted: gate disabled" and off.chosen == "final"
    assert off.kl == pytest.approx(kls[1], **KL_TOL)


def test_promote_copies_and_decision_feeds_the_swap_callback():
    model, _ = tiny_peft()
    state = random_state(model, 6, 0.1)
    cands = [PolicyCandidate("step_1", random_state(model, 7, 0.1), 1),
             PolicyCandidate("final", state, 2)]
    accepted = decide([0.2, 0.3], [0.0, 0.0], ["step_1", "final"], 0.1, GateConfig())
    assert accepted.promoted_state(cands) is state
    cb = ReferenceSwapCallback()
    assert cb.queue_decision(accepted, cands) and cb.pending_name == "final"
    assert same(cb.pending, state)
    rejected = GateDecision(False, "rejected: no gain", "final", -1.0, 0.0)
    assert not ReferenceSwapCallback().queue_decision(rejected, cands)

    promote(model, state)
    kept = {k: v.clone() for k, v in state.items()}
    for v in state.values():
        v.add_(1.0)  # the caller mutating its tensors must not move the reference
    assert same(get_adapter_state(model, REF), kept)


def test_gate_rejects_bad_input_with_field_names():
    model, tok = tiny_peft()
    final = [PolicyCandidate("final", get_adapter_state(model, POLICY), 1)]
    with pytest.raises(ValueError, match=r"items\[0\]: 2 completions but 1 scores"):
        inspector_score(model, tok, [GateItem("p", ["a", "b"], [1.0], "a")], "ref")
    with pytest.raises(ValueError, match=r"items\[0\]\.scores holds -inf"):
        inspector_score(model, tok, [GateItem("p", ["a"], [-math.inf], "a")], "ref")
    with pytest.raises(ValueError, match="items: the gate needs"):
        select_and_gate(model, tok, final, [], GateConfig())
    with pytest.raises(ValueError, match="C_k is empty"):
        select_and_gate(model, tok, [], ITEMS, GateConfig())
    with pytest.raises(ValueError, match="gate.score_mode=online needs online_score"):
        select_and_gate(model, tok, final, ITEMS, GateConfig(score_mode="online"))
    with pytest.raises(ValueError, match="reference must be one of"):
        token_kl(model, tok, ITEMS, final[0].state, "base")
    with pytest.raises(TypeError, match="promote needs"):
        promote(model, {})
