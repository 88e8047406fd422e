"""The learning probe and the two controls.

The probe runs with the real tiny agent (its programs are noise, so what is checked is the
mechanism: prompts D_k and G_k never held, the same seeds before and after, nothing filed,
the movement measured) on a toy task scored in a thread pool; the controls run end to end
through ``python -m atlas.train``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atlas.agent.adapters import POLICY, adds_nothing, get_adapter_state
from atlas.agent.research_agent import ResearchAgent
from atlas.dpo import DPOConfig, GateConfig
from atlas.dpo.heldout import HeldOutPair, comparable_pairs, measure
from atlas.dpo.scoring import BASE, PolicySpec
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.explorer import Explorer
from atlas.evolution.literals import LiteralSearch, mutate, tunable_literals
from atlas.evolution.prompts import build_prompt
from atlas.fine_tuning import FineTuner, PhaseSettings
from atlas.probe import LearningProbe, choose_prompts, prompt_hash, without_note
from atlas.schema import MethodConfig, ProbeConfig
from atlas.types import Evaluation, Program
from tests.conftest import ROOT, explore_settings, model_settings
from tests.test_evolution_explorer import ThreadSandbox, ToyTask

EVOTUNE = MethodConfig.from_cfg({"name": "evotune", "reference": "fixed", "gate": False,
                                 "supporters": False, "skip_without_improvement": False})
EVODPO = MethodConfig.from_cfg({"name": "evodpo", "reference": "adaptive", "gate": False,
                                "supporters": False, "skip_without_improvement": False})
DPO = DPOConfig(lr=1e-2, epochs=1, batch_size=2, max_length=128, checkpoints=0)
GATE = GateConfig(subset_size=4, min_completions=2)
PROBE = ProbeConfig(enabled=True, prompts=2, samples=3, temperature=0.8)
BODIES = [("    return 3\n", -0.0), ("    return 1\n", -0.5), ("    return xs[9]\n", None)]


@pytest.fixture(scope="module")
def agent() -> ResearchAgent:
    return ResearchAgent(model_settings(), seed=0)


def world(agent: ResearchAgent) -> tuple[Explorer, ProgramDatabase, list[Program]]:
    """An explorer over the toy task with the real tiny agent, and one phase's programs:
    three prompts (two islands' rounds), each with a better, a worse and a failed completion,
    filed in the database as a round files them."""
    settings = explore_settings(islands=3, islands_per_round=1, samples_per_prompt=3,
                                max_new_tokens=24, temperatures=[0.7, 0.8, 0.9])
    db = ProgramDatabase(settings, seed=0)
    explorer = Explorer(ToyTask(), agent, ThreadSandbox(), db, settings, seed=5)
    explorer.seed_islands(0)
    programs, pid = [], len(db)
    for r in (1, 2, 3):
        island = explorer.islands_for_round(r)[0]
        prompt = explorer.island_prompt(island)
        for body, score in BODIES:
            # each round's programs are new code (the same code again would be a copy,
            # which D_k never chooses), with the scores of BODIES
            body = body.replace("return ", f"return {r} - {r} + ").replace("xs[9]", f"xs[{8 + r}]")
            ev = (Evaluation(score=score, passed=True) if score is not None else
                  Evaluation.failure("exception", "IndexError"))
            p = Program(id=pid, island=island, round=r, code="def pick(xs):\n" + body,
                        evaluation=ev, prompt=prompt, completion=body, phase=1)
            db.add(p)
            programs.append(p)
            pid += 1
    return explorer, db, programs


def test_probe_prompts_are_never_prompts_the_phase_sampled(agent):
    explorer, db, programs = world(agent)
    sampled = {p.prompt for p in programs}
    chosen = choose_prompts(explorer, programs, 3, next_round=4, seed=1)
    assert len(chosen) == 3 and len({c.text for c in chosen}) == 3
    assert not sampled & {c.text for c in chosen}
    # parents the phase did not write come first: here the seeds, one prompt of them
    assert chosen[0].overlap == 0 and all(c.overlap > 0 for c in chosen[1:])
    # a phase that sampled every island's next prompt leaves only random parent sets
    every = programs + [Program(id=100 + i, island=i, round=3, code="", prompt=text,
                                evaluation=Evaluation.failure("exception", "x"), phase=1)
                        for i, text in enumerate(explorer.island_prompt(i) for i in range(3))]
    assert {c.where for c in choose_prompts(explorer, every, 2, 4, seed=1)} == {
        "random parents"}


def test_a_phase_prompt_with_a_reviewer_note_is_recognised_by_its_parents_and_its_text(agent):
    """B2: ATLAS's prompts carry the exploration supporter's note; the probe's never do, so an
    exact text match let a training prompt through as "held out"."""
    explorer, db, programs = world(agent)
    island = explorer.islands_for_round(4)[0]
    parents = explorer.parents_for(island)
    with_note = explorer.agent.chat_prompt(*build_prompt(
        explorer.spec, parents, "Try a sliding window.", explorer.settings.prompt_form))
    plain = explorer.island_prompt(island)
    assert with_note != plain and without_note(with_note) == without_note(plain)
    trained = [Program(id=200, island=island, round=3, code="def pick(xs):\n    return 2\n",
                       evaluation=Evaluation(score=-0.25, passed=True), prompt=with_note,
                       completion="    return 2\n", parents=[p.id for p in parents], phase=1)]
    for phase_programs in (trained, [dataclasses.replace(trained[0], parents=[])]):
        chosen = choose_prompts(explorer, programs + phase_programs, 3, next_round=4, seed=1)
        assert plain not in {c.text for c in chosen}


def test_probe_samples_with_the_same_seeds_before_and_after_and_files_nothing(agent):
    explorer, db, programs = world(agent)
    size = len(db)
    probe = LearningProbe.for_phase(PROBE, explorer, programs, seed=11)
    probe.before()
    probe.after()  # the policy did not change: the same random numbers, the same programs
    before, after = probe.sides["before"].flat(), probe.sides["after"].flat()
    assert len(before) == PROBE.prompts * PROBE.samples
    assert [a.completion for a in before] == [a.completion for a in after]
    assert len({a.completion for a in before}) > 1  # sampled, not one repeated text
    record = probe.record(agent.model, agent.tokenizer, reference_state=None, beta=0.1,
                          max_length=128)
    assert len(db) == size  # filed nowhere
    assert record["change"]["valid_rate"]["mean"] == 0.0
    assert record["change"]["score"]["mean"] == 0.0
    assert record["kl_base"] == pytest.approx(0.0, abs=1e-6)
    assert record["kl_tokens"] > 0
    assert set(record["seconds"]) == {"before", "after", "measure", "total"}


def test_the_after_side_reuses_a_passing_evaluation_of_the_same_code_and_runs_the_rest():
    """What the policy writes again, as it did before the phase, is not scored again when it
    passed (the sandbox scores code deterministically on one context); failures run again."""
    from tests.test_evolution_explorer import make

    explorer, agent, sandbox, db = make()
    explorer.seed_islands(0)
    programs = explorer.run_round(1, 1)
    probe = LearningProbe.for_phase(PROBE, explorer, programs, seed=3)
    probe.before()
    first = len(sandbox.submitted)
    probe.after()
    again = sandbox.submitted[first:]
    before = probe.sides["before"].flat()
    passed = {a.code for a in before if a.evaluation.passed}
    assert passed and not passed & set(again)
    assert len(again) == sum(1 for a in before if a.code and not a.evaluation.passed)
    after = probe.sides["after"].flat()
    assert [a.evaluation.score for a in after] == [a.evaluation.score for a in before]
    assert all(a.evaluation.seconds == 0.0 for a in after if a.code in passed)


def test_a_trained_phase_records_its_probe_on_prompts_outside_dk_and_gk(agent):
    for method in (EVOTUNE, EVODPO):
        explorer, db, programs = world(agent)
        size = len(db)
        # three epochs: the probe's prompts show parents the phase did not write (the seeds),
        # so one epoch at lr 1e-2 moves the tiny policy there by under the 1e-6 below
        dpo = dataclasses.replace(DPO, epochs=3)
        tuner = FineTuner(agent, PhaseSettings(method, dpo, GATE, PROBE), seed=0, explorer=explorer)
        record = tuner.run_phase(1, programs, best_before=-5.0, db=db)
        assert record.trained and record.probe is not None and len(db) == size
        assert record.probe["parents_from_phase"][0] == 0
        probe = record.probe
        assert probe["prompts"] == 2 and len(probe["slots"]) == 6
        hashes = set(probe["prompt_hashes"])
        assert not hashes & set(record.dk_prompt_hashes)
        assert not hashes & set(record.gk_prompt_hashes)
        assert not hashes & {prompt_hash(p.prompt) for p in programs}
        # lr 1e-2 moves the tiny policy: a positive KL to the base; EvoTune's reference is it
        assert probe["kl_base"] > 1e-6
        if method is EVOTUNE:
            assert probe["kl_reference"] == probe["kl_base"]
        assert record.seconds_probe == pytest.approx(probe["seconds"]["total"])
        event = record.to_event()
        assert event["probe"] is probe and list(event)[-1] == "seconds"


def test_a_fine_tuner_without_probe_settings_records_none(agent):
    explorer, db, programs = world(agent)
    off = ProbeConfig(enabled=False, prompts=2, samples=3, temperature=0.8)
    tuner = FineTuner(agent, PhaseSettings(EVOTUNE, DPO, GATE, off), seed=0, explorer=explorer)
    record = tuner.run_phase(1, programs, best_before=-5.0, db=db)
    assert record.trained and record.probe is None and "probe" not in record.to_event()


def test_movement_is_zero_for_the_same_policy_and_margins_follow_the_log_ratios(agent):
    groups = [("def pick(xs):\n", ["    return 3\n", "    return 1\n"])]
    # an adapter whose B matrices are zero is the base model itself
    untrained = {k: torch.zeros_like(v) if "lora_B" in k else v
                 for k, v in get_adapter_state(agent.model, POLICY).items()}
    same = measure(agent.model, agent.tokenizer, groups, policy=PolicySpec.of(untrained),
                   reference=BASE, base=BASE)
    assert same.mean_kl_base == pytest.approx(0.0, abs=1e-6)
    assert same.margins([HeldOutPair(0, 0, 1)], beta=0.1) == [pytest.approx(0.0, abs=1e-6)]
    g = torch.Generator().manual_seed(0)
    moved_state = {k: torch.randn(v.shape, generator=g) * 0.05
                   for k, v in get_adapter_state(agent.model, POLICY).items()}
    moved = measure(agent.model, agent.tokenizer, groups, policy=PolicySpec.of(moved_state),
                    reference=BASE, base=BASE)
    assert moved.mean_kl_base > 1e-4 and moved.tokens == same.tokens
    # a margin is beta times the difference of the two completions' log-ratios
    (m,) = moved.margins([HeldOutPair(0, 0, 1)], beta=0.5)
    pol, ref = moved.policy_logps[0], moved.reference_logps[0]
    assert m == pytest.approx(0.5 * ((pol[0] - ref[0]) - (pol[1] - ref[1])))
    # the probe runs a reference that adds nothing as the base: the same numbers, one pass
    # fewer; a reference that adds something is its own pass
    assert adds_nothing(untrained) and not adds_nothing(moved_state)
    as_state = measure(agent.model, agent.tokenizer, groups, policy=PolicySpec.of(moved_state),
                       reference=PolicySpec.of(untrained), base=BASE)
    assert as_state.mean_kl_reference == pytest.approx(moved.mean_kl_reference, rel=1e-4)
    assert as_state.reference_logps[0] == pytest.approx(ref, rel=1e-4)
    # a completion sampled twice runs once, and counts twice
    twice = measure(agent.model, agent.tokenizer,
                    [("def pick(xs):\n", ["    return 3\n", "    return 1\n", "    return 3\n"])],
                    policy=PolicySpec.of(moved_state), reference=BASE, base=BASE)
    assert twice.policy_logps[0] == pytest.approx([pol[0], pol[1], pol[0]], rel=1e-5)
    assert twice.kl_base[0] == pytest.approx([*moved.kl_base[0], moved.kl_base[0][0]], rel=1e-5)
    assert moved.tokens < twice.tokens < 2 * moved.tokens


def test_comparable_pairs_take_every_ordered_preference_the_scores_support():
    pairs = comparable_pairs([[True, True, False, True]], [[-0.1, -0.5, math.nan, -0.1]],
                             [["a", "b", "c", "a"]])
    got = {(p.chosen, p.rejected) for p in pairs}
    # a over b and c; b over c; d (the same text as a) over b and c but never over a
    assert got == {(0, 1), (0, 2), (1, 2), (3, 1), (3, 2)}


LITERAL_CODE = """import math

WINDOW = 50  # a window
ALPHA = 0.25

def policy(context, history, t):
    # keep 0 and 1 as they are
    for i in range(0, len(history), 1):
        pass
    return int(math.log(WINDOW) * ALPHA * 3.5) % 5
"""


def test_the_literal_search_redraws_one_to_three_tunable_literals_and_keeps_the_rest():
    found = [v for _, _, v in tunable_literals(LITERAL_CODE)]
    assert found == [50, 0.25, 3.5, 5]  # not 0, 1, and nothing inside the comments
    for seed in range(30):
        new = mutate(LITERAL_CODE, random.Random(seed))
        compile(new, "<candidate>", "exec")
        assert "# a window" in new and "# keep 0 and 1 as they are" in new
        after = [v for _, _, v in tunable_literals(new)]
        changed = [(a, b) for a, b in zip(found, after) if a != b]
        assert len(after) == len(found) and 1 <= len(changed) <= 3
        for a, b in changed:
            assert type(a) is type(b)
            assert 0.25 * 0.999 <= b / a <= 4 * 1.001 or isinstance(a, int)
            assert not isinstance(a, int) or b >= 2
    writes = LiteralSearch().write([Program(id=0, island=0, round=0, code=LITERAL_CODE,
                                            evaluation=Evaluation(score=0.0, passed=True))],
                                   4, seed=3)
    assert writes == LiteralSearch().write([Program(id=0, island=0, round=0, code=LITERAL_CODE,
                                                    evaluation=Evaluation(score=0.0,
                                                                          passed=True))],
                                           4, seed=3)
    assert len(writes) == 4 and any(w != LITERAL_CODE for w in writes)


def _train(tmp_path: Path, method: str) -> tuple[dict, list[dict], str]:
    run = tmp_path / method
    proc = subprocess.run(  # W&B offline, as the main command logs: its config takes provenance
        [sys.executable, "-m", "atlas.train", "experiment=test", f"method={method}",
         "task=bandit", "task.T=300", "task.env_seeds=[0,1]", "progress=false",
         "logger=wandb", "logger.mode=offline", f"hydra.run.dir={run}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return json.loads((run / "results.json").read_text()), events, proc.stdout


@pytest.mark.parametrize("method", ["sample", "random_literals"])
def test_the_controls_spend_the_same_budget_and_never_fine_tune(tmp_path, method):
    results, events, out = _train(tmp_path, method)
    assert results["method"] == method
    assert results["candidates"] == results["candidate_budget"] == 16
    assert results["phases"] == 0 and not any(e["event"] == "phase" for e in events)
    assert not (tmp_path / method / "adapters").exists()
    assert f"method={method}" in out
    if method == "random_literals":  # no model: nothing was loaded, nothing recorded of one
        assert results["model"] is None and results["dtype"] is None
        assert results["valid_rate"] > 0.5  # redrawn constants of a passing seed mostly pass
    else:
        assert results["model"] == "tiny"


def test_bench_learn_trains_each_setting_from_the_archived_phase_at_toy_size(tmp_path):
    """``python -m atlas.bench learn`` on the archived main-command run, with the tiny model:
    one row per setting, each from fresh adapters (the larger lr moves the policy further),
    the probe's prompts chosen outside D_k, the rows written as JSON."""
    out = tmp_path / "learn.json"
    proc = subprocess.run(
        [sys.executable, "-m", "atlas.bench", "learn", "--model", "tiny", "--threads", "1",
         "--workers", "1", "--probe-prompts", "1", "--probe-samples", "2",
         "--setting", "lr=1e-2", "--setting", "lr=1e-4,lora_r=8,lora_alpha=16",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    big, small = result["rows"]
    assert [big["name"], small["name"]] == ["lr=0.01", "lr=0.0001,lora_r=8,lora_alpha=16"]
    assert big["pairs"] == small["pairs"] > 0 and big["steps"] == small["steps"] > 0
    assert big["kl_base"] > 10 * small["kl_base"] > 0
    assert big["train_loss_last"] < big["train_loss_first"]
    assert result["probe"]["prompts"] == 1 and result["probe"]["samples"] == 2
    assert "lr=0.01" in proc.stdout and "KL" in proc.stdout


def test_bench_learn_names_a_bad_setting_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "atlas.bench", "learn", "--setting", "lrr=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("setting 'lrr=1': use key=value")
