"""Issue 11 items 1, 2, 5: equal budgets and an agent-only column, supporter programs as
preference supervision, and scores compared on one equation while the PINN viscosity drifts.

Unit level here (real extractor, real prompt builder, real preference builder, real
``summarise`` on hand-written run folders with known numbers); the loop-level checks run the
tiny agent through ``atlas.train.run`` (``tests/test_atlas_e2e.py`` has the ATLAS run whose
agent writes nothing valid; this file has the ablation switch and the PINN regime change).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import atlas.train
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.extract import as_completion, extract_program
from atlas.evolution.preferences import (
    PASSED_VS_FAILED,
    PASSED_VS_PASSED,
    SUPPORTER_VS_AGENT,
    build_pairs,
)
from atlas.evolution.prompts import build_prompt, prefill_of
from atlas.results import summarise
from atlas.supporters.patching import add_robust_loss, find_numeric_sites, perturb
from atlas.tasks import make_task
from atlas.telemetry import EVENTS, PROGRAMS
from atlas.types import Evaluation, FailureKind, Program
from tests.conftest import QUICK_BANDIT, compose_cfg, explore_settings


def _seed(task_name: str) -> tuple[Any, Program, str]:
    task = make_task(task_name)
    spec = task.prompt_spec()
    code = extract_program("", task.seed_program(), spec.entry_point)
    seed = Program(id=0, island=0, round=0, code=code, evaluation=Evaluation(-0.375, True),
                   source="seed")
    return spec, seed, build_prompt(spec, [seed])[2]


# ---------------------------------------------------------------- a patch as a completion

def test_a_numeric_patch_is_a_completion_of_the_served_prompt():
    spec, seed, prefill = _seed("bandit")
    site = next(s for s in find_numeric_sites(seed.code) if s.name == "window")
    patch, text = perturb(seed.code, site, 2.0)
    completion = as_completion(prefill, patch, spec.entry_point)
    assert completion is not None and text == "100"
    # what the agent would have written with these tokens is exactly the patched program
    assert extract_program(prefill, completion, spec.entry_point).strip() == patch.strip()
    # the agent's output format: it continues the open fence and never closes it
    assert completion.startswith("\n    ") and "```" not in completion
    assert "window = 100" in completion and not completion.startswith("\n    window = 50")


def test_a_helper_added_before_the_function_follows_it_in_the_completion():
    spec, seed, prefill = _seed("pinn")
    robust = add_robust_loss(seed.code, spec.entry_point)
    completion = as_completion(prefill, robust, spec.entry_point)
    assert completion is not None and "def _atlas_pseudo_huber" in completion
    written = extract_program(prefill, completion, spec.entry_point)
    assert written.index("def pinn_loss_strategy") < written.index("def _atlas_pseudo_huber")
    assert "jnp.mean(_atlas_pseudo_huber(residuals))" in written


def test_a_patch_the_prefill_cannot_lead_to_is_refused():
    spec, seed, prefill = _seed("bandit")
    renamed = seed.code.replace("def policy(contexts, history, t, state):",
                                "def policy(contexts, history, t, state=None):")
    assert as_completion(prefill, renamed, spec.entry_point) is None  # header changed
    constant = "WINDOW = 7\n" + seed.code  # a module constant after the function is dropped
    assert as_completion(prefill, constant, spec.entry_point) is None


# ---------------------------------------------------------------- supporter_vs_agent pairs

def _p(pid: int, score: float | None, prompt: str, completion: str, source: str = "agent"
       ) -> Program:
    ev = (Evaluation(score=score, passed=True) if score is not None
          else Evaluation.failure(FailureKind.EXCEPTION, "boom"))
    return Program(id=pid, island=0, round=1, code=f"def policy():\n    return {pid}\n",
                   evaluation=ev, prompt=prompt, completion=completion, source=source)


def test_a_supporter_program_is_chosen_against_the_worse_completions_of_its_prompt():
    db = ProgramDatabase(explore_settings(islands=1, buffer_size=16, clusters=4))
    agent = [_p(1, -0.5, "P", "a1"), _p(2, -0.2, "P", "a2"), _p(3, None, "P", "a3"),
             _p(4, -0.9, "Q", "q1")]
    supporter = _p(5, -0.3, "P", "s1", source="supporter")
    pairs = build_pairs(db, agent + [supporter], top_k=1, max_pairs=50, score_threshold=None,
                        seed=0)
    mine = [p for p in pairs if p.kind == SUPPORTER_VS_AGENT]
    # chosen against the prompt's worse (a1) and failed (a3) agent completions, not the better
    # a2, not another prompt's q1, and always with its own prompt
    assert sorted(p.rejected for p in mine) == ["a1", "a3"]
    assert all(p.chosen == "s1" and p.prompt == "P" and p.chosen_id == 5 for p in mine)
    # the agent's own top-1 still gets its pairs; the supporter is never a rejected completion
    assert {(p.kind, p.chosen, p.rejected) for p in pairs if p.kind != SUPPORTER_VS_AGENT} == {
        (PASSED_VS_PASSED, "a2", "a1"), (PASSED_VS_FAILED, "a2", "a3")}
    # filed without a prompt (the ablation), the same program builds no pair
    plain = _p(5, -0.3, "", "", source="supporter")
    assert not [p for p in build_pairs(db, agent + [plain], top_k=1, max_pairs=50,
                                       score_threshold=None, seed=0)
                if p.kind == SUPPORTER_VS_AGENT]
    # the threshold applies to it like to any chosen program
    assert not [p for p in build_pairs(db, agent + [supporter], top_k=1, max_pairs=50,
                                       score_threshold=-0.25, seed=0)
                if p.kind == SUPPORTER_VS_AGENT]


# ---------------------------------------------------------------- results.json columns

def _row(pid: int, rnd: int, score: float | None, source: str, regime: str = "{}",
         parents: list[int] | None = None) -> dict[str, Any]:
    return {"id": pid, "island": 0, "round": rnd, "phase": 0, "code": f"c{pid}", "prompt": "",
            "completion": "", "parents": parents or [], "cluster": "", "source": source,
            "regime": regime,
            "evaluation": {"score": score, "passed": score is not None, "metrics": {},
                           "failure_kind": "ok" if score is not None else "exception"}}


def _summarise(tmp_path: Path, rows: list[dict[str, Any]], explore: dict[str, Any]
               ) -> dict[str, Any]:
    (tmp_path / PROGRAMS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"task": {"name": "bandit"}, "method": {"name": "atlas"}, "seed": 0,
              "explore": explore}
    (tmp_path / EVENTS).write_text(json.dumps({"event": "config", "config": config}) + "\n")
    return summarise(tmp_path, {})


def test_final_agent_never_counts_a_supporter_program(tmp_path):
    rows = [_row(0, 0, -0.4, "seed"), _row(1, 1, -0.35, "agent"), _row(2, 1, None, "agent"),
            _row(3, 1, -0.2, "supporter"), _row(4, 2, -0.5, "agent"), _row(5, 2, None, "agent")]
    res = _summarise(tmp_path, rows, {"rounds": 2, "islands_per_round": 1,
                                      "samples_per_prompt": 3})
    assert res["initial_score"] == -0.4 and res["final_score"] == -0.2
    assert res["final_agent"] == -0.35
    assert res["improvement_pct"] == pytest.approx(50.0)
    assert res["improvement_agent_pct"] == pytest.approx(12.5)
    assert res["candidates"] == 5 and res["candidate_budget"] == 6
    assert res["candidates_by_source"] == {"agent": 4, "supporter": 1, "rescore": 0}
    assert res["best_by_round"] == [-0.4, -0.2, -0.2]
    assert res["best_by_round_agent"] == [-0.4, -0.35, -0.35]


def test_an_agent_copy_of_a_supporter_program_is_not_the_agents_best(tmp_path):
    """The agent's prompt shows supporter patches; repeating one (same syntax tree: comments
    and spacing aside) counts as the supporter's. A program the agent wrote first, or a copy
    with one literal changed, stays the agent's."""
    def code(row: dict[str, Any], text: str) -> dict[str, Any]:
        return row | {"code": text}

    rows = [_row(0, 0, -0.4, "seed"),
            code(_row(1, 1, -0.3, "agent"), "w = 3\n"),         # the agent's own, first
            code(_row(2, 1, -0.2, "supporter"), "w = 100  # the supporter's tuning\n"),
            code(_row(3, 1, -0.3, "supporter"), "w = 3\n"),     # the supporter repeats the agent
            code(_row(4, 2, -0.2, "agent"), "w=100\n\n"),        # a verbatim copy, reformatted
            code(_row(5, 2, -0.25, "agent"), "w = 101\n")]      # the agent changed a literal
    res = _summarise(tmp_path, rows, {"rounds": 2, "islands_per_round": 1,
                                      "samples_per_prompt": 2})
    assert res["final_score"] == -0.2
    assert res["final_agent"] == -0.25
    assert res["best_by_round_agent"] == [-0.4, -0.3, -0.25]
    assert res["agent_copies_of_supporter"] == 1
    assert res["candidates_by_source"]["agent"] == 3  # the copy was still an evaluated sample


def test_scores_compare_on_one_equation(tmp_path):
    """Phase 1 at nu=a, phase 2 at nu=b (harder: every loss is larger). The seed and the
    incumbents are re-scored on b; initial, final and Figure 2 use b's numbers only."""
    a, b = '{"viscosity": 0.03}', '{"viscosity": 0.003}'
    rows = [_row(0, 0, -1e-3, "seed", a), _row(1, 1, -5e-4, "agent", a),
            _row(2, 1, -1e-4, "supporter", a),
            # round 2: a new equation; the seed (0), the best (2) and the agent's best (1)
            _row(3, 2, -1e-1, "rescore", b, [0]), _row(4, 2, -2e-2, "rescore", b, [2]),
            _row(5, 2, -5e-2, "rescore", b, [1]), _row(6, 2, -4e-2, "agent", b)]
    res = _summarise(tmp_path, rows, {"rounds": 2, "islands_per_round": 1,
                                      "samples_per_prompt": 2})
    assert res["initial_score"] == -1e-1 and res["final_score"] == -2e-2  # both on b
    assert res["final_agent"] == -4e-2  # the agent's round-2 program beats its re-scored best
    assert res["improvement_pct"] == pytest.approx(80.0)
    assert res["improvement_agent_pct"] == pytest.approx(60.0)
    # round 1's best is on a; round 2's on b (a's -1e-4 is not "better" than b's numbers)
    assert res["best_by_round"] == [-1e-3, -1e-4, -2e-2]
    assert res["best_by_round_agent"] == [-1e-3, -5e-4, -4e-2]
    assert res["candidates"] == 3 and res["candidates_by_source"]["rescore"] == 3
    assert res["score_regime"] == b


# ---------------------------------------------------------------- through the loop

def _run(tmp_path: Path, overrides: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                        list[dict[str, Any]]]:
    atlas.train.run(compose_cfg(overrides, run_dir=tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    read = lambda name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    return results, read(EVENTS), read(PROGRAMS)


@pytest.mark.parametrize("as_preferences", [True, False])
def test_supporter_patches_as_preferences_switch(tmp_path, as_preferences):
    results, events, programs = _run(tmp_path, [
        "experiment=test", "method=atlas", "task=bandit", "progress=false", "explore.rounds=2",
        "explore.phase_every=1", "method.skip_without_improvement=false", *QUICK_BANDIT,
        f"supporters.exploration.as_preferences={as_preferences}"])
    patches = [p for p in programs if p["source"] == "supporter"]
    assert patches and results["candidates"] == results["candidate_budget"] == 8
    served = {(p["round"], p["island"]): p["prompt"] for p in programs if p["source"] == "agent"}
    for p in patches:
        if as_preferences:  # a completion of the prompt its island was served with this round
            assert p["prompt"] == served[(p["round"], p["island"])] and p["completion"]
            assert extract_program(prefill_of(p["prompt"]), p["completion"], "policy") == p["code"]
        else:
            assert p["prompt"] == "" and p["completion"] == ""
    phase1 = next(e for e in events if e["event"] == "phase" and e["phase"] == 1)
    kinds = phase1.get("pair_kinds") or {}
    exploration = [e for e in events if e["event"] == "exploration"]
    if as_preferences:
        # the tiny agent writes nothing valid: the supporter's programs are its only chosen
        assert kinds[SUPPORTER_VS_AGENT] >= 1 and kinds[PASSED_VS_PASSED] == 0
        assert results["pair_kinds"][SUPPORTER_VS_AGENT] >= 1
        assert exploration[0]["as_preferences"] == exploration[0]["patches"] >= 1
    else:
        assert phase1["skipped"] and phase1["reason"] == "no preference pairs could be built"
        assert not kinds.get(SUPPORTER_VS_AGENT)
        assert all(e["as_preferences"] == 0 for e in exploration)


def test_pinn_scores_compare_within_a_phase_and_incumbents_are_rescored(tmp_path):
    results, events, programs = _run(tmp_path, [
        "experiment=test", "method=evotune", "task=pinn", "progress=false",
        "task.n_steps=20"])
    nus = {p["round"]: json.loads(p["regime"])["viscosity"] for p in programs
           if p["source"] != "rescore"}
    # phase_every=2 -> rounds 0-2 at nu_start, 3-4 at nu_end: one equation per phase
    assert nus[0] == nus[1] == nus[2] > nus[3] == nus[4]
    change = [e for e in events if e["event"] == "regime"]
    assert [e["round"] for e in change] == [3]
    rescored = [p for p in programs if p["source"] == "rescore"]
    assert rescored and all(p["round"] == 3 for p in rescored)
    assert 0 in {p["parents"][0] for p in rescored}  # the seed, re-scored on the shock regime
    seed_again = next(p for p in rescored if p["parents"][0] == 0)
    assert results["initial_score"] == seed_again["evaluation"]["score"]
    # the skip test of phase 2 compared with the incumbents on phase 2's equation
    phase2 = next(e for e in events if e["event"] == "phase" and e["phase"] == 2)
    assert phase2["best_before"] == max(p["evaluation"]["score"] for p in rescored
                                        if p["evaluation"]["passed"])
    assert results["candidates_by_source"]["rescore"] == len(rescored)
    assert results["candidates"] == results["candidate_budget"] == 16
