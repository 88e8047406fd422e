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
    decide,
    promote,
    select_and_gate,
)
from atlas.dpo.evidence import hold_out_prompts
from atlas.dpo.gate import NO_ITEMS, offline_estimates
from atlas.dpo.scoring import (
    BASE,
    REFERENCE,
    GainEstimate,
    PolicySpec,
    gate_pass,
    importance_gain,
    lower_bound,
    mean_kl,
    normalised_scores,
)
from atlas.types import Evaluation, GateItem, Program


def token_kl(model, tokenizer, items: list[GateItem], candidate_state: PolicySpec,
             reference: PolicySpec, *, max_length: int = 768) -> float:
    """Eq. 3 through the gate's own pass: mean over items of the token-average KL(cand || ref)
    on the item's preferred completion (what ``select_and_gate`` computes per candidate)."""
    res = gate_pass(model, tokenizer, items, [candidate_state], kl_reference=reference,
                    need_scores=False, max_length=max_length)
    return mean_kl(res.kl[0])


def inspector_score(model, tokenizer, items: list[GateItem], policy: PolicySpec,
                    reference: PolicySpec = REFERENCE, *, gate: GateConfig | None = None,
                    seed: int = 0) -> GainEstimate:
    """S(policy), S(reference), the gain and its lower bound on G_k, as the gate computes them."""
    gate = GateConfig() if gate is None else gate
    res = gate_pass(model, tokenizer, items, [policy], kl_reference=reference, need_scores=True,
                    max_length=gate.max_length)
    return offline_estimates(res.sum_logps, res.ref_sum_logps, items, gate, seed)[0]

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


def brute_sums(model, tok, items, adapter_name: str | None) -> list[list[float]]:
    """Per item, per completion sequence log-prob, one position at a time."""
    out = []
    for item in items:
        row = []
        for comp_text in item.completions:
            logits, n_p, comp = brute_logits(model, tok, item.prompt, comp_text, adapter_name)
            row.append(sum(float(torch.log_softmax(logits[n_p + k - 1], -1)[t])
                           for k, t in enumerate(comp)))
        out.append(row)
    return out


def brute_score(model, tok, items, adapter_name: str | None) -> tuple[float, float]:
    """(S(policy adapter), S(ref adapter)) by the definition: per informative item, the
    likelihood-ratio-weighted mean of the scores normalised on G_k's range (gate.scale
    subset, the default: 0 = its worst, 1 = its best); mean over items."""
    pol, ref = brute_sums(model, tok, items, adapter_name), brute_sums(model, tok, items, REF)
    g_lo = min(x for item in items for x in item.scores)
    g_hi = max(x for item in items for x in item.scores)
    s_pol, s_ref = [], []
    for item, lp, lr in zip(items, pol, ref):
        if max(item.scores) == min(item.scores):
            continue
        u = [(x - g_lo) / (g_hi - g_lo) for x in item.scores]
        w = [math.exp(a - b) for a, b in zip(lp, lr)]
        s_pol.append(sum(wi * ui for wi, ui in zip(w, u)) / sum(w))
        s_ref.append(sum(u) / len(u))
    return sum(s_pol) / len(s_pol), sum(s_ref) / len(s_ref)


@pytest.mark.parametrize("reference", ["ref", "base", "state"])
def test_token_kl_equals_brute_force(reference):
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 1, 0.3))
    set_adapter_state(model, POLICY, random_state(model, 3, 0.1))
    cand = random_state(model, 2, 0.3)
    policy_before, ref_before = get_adapter_state(model, POLICY), get_adapter_state(model, REF)
    if reference == "state":  # a reference given as tensors, loaded for the pass only
        ref_arg = PolicySpec.of(get_adapter_state(model, REF))
        expected = brute_kl(model, tok, ITEMS, cand, REF)
    else:
        ref_arg = REFERENCE if reference == "ref" else BASE
        expected = brute_kl(model, tok, ITEMS, cand, REF if reference == "ref" else None)
    got = token_kl(model, tok, ITEMS, PolicySpec.of(cand), ref_arg)
    assert expected > 1e-3  # the policies really differ
    assert got == pytest.approx(expected, **KL_TOL)
    assert token_kl(model, tok, ITEMS, PolicySpec.of(cand), PolicySpec.of(cand)) == \
        pytest.approx(0.0, abs=1e-6)
    assert same(get_adapter_state(model, POLICY), policy_before)
    assert same(get_adapter_state(model, REF), ref_before)


def test_importance_gain_hand_numbers():
    items = [GateItem("p", ["a", "b"], [1.0, 0.0], "a"), GateItem("q", ["c"], [0.3], "c"),
             GateItem("r", ["d", "e", "f"], [2.0, 0.0, 1.0], "d")]
    # one unit for all of G_k (the default: 0 = its worst score 0.0, 1 = its best 2.0) or
    # each item's own range
    assert normalised_scores(items) == [[0.5, 0.0], None, [1.0, 0.0, 0.5]]
    assert normalised_scores(items, "item") == [[1.0, 0.0], None, [1.0, 0.0, 0.5]]
    with pytest.raises(ValueError, match="gate.scale"):
        normalised_scores(items, "phase")
    # item p: ratio 3:1 -> weights 0.75 / 0.25 -> S 0.375 vs S(ref) 0.25 (on G_k's scale);
    # item q carries no preference (one score) and is left out; item r: policy = reference
    logps = [[math.log(3.0) - 7.0, -7.0], [-1.0], [-2.0, -3.0, -4.0]]
    ref = [[-7.0, -7.0], [-9.0], [-2.0, -3.0, -4.0]]
    est = importance_gain(logps, ref, items)
    assert est.items == 2
    assert est.score == pytest.approx((0.375 + 0.5) / 2)
    assert est.ref_score == pytest.approx((0.25 + 0.5) / 2)
    assert est.gain == pytest.approx(0.0625)
    # on each item's own scale item p's difference counts in full: gain 0.125
    assert importance_gain(logps, ref, items, scale="item").gain == pytest.approx(0.125)
    # temperature 2 halves the log-ratio: weights sqrt(3):1
    hot = importance_gain([[math.log(3.0), 0.0]], [[0.0, 0.0]], items[:1], temperature=2.0)
    assert hot.gain == pytest.approx(math.sqrt(3) / (1 + math.sqrt(3)) - 0.5)
    none = importance_gain([[-1.0]], [[-2.0]], items[1:2])
    assert none.items == 0 and math.isnan(none.gain) and math.isnan(none.lower)


def test_near_tie_weighs_as_little_as_it_scores_on_the_subset_scale():
    # a failure (floor 0.0) against a valid program (1.0), and two valid programs 0.006 apart;
    # the policy moved the wrong way on the near-tie only
    items = [GateItem("p", ["ok", "fail"], [1.0, 0.0], "ok"),
             GateItem("q", ["a", "b"], [0.994, 1.0], "b")]
    logps, ref = [[0.0, -1.0], [0.0, -1.0]], [[0.0, 0.0], [0.0, 0.0]]
    per_item = importance_gain(logps, ref, items, scale="item")
    subset = importance_gain(logps, ref, items, scale="subset")
    assert per_item.gain == pytest.approx(0.0)  # the near-tie cancels the real preference
    assert subset.gain > 0.1  # the failure avoided is what counts


def test_bias_corrected_bound_undoes_the_bootstraps_shrinkage():
    # 3 completions: a resample with a repeated completion shrinks the re-weighting gain, so
    # most resamples fall below the estimate and the plain percentile bound sits far below it
    g = torch.Generator().manual_seed(1)
    est = 0.2
    resampled = est * torch.rand(1000, generator=g, dtype=torch.float64) ** 0.5
    pct = lower_bound(resampled, est, 0.9, "percentile")
    bc = lower_bound(resampled, est, 0.9, "bc")
    normal = lower_bound(resampled, est, 0.9, "normal")
    assert pct == pytest.approx(float(torch.quantile(resampled, 0.1)))
    assert pct < bc < est and normal == pytest.approx(est - 1.2816 * float(resampled.std()),
                                                      abs=1e-4)
    # centred replicates: bc is the percentile bound (z0 = 0)
    sym = torch.cat([est + torch.linspace(-0.1, 0.1, 1001, dtype=torch.float64)])
    assert lower_bound(sym, est, 0.9, "bc") == pytest.approx(lower_bound(sym, est, 0.9,
                                                                         "percentile"), abs=1e-3)
    with pytest.raises(ValueError, match="gate.bound"):
        lower_bound(sym, est, 0.9, "student")


def test_bc_falls_back_to_the_percentile_bound_on_a_thin_gate_subset():
    g = torch.Generator().manual_seed(2)
    items = [GateItem(str(k), [str(i) for i in range(4)], [0.0, 1.0, 2.0, 3.0], "0")
             for k in range(4)]
    ref = [[0.0] * 4 for _ in items]
    moved = [(0.3 * torch.randn(4, generator=g) + torch.tensor([-0.3, 0.0, 0.1, 0.3])).tolist()
             for _ in items]
    thin = importance_gain(moved, ref, items, seed=1)  # 16 completions < 32
    assert (thin.completions, thin.bound) == (16, "percentile")
    assert thin.lower == importance_gain(moved, ref, items, seed=1, bound="percentile").lower
    full = importance_gain(moved, ref, items, seed=1, bc_min_completions=16)
    assert full.bound == "bc" and full.lower > thin.lower  # BC lifts the shrunken bound
    assert (full.gain, full.se) == (thin.gain, thin.se)  # the same resamples


def test_importance_gain_bound_is_paired_seeded_and_below_the_gain():
    # 40 completions, half good half bad; the policy moved each by +-0.5 nats plus noise
    g = torch.Generator().manual_seed(0)
    scores = [1.0] * 20 + [0.0] * 20
    ref = torch.randn(40, generator=g).tolist()
    moved = [r + (0.5 if s else -0.5) + 0.3 * float(torch.randn(1, generator=g))
             for r, s in zip(ref, scores)]
    item = [GateItem("p", [str(i) for i in range(40)], scores, "0")]
    est = importance_gain([moved], [ref], item, confidence=0.9, resamples=2000, seed=3)
    assert est.gain > 0.1  # mass moved to the better half
    assert est.gain - 3 * est.se < est.lower < est.gain and 0 < est.se < 0.1
    assert importance_gain([moved], [ref], item, resamples=2000, seed=3) == est  # seeded
    wider = importance_gain([moved], [ref], item, confidence=0.99, resamples=2000, seed=3)
    assert wider.lower < est.lower
    # the reference against itself: every resample's gain is exactly 0 (paired resamples)
    same_est = importance_gain([ref], [ref], item, resamples=200)
    assert same_est.gain == 0.0 and abs(same_est.lower) < 1e-12 and same_est.se < 1e-12
    with pytest.raises(ValueError, match="gate.confidence"):
        importance_gain([ref], [ref], item, confidence=1.0)


def test_inspector_score_equals_brute_force():
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 4, 0.3))
    cand = random_state(model, 5, 0.3)
    set_adapter_state(model, POLICY, cand)
    exp_pol, exp_ref = brute_score(model, tok, ITEMS, POLICY)
    got = inspector_score(model, tok, ITEMS, PolicySpec.of(cand), REFERENCE)
    assert got.items == 2  # ITEMS[2] has one completion
    assert got.score == pytest.approx(exp_pol, **SCORE_TOL)
    assert got.ref_score == pytest.approx(exp_ref, **SCORE_TOL)
    assert abs(got.gain) > 1e-3  # the policies really differ
    assert inspector_score(model, tok, ITEMS, REFERENCE, REFERENCE).gain == \
        pytest.approx(0.0, abs=1e-9)


def test_policy_with_more_mass_on_the_better_completion_scores_higher():
    model, tok = tiny_peft()
    item = GateItem(prompt="def f():", completions=["    return 42", "    raise RuntimeError('x')"],
                    scores=[1.0, -1.0], preferred="    return 42")
    # move mass from the worse completion to the better one (a contrastive nudge)
    from atlas.dpo.batching import encode_texts
    from atlas.dpo.logprobs import sequence_logps

    params = [p for n, p in model.named_parameters() if f".{POLICY}." in n]
    opt = torch.optim.Adam(params, lr=2e-2)
    batch = encode_texts(tok, [item.prompt] * 2, item.completions, 64)
    ref_good, ref_bad = sequence_logps(model, batch, "sum").tolist()  # policy == ref here
    for _ in range(20):
        opt.zero_grad()
        good, bad = sequence_logps(model, batch, "mean")
        (bad - good).backward()
        opt.step()
    good, bad = sequence_logps(model, batch, "sum").tolist()
    trained = get_adapter_state(model, POLICY)
    after = inspector_score(model, tok, [item], PolicySpec.of(trained), REFERENCE)
    # S = sigmoid(log-ratio of good - log-ratio of bad) for normalised scores (1, 0)
    margin = (good - ref_good) - (bad - ref_bad)
    assert after.score == pytest.approx(1 / (1 + math.exp(-margin)), rel=1e-5)
    assert after.ref_score == 0.5 and after.gain > 0.15


# -- Eq. 4 and Eq. 5 on hand-made numbers -----------------------------------------------------
NAMES = ["step_2", "step_4", "final"]


def test_eq4_normalised_selection_and_eq5_tests_the_lower_bound():
    gate = GateConfig(epsilon=0.02, delta=0.05, lam=1.0)
    d = decide([0.5, 0.7, 0.6], [0.01, 0.2, 0.02], NAMES, ref_score=0.55, gate=gate,
               lowers=[-0.1, 0.1, 0.03], ses=[0.02, 0.03, 0.015])
    # gains -0.05, 0.15, 0.05; G = 0.15, K = 0.2: objectives -1/3 - 0.05, 1 - 1, 1/3 - 0.1
    assert d.gain_scale == pytest.approx(0.15) and d.kl_scale == pytest.approx(0.2)
    assert [c.objective for c in d.candidates] == pytest.approx([-1 / 3 - 0.05, 0.0, 1 / 3 - 0.1])
    assert (d.accepted, d.reason, d.chosen) == (True, "accepted", "final")
    assert d.gain == pytest.approx(0.05) and d.kl == pytest.approx(0.02)
    assert (d.lower_bound, d.se) == (0.03, 0.015)
    row = d.to_dict()["candidates"][2]
    assert (row["name"], row["lower"], row["se"]) == ("final", 0.03, 0.015)
    # the point gain 0.05 clears epsilon 0.04 but the bound 0.03 does not: rejected
    strict = decide([0.5, 0.7, 0.6], [0.01, 0.2, 0.02], NAMES, ref_score=0.55,
                    gate=GateConfig(epsilon=0.04, delta=0.05), lowers=[-0.1, 0.1, 0.03])
    assert (strict.accepted, strict.reason, strict.chosen) == (False, "rejected: no gain", "final")


def test_eq4_lambda_trades_gain_against_kl_on_equal_footing():
    # the largest gain and the largest KL each count 1: with lam 1 a snapshot with 60% of the
    # gain at 30% of the KL (objective 0.3) beats the final one (objective 0)
    scores, kls = [0.56, 0.6], [0.003, 0.01]
    d = decide(scores, kls, ["step_1", "final"], 0.5, GateConfig(epsilon=0.0, lam=1.0))
    assert d.chosen == "step_1"
    assert [c.objective for c in d.candidates] == pytest.approx([0.6 - 0.3, 0.0])
    # lam 0.5: the final one wins (1 - 0.5 = 0.5 > 0.6 - 0.15 = 0.45)
    assert decide(scores, kls, ["step_1", "final"], 0.5, GateConfig(lam=0.5)).chosen == "final"
    # scaling all KLs (or all gains) changes nothing: neither term dominates by its units
    scaled = decide(scores, [k * 1e-3 for k in kls], ["step_1", "final"], 0.5, GateConfig(lam=1.0))
    assert scaled.chosen == "step_1"
    assert [c.objective for c in scaled.candidates] == pytest.approx([0.3, 0.0])


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
    assert exact.gain == 0.25 and exact.lower_bound == 0.25 and exact.accepted
    both_fail = decide([0.1], [9.0], ["final"], ref_score=0.5, gate=GateConfig(delta=0.05))
    assert both_fail.reason == "rejected: no gain"
    nan_bound = decide([0.9], [0.0], ["final"], 0.5, GateConfig(), lowers=[math.nan])
    assert nan_bound.lower_bound == pytest.approx(0.4)  # no bound (on-line score): the gain


def test_gate_disabled_promotes_phase_final_and_records_numbers():
    gate = GateConfig(epsilon=0.0, delta=0.05, lam=1.0)
    d = decide([0.5, 0.7, 0.2], [0.01, 0.02, 3.0], NAMES, ref_score=0.9, gate=gate, enabled=False)
    assert (d.accepted, d.reason, d.chosen, d.argmax) == (True, "accepted: gate disabled", "final",
                                                          "step_4")
    assert d.gain == pytest.approx(-0.7) and d.kl == 3.0 and d.to_dict()["enabled"] is False


def test_gate_defaults_are_in_normalised_units():
    g = GateConfig()
    assert (g.epsilon, g.lam, g.confidence, g.holdout) == (0.01, 1.0, 0.9, 0.5)
    assert (g.scale, g.bound) == ("subset", "bc")
    with pytest.raises(ValueError, match="gate.holdout must be < 1"):
        GateConfig(holdout=1.0)
    with pytest.raises(ValueError, match="gate.confidence must be < 1"):
        GateConfig(confidence=1.0)


def _prog(i: int, prompt: str, passed: bool) -> Program:
    ev = Evaluation(score=-0.4 if passed else -math.inf, passed=passed)
    return Program(id=i, island=0, round=0, code="x", evaluation=ev, prompt=prompt,
                   completion=f"c{i}")


def test_hold_out_prompts_leaves_dk_prompts_and_prefers_informative_ones():
    gate = GateConfig(holdout=0.25, subset_size=8)
    # 8 prompts: p0..p5 informative (a pass and a fail), p6 all passed, p7 one completion
    progs, i = [], 0
    for k in range(8):
        kinds = [True, False] if k < 6 else ([True, True] if k == 6 else [True])
        for ok in kinds:
            progs.append(_prog(i, f"p{k}", ok))
            i += 1
    held = hold_out_prompts(progs, gate, seed=1)
    assert len(held) == 2 and set(held) <= {f"p{k}" for k in range(6)}
    assert hold_out_prompts(progs, gate, seed=1) == held  # deterministic (resume-exact)
    assert len({frozenset(hold_out_prompts(progs, gate, seed=s)) for s in range(10)}) > 1
    assert len(hold_out_prompts(progs, GateConfig(holdout=0.25, subset_size=1), 1)) == 1
    # two prompts: one held out, one left for D_k; one prompt: nothing can be held out
    assert len(hold_out_prompts(progs[:4], gate, seed=0)) == 1
    assert hold_out_prompts(progs[:2], gate, seed=0) == []
    assert len(hold_out_prompts(progs, GateConfig(holdout=0.99), 0)) == 7  # D_k keeps one


# -- the whole gate on a model ----------------------------------------------------------------
def test_select_and_gate_on_model_matches_parts_and_restores_adapters():
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 1, 0.2))
    ref = get_adapter_state(model, REF)
    final = {k: v + 0.02 * torch.randn_like(v) for k, v in ref.items()}
    set_adapter_state(model, POLICY, final)
    cands = [PolicyCandidate("step_1", {k: v + 0.3 * torch.randn_like(v) for k, v in ref.items()}, 1),
             PolicyCandidate("final", final, 2)]
    gate = GateConfig(epsilon=-10.0, delta=1e-2, lam=1.0)
    d = select_and_gate(model, tok, cands, ITEMS, gate)
    kls = [token_kl(model, tok, ITEMS, PolicySpec.of(c.state), REFERENCE) for c in cands]
    est = [inspector_score(model, tok, ITEMS, PolicySpec.of(c.state), REFERENCE, gate=gate)
           for c in cands]
    scores = [e.score for e in est]
    assert [c.kl for c in d.candidates] == pytest.approx(kls, **KL_TOL)
    assert [c.score for c in d.candidates] == pytest.approx(scores, **SCORE_TOL)
    assert [c.lower for c in d.candidates] == pytest.approx([e.lower for e in est], abs=1e-6)
    assert d.ref_score == pytest.approx(est[0].ref_score, **SCORE_TOL) and d.items == 2
    assert kls[0] > gate.delta > kls[1]  # the far candidate breaks the trust region
    expected = decide(scores, kls, ["step_1", "final"], d.ref_score, gate,
                      lowers=[e.lower for e in est])
    assert (d.chosen, d.reason) == (expected.chosen, expected.reason)
    assert same(get_adapter_state(model, POLICY), final) and same(get_adapter_state(model, REF), ref)
    assert model.active_adapter == POLICY

    off = select_and_gate(model, tok, cands, ITEMS, GateConfig(delta=0.0), enabled=False)
    assert off.accepted and off.reason == "accepted: gate disabled" and off.chosen == "final"
    assert off.kl == pytest.approx(kls[1], **KL_TOL)


def test_promote_copies_the_decision_s_chosen_candidate():
    model, _ = tiny_peft()
    state = random_state(model, 6, 0.1)
    cands = [PolicyCandidate("step_1", random_state(model, 7, 0.1), 1),
             PolicyCandidate("final", state, 2)]
    accepted = decide([0.2, 0.3], [0.0, 0.0], ["step_1", "final"], 0.1, GateConfig())
    assert accepted.chosen == "final" and accepted.promoted_state(cands) is state
    rejected = GateDecision(False, "rejected: no gain", "final", -1.0, 0.0)
    assert rejected.promoted_state(cands) is None
    with pytest.raises(KeyError, match="chosen candidate 'final'"):
        accepted.promoted_state(cands[:1])

    promote(model, state)
    kept = {k: v.clone() for k, v in state.items()}
    for v in state.values():
        v.add_(1.0)  # the caller mutating its tensors must not move the reference
    assert same(get_adapter_state(model, REF), kept)


def test_gate_rejects_bad_input_with_field_names():
    model, tok = tiny_peft()
    final = [PolicyCandidate("final", get_adapter_state(model, POLICY), 1)]
    with pytest.raises(ValueError, match=r"items\[0\]: 2 completions but 1 scores"):
        inspector_score(model, tok, [GateItem("p", ["a", "b"], [1.0], "a")], REFERENCE)
    with pytest.raises(ValueError, match=r"items\[0\]\.scores holds -inf"):
        inspector_score(model, tok, [GateItem("p", ["a"], [-math.inf], "a")], REFERENCE)
    nothing = select_and_gate(model, tok, final, [], GateConfig())  # no held-out prompt
    assert (nothing.accepted, nothing.reason) == (False, NO_ITEMS)
    assert select_and_gate(model, tok, final, [], GateConfig(), enabled=False).accepted
    with pytest.raises(ValueError, match="C_k is empty"):
        select_and_gate(model, tok, [], ITEMS, GateConfig())
    with pytest.raises(ValueError, match="gate.score_mode=online needs online_score"):
        select_and_gate(model, tok, final, ITEMS, GateConfig(score_mode="online"))
    with pytest.raises(TypeError, match="reference must be a PolicySpec"):
        token_kl(model, tok, ITEMS, PolicySpec.of(final[0].state), "ref")
    with pytest.raises(TypeError, match="an adapter state must map names to tensors"):
        PolicySpec.of({})
    with pytest.raises(TypeError, match="promote needs"):
        promote(model, {})


def test_gate_pass_is_bit_identical_with_packed_weights_and_duplicate_completions(monkeypatch):
    """The gate's two savings change no number: identical completions run once and are
    copied back, and on a CPU in bf16 the frozen base weights run pre-packed while peft's
    LoRA terms stay as they are (a bf16-rounded merged weight would blur the ratios)."""
    from atlas.agent import fastlinear
    from atlas.dpo import scoring

    model, tok = tiny_peft()
    model.to(torch.bfloat16)
    cand = {k: v.to(torch.bfloat16) for k, v in random_state(model, 1, 0.05).items()}
    base = ITEMS[:2]
    twice = [GateItem(it.prompt, list(it.completions) + list(it.completions[:1]),
                      list(it.scores) + list(it.scores[:1]), it.preferred) for it in base]
    calls = []
    real = fastlinear.packed_linears

    def spy(m, enabled=True, merge_lora=True):
        calls.append(merge_lora)
        return real(m, enabled=enabled, merge_lora=merge_lora)

    monkeypatch.setattr(scoring, "packed_linears", spy)
    fast = scoring.gate_pass(model, tok, twice, [PolicySpec.of(cand)], kl_reference=REFERENCE)
    assert calls == [False]  # the base weights only: LoRA is never merged for the gate
    monkeypatch.setattr(scoring, "packed_linears",
                        lambda m, enabled=True, merge_lora=True: real(m, enabled=False))
    plain = scoring.gate_pass(model, tok, base, [PolicySpec.of(cand)], kl_reference=REFERENCE)
    if fastlinear.packing_supported():
        with torch.no_grad(), real(model, merge_lora=False) as active:
            assert active
    for i, it in enumerate(base):
        n = len(it.completions)
        assert fast.sum_logps[0][i][:n] == plain.sum_logps[0][i]  # bit for bit
        assert fast.ref_sum_logps[i][:n] == plain.ref_sum_logps[i]
        assert fast.sum_logps[0][i][n] == plain.sum_logps[0][i][0]  # the duplicate, copied
        assert fast.mean_logps[0][i][:n] == plain.mean_logps[0][i]
    assert fast.kl == plain.kl
    assert all(math.isfinite(x) for row in fast.sum_logps[0] for x in row)


def test_the_padded_gate_pass_gives_the_row_pass_s_numbers():
    """``gate.padded``: an item's completions in one padded batch after its prompt give the
    per-completion log-probs and the KL on the preferred completion of the row pass (float32,
    within rounding), and a gate on either path decides the same."""
    model, tok = tiny_peft()
    set_adapter_state(model, REF, random_state(model, 3, 0.05))
    cand = PolicySpec.of(random_state(model, 1, 0.05))
    rows = gate_pass(model, tok, ITEMS, [cand], kl_reference=REFERENCE, padded=False)
    padded = gate_pass(model, tok, ITEMS, [cand], kl_reference=REFERENCE, padded=True)
    for a, b in ((padded.sum_logps[0], rows.sum_logps[0]), (padded.mean_logps[0], rows.mean_logps[0]),
                 (padded.ref_sum_logps, rows.ref_sum_logps)):
        for x, y in zip(a, b):
            assert x == pytest.approx(y, rel=1e-5, abs=1e-5)
    assert padded.kl[0] == pytest.approx(rows.kl[0], **KL_TOL)
    assert [len(x) for x in rows.sum_logps[0]] == [3, 2, 1]
    assert len(set(rows.sum_logps[0][0])) == 3  # distinct completions, distinct numbers
    cands = [PolicyCandidate("final", random_state(model, 1, 0.05), 1)]
    decisions = [select_and_gate(model, tok, cands, ITEMS, GateConfig(padded=p)) for p in (False, True)]
    assert decisions[0].accepted == decisions[1].accepted
    assert decisions[0].lower_bound == pytest.approx(decisions[1].lower_bound, abs=1e-6)
    assert decisions[0].gain == pytest.approx(decisions[1].gain, abs=1e-6)
    assert decisions[0].items == decisions[1].items > 0
