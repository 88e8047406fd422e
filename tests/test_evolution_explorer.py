"""Explorer bookkeeping with a scripted agent and an in-process sandbox (fakes at the edges)."""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from atlas.dpo.evidence import gate_items, gate_prompts
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.explorer import Explorer
from atlas.evolution.preferences import build_pairs
from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.tasks.base import PromptSpec, Task
from atlas.tasks.errors import TaskError
from atlas.types import Evaluation, FailureKind, Program
from tests.conftest import explore_settings, model_settings

SEED = "def pick(xs):\n    return 0\n"


class ToyTask(Task):
    """Pick an index; the score is minus the distance to index 3 (best score 0)."""

    name = "toy"
    evaluator_factory = "tests.test_evolution_explorer:toy_evaluator"

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(system="You write Python.", problem="Return an index in [0, 5).",
                          signature="def pick(xs):", entry_point="pick")

    def seed_program(self) -> str:
        return SEED

    def context(self, round_index: int) -> dict:
        return {"round": round_index, "target": 3}


def toy_evaluate(code: str, context: dict) -> Evaluation:
    try:
        fn = load_candidate(code, "pick")
        out = fn([0, 1, 2, 3, 4])
    except CandidateError as exc:
        return Evaluation.failure(exc.kind, exc.message)
    except Exception as exc:  # noqa: BLE001 - classified like the real sandbox does
        return Evaluation.failure(FailureKind.EXCEPTION, repr(exc))
    if not isinstance(out, int) or not 0 <= out < 5:
        return Evaluation.failure(FailureKind.WRONG_RETURN, f"got {out!r}")
    return Evaluation(score=-abs(out - context["target"]) / 4, passed=True)


class ThreadSandbox:
    """Evaluates in a thread pool with a delay, so futures really complete out of order."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)
        self.submitted: list[str] = []

    def submit(self, code: str, context: dict) -> Future:
        self.submitted.append(code)
        delay = 0.02 if "slow" in code else 0.0
        return self.pool.submit(lambda: (time.sleep(delay), toy_evaluate(code, context))[1])


class ScriptedAgent:
    """Returns scripted completions; records every call's arguments."""

    def __init__(self, completions: list[str]) -> None:
        self.completions = completions
        self.calls: list[dict] = []
        self.sandbox: ThreadSandbox | None = None  # to observe submissions during generation

    def chat_prompt(self, system: str, user: str, prefill: str) -> str:
        return f"<s>{system}\n<u>{user}\n<a>{prefill}"

    def generate(self, prompts, num_samples, *, temperature, top_p, max_new_tokens, stop,
                 adapter, seed):
        self.calls.append(dict(prompts=prompts, n=num_samples, temperature=temperature,
                               top_p=top_p, max_new_tokens=max_new_tokens, stop=stop,
                               adapter=adapter, seed=seed,
                               submitted=len(self.sandbox.submitted) if self.sandbox else None))
        return [[self.completions[i % len(self.completions)] for i in range(num_samples)]
                for _ in prompts]


CFG = {"islands": 3, "islands_per_round": 2, "samples_per_prompt": 5, "programs_in_prompt": 2,
       "max_new_tokens": 64, "temperatures": [0.7, 0.9, 1.1, 1.3, 1.5, 1.7], "top_p": 0.9,
       "buffer_size": 16, "clusters": 4,
       # the scripted agent writes the same completions for every island: these tests are
       # about bookkeeping, so copies are scored and filed (test_novelty.py: skipped copies)
       "copies": "evaluate"}
COMPLETIONS = [
    "\n    return 3  # slow\n```",               # best: score 0
    "\n    return 1\n```\nAlways one.",          # score -0.5
    "\nSorry, I can't.",                         # no code
    "\n    return xs[9]\n```",                   # exception
    "\n    return 'a'\n```",                     # wrong return
]


def make(completions=COMPLETIONS, cfg=CFG):
    settings = explore_settings(**cfg)
    db = ProgramDatabase(settings, seed=0)
    agent, sandbox = ScriptedAgent(completions), ThreadSandbox()
    agent.sandbox = sandbox
    return Explorer(ToyTask(), agent, sandbox, db, settings, seed=7), agent, sandbox, db


def test_seed_islands_files_one_evaluated_copy_per_island():
    ex, _, sandbox, db = make()
    seeds = ex.seed_islands()
    assert [p.island for p in seeds] == [0, 1, 2] and [p.id for p in seeds] == [0, 1, 2]
    assert len(sandbox.submitted) == 1  # evaluated once
    assert all(p.source == "seed" and p.score == -0.75 and p.passed for p in seeds)
    assert [len(db.island(i)) for i in range(3)] == [1, 1, 1]


def test_round_bookkeeping_ids_parents_islands_failure_kinds():
    ex, agent, sandbox, db = make()
    seeds = ex.seed_islands()
    new = ex.run_round(round_index=0, phase=0, critiques={1: "return the target"},
                       temperature_overrides={1: 9.0})
    assert [p.id for p in new] == list(range(3, 13))  # id order despite out-of-order results
    assert [p.island for p in new] == [0] * 5 + [1] * 5  # round 0 serves islands 0 and 1
    assert all(p.round == 0 and p.phase == 0 and p.source == "agent" for p in new)
    assert all(p.parents == [seeds[p.island].id] for p in new)
    kinds = [p.evaluation.failure_kind for p in new[:5]]
    assert kinds == ["ok", "ok", "no_code", "exception", "wrong_return"]
    assert [p.score for p in new[:2]] == [0.0, -0.5] and new[2].code == ""
    assert len(sandbox.submitted) == 1 + 8  # no-code completions never reach the sandbox
    # per-island temperature, the override clamped to the bounds, the policy adapter, stop
    assert [c["temperature"] for c in agent.calls] == [0.7, ex.settings.temperature_bounds[1]]
    assert all(c["adapter"] == "policy" and c["stop"] == ["\n```"] and c["n"] == 5
               and c["max_new_tokens"] == 64 for c in agent.calls)
    assert agent.calls[0]["seed"] != agent.calls[1]["seed"]
    # island 0's candidates were already with the consumers while island 1 was generated
    assert [c["submitted"] for c in agent.calls] == [1, 1 + 4]
    # the prompt the program keeps is the text the agent sampled from (DPO needs the same x)
    assert new[0].prompt == agent.calls[0]["prompts"][0] and "# v0: score -0.75" in new[0].prompt
    assert "Reviewer note: return the target" in new[5].prompt
    assert "Reviewer note" not in new[0].prompt
    assert len(db.all_programs()) == 13 and db.best().score == 0.0
    assert [p.id for p in db.all_programs()] == list(range(13))  # filed in id order
    stats = ex.last_stats
    assert stats.islands[0].valid == 2 and stats.islands[0].failure_kinds["no_code"] == 1
    # next round: islands 2 and 0; island 0's prompt now shows its new best program last
    ex.run_round(round_index=1, phase=0)
    assert ex.islands_for_round(1) == [2, 0]
    prompt0 = agent.calls[-1]["prompts"][0]
    assert prompt0.index("# v0: score -0.5") < prompt0.index("# v1: score 0")


def test_phase_programs_yield_pairs_and_gate_items_end_to_end():
    ex, _, _, db = make()
    ex.seed_islands()
    programs = ex.run_round(0, 0) + ex.run_round(1, 0)
    pairs = build_pairs(db, programs, top_k=2, max_pairs=50, score_threshold=None, seed=0)
    assert pairs and all(pr.chosen_score > pr.rejected_score for pr in pairs)
    kinds = {pr.kind for pr in pairs}
    assert kinds == {"passed_vs_passed", "passed_vs_failed"}
    items = gate_items(programs, gate_prompts(programs, seed=0, size=2))
    # islands 0, 1 (round 0) and 2 (round 1) saw the same seed-only prompt: one item of 15
    assert sorted(len(g.completions) for g in items) == [5, 15]
    assert all(math.isfinite(s) for g in items for s in g.scores)


def test_add_external_is_evaluated_and_filed():
    ex, _, _, db = make()
    ex.seed_islands()
    p = ex.add_external("```python\ndef pick(xs):\n    return 3\n```", island=2, round_index=4,
                        phase=1, source="supporter", parents=[2])
    assert p.passed and p.score == 0.0 and p.source == "supporter" and p.parents == [2]
    assert p.island == 2 and p.round == 4 and p.phase == 1 and p.code.startswith("def pick")
    assert db.best(2) is p
    junk = ex.add_external("no code here", island=0, round_index=4, phase=1, source="supporter",
                           parents=[])
    assert junk.evaluation.failure_kind == FailureKind.NO_CODE.value
    with pytest.raises(ValueError, match="explore.islands"):
        ex.add_external(SEED, island=5, round_index=0, phase=0, source="supporter", parents=[])


def test_bad_config_names_the_field():
    """The explore group's rules are the schema's (one rule per field, checked before a run
    starts); the explorer only checks that its database has as many islands."""
    from atlas.schema import ExploreConfig

    with pytest.raises(ValueError, match="explore.temperatures"):
        make(cfg={**CFG, "temperatures": [0.7, 0.8]})
    with pytest.raises(TypeError, match="explore.temperatures"):  # one per island, no scalar
        make(cfg={**CFG, "temperatures": 0.7})
    with pytest.raises(ValueError, match=r"explore.temperatures.1 must be > 0"):
        make(cfg={**CFG, "temperatures": [0.7, 0.0, 1.0]})
    with pytest.raises(ValueError, match="explore.islands_per_round"):
        make(cfg={**CFG, "islands_per_round": 4})
    with pytest.raises(ValueError, match="explore.top_p"):
        make(cfg={**CFG, "top_p": 0})
    with pytest.raises(ValueError, match="explore.programs_in_prompt must be >= 1"):
        make(cfg={**CFG, "programs_in_prompt": 0})
    with pytest.raises(ValueError, match=r"explore.temperature_bounds=\[2, 1\]"):
        make(cfg={**CFG, "temperature_bounds": [2.0, 1.0]})
    yaml = explore_settings().__dict__
    with pytest.raises(ValueError, match="explore.samples_per_prompt is missing"):
        ExploreConfig(**{k: v for k, v in yaml.items() if k != "samples_per_prompt"})
    db = ProgramDatabase(explore_settings(islands=2, buffer_size=4, clusters=2))
    with pytest.raises(ValueError, match="explore.islands"):
        Explorer(ToyTask(), ScriptedAgent(["x"]), ThreadSandbox(), db, explore_settings(**CFG),
                 seed=0)


def test_a_failing_seed_program_stops_the_run():
    ex, _, _, _ = make()
    ex.task.seed_program = lambda: "def pick(xs):\n    return 'x'\n"
    with pytest.raises(TaskError, match=r"the seed program of task '\w+' fails \(\w+: ") as info:
        ex.seed_islands()
    assert "\n" not in str(info.value)  # one line on the command line


def test_sandbox_errors_become_killed_failures():
    class Broken(ThreadSandbox):
        def submit(self, code, context):
            fut: Future = Future()
            fut.set_exception(RuntimeError("pool died"))
            return fut

    ex, _, _, db = make()
    ex.sandbox = Broken()
    db.add(Program(id=db.next_id(), island=0, round=0, code=SEED,
                   evaluation=Evaluation(-0.75, True), source="seed"))
    new = ex.run_round(0, 0)
    kinds = {p.evaluation.failure_kind for p in new}
    assert kinds == {"killed", "no_code"}
    assert all("pool died" in p.evaluation.message for p in new if p.code)


class ToyBanditTask(ToyTask):
    """The sandbox's toy bandit: ``policy(contexts, history, t, state) -> int``."""

    evaluator_factory = "atlas.sandbox.testing:make_toy_scorer"
    runner_factory = "atlas.sandbox.testing:make_toy_runner"

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(system="You write Python.", problem="Pick an arm in [0, 5).",
                          signature="def policy(contexts, history, t, state):",
                          entry_point="policy")

    def seed_program(self) -> str:
        return "def policy(contexts, history, t, state):\n    return 0\n"


def test_round_through_the_real_sandbox():
    from atlas.sandbox import Resources, Sandbox, TaskSpec

    completions = [
        "\n    import numpy as np\n    return int(np.argmax(contexts.sum(axis=1)))\n```",
        "\nHere is an idea but no code.",
        "\n    while True:\n        pass\n```",
        "\n    return 17\n```",
    ]
    cfg = {**CFG, "islands": 2, "islands_per_round": 1, "samples_per_prompt": 4}
    with Sandbox(TaskSpec(ToyBanditTask.evaluator_factory, {"steps": 20},
                          ToyBanditTask.runner_factory, timeout_s=2.0),
                 resources=Resources(workers=2)) as sb:
        settings = explore_settings(**cfg)
        ex = Explorer(ToyBanditTask(), ScriptedAgent(completions), sb,
                      ProgramDatabase(settings), settings, seed=0)
        db = ex.db
        seeds = ex.seed_islands()
        new = ex.run_round(0, 0)
    assert seeds[0].passed and math.isfinite(seeds[0].score)
    kinds = [p.evaluation.failure_kind for p in new]
    assert kinds == ["ok", "no_code", "timeout", "wrong_return"]
    assert [p.island for p in new] == [0] * 4 and db.best(0) is not None
    assert all(p.parents == [seeds[0].id] for p in new)


def test_a_round_spends_what_the_budget_leaves_the_agent():
    """Supporter programs are paid out of the round budget (islands_per_round x samples):
    the agent's samples are split evenly over the served islands, earlier ones first."""
    ex, agent, _, _ = make()
    ex.seed_islands()
    assert ex.round_budget() == 10
    new = ex.run_round(0, 1, agent_samples=7)  # 3 went to the supporter last round
    assert [c["n"] for c in agent.calls] == [4, 3]
    assert len(new) == 7 and [sum(p.island == i for p in new) for i in (0, 1)] == [4, 3]
    assert all(p.regime == '{"target": 3}' for p in new)  # the context less its round
    with pytest.raises(ValueError, match="agent_samples=1 .* islands_per_round=2"):
        ex.run_round(1, 1, agent_samples=1)


def test_rescore_archives_without_buffering():
    ex, _, _, db = make()
    seeds = ex.seed_islands()
    again = ex.rescore([seeds[0]], round_index=3, phase=2)
    assert [p.source for p in again] == ["rescore"] and again[0].parents == [seeds[0].id]
    assert again[0].round == 3 and again[0].score == seeds[0].score
    assert again[0] in db.all_programs() and again[0] not in db.island(0)


def test_batched_islands_file_what_island_by_island_rounds_file():
    """explore.batch_islands decodes a round's islands as one batch (tiny model, real
    sampler): the same programs, ids, prompts and completions as one island at a time."""
    from atlas.agent.research_agent import ResearchAgent

    tiny = model_settings()  # conf/model/tiny.yaml
    rounds = []
    for batched in (False, True):
        settings = explore_settings(**{**CFG, "max_new_tokens": 12, "batch_islands": batched})
        agent = ResearchAgent(tiny, seed=0)
        ex = Explorer(ToyTask(), agent, ThreadSandbox(), ProgramDatabase(settings, seed=0),
                      settings, seed=7)
        ex.seed_islands()
        new = ex.run_round(round_index=0, phase=0, temperature_overrides={1: 1.9},
                           agent_samples=7)
        assert ex.last_stats.batched_islands is batched
        assert ex.last_stats.device == "cpu"
        sampler = ex.last_stats.sampler  # the round event's sampler fields, summed over calls
        assert sampler["calls"] == (1 if batched else 2) and sampler["rows"] == 7
        assert sampler["path"] == "lookup" and sampler["device"] == "cpu"
        assert 0 <= sampler["accepted"] <= sampler["drafted"]
        assert 7 <= sampler["new_tokens"] <= 7 * 12 and 1 <= sampler["steps"] <= 12 * 2
        assert sampler["prompt_tokens"] > 0 and sampler["decode_s"] > 0
        assert sampler["tok_s"] == round(sampler["new_tokens"] / (sampler["prefill_s"]
                                                                  + sampler["decode_s"]), 2)
        rounds.append([(p.id, p.island, p.prompt, p.completion, p.code) for p in new])
    assert rounds[0] == rounds[1]
    assert [r[1] for r in rounds[1]] == [0, 0, 0, 0, 1, 1, 1]  # 7 samples: 4 + 3
    assert len({r[3] for r in rounds[1]}) > 2


def test_a_copy_of_a_program_that_passed_in_an_earlier_round_takes_its_evaluation():
    """explore.reuse_evaluations: the scripted agent writes the same five completions every
    round. Round 0's copies of one another all run (nothing was filed before the round);
    in round 1 the two that passed are not run again, they take round 0's evaluations; the
    failures run again; with the switch off every candidate runs."""
    ex, _, sandbox, db = make()
    ex.seed_islands()
    first = ex.run_round(0, 0)
    assert len(sandbox.submitted) == 1 + 8 and ex.evaluations_reused == 0
    again = ex.run_round(1, 0)  # islands 2 and 0, the same completions
    assert len(sandbox.submitted) == 1 + 8 + 4  # per island: the exception and wrong return
    assert sorted(sandbox.submitted[-4:]) == sorted([p.code for p in first[3:5]] * 2)
    assert ex.evaluations_reused == 4
    by_code = {p.code: p for p in first if p.passed}
    copies = [p for p in again if p.passed]
    assert len(copies) == 4 and all(p.code in by_code for p in copies)
    for p in copies:
        original = by_code[p.code].evaluation
        assert (p.score, p.evaluation.metrics, p.evaluation.failure_kind) == \
            (original.score, original.metrics, original.failure_kind)
        assert p.evaluation.seconds == 0.0 and p.evaluation is not original
        assert p.id > by_code[p.code].id and p.source == "agent" and p in db.all_programs()
    assert [p.evaluation.failure_kind for p in again[:5]] == \
        ["ok", "ok", "no_code", "exception", "wrong_return"]

    off, _, sandbox_off, _ = make(cfg={**CFG, "reuse_evaluations": False})
    off.seed_islands()
    off.run_round(0, 0)
    off.run_round(1, 0)
    assert len(sandbox_off.submitted) == 1 + 8 + 8 and off.evaluations_reused == 0


def test_a_patch_that_copies_a_passed_program_of_its_round_takes_its_evaluation():
    ex, _, sandbox, _ = make()
    ex.seed_islands()
    best = ex.run_round(0, 0)[0]
    n = len(sandbox.submitted)
    patch = ex.add_external(best.code, island=0, round_index=0, phase=0, source="supporter",
                            parents=[best.id])
    assert len(sandbox.submitted) == n and ex.evaluations_reused == 1
    assert patch.score == best.score and patch.source == "supporter"
    other = ex.add_external(best.code.replace("3", "2"), island=0, round_index=0, phase=0,
                            source="supporter", parents=[best.id])
    assert len(sandbox.submitted) == n + 1 and other.score == -0.25


def test_the_database_finds_the_first_pass_of_a_code_on_its_regime_and_keeps_it_on_resume():
    settings = explore_settings(**CFG)
    db = ProgramDatabase(settings)

    def program(i: int, code: str, score: float | None, regime: str = "{}") -> Program:
        ev = (Evaluation(score=score, passed=True) if score is not None
              else Evaluation.failure(FailureKind.EXCEPTION, "boom"))
        return Program(id=i, island=0, round=i, code=code, evaluation=ev, regime=regime)

    db.add(program(0, "a", None))           # failed: never reused
    db.add(program(1, "a", -0.5))
    db.add(program(2, "a", -0.25))          # a later pass of the same code: the first stands
    db.add(program(3, "b", -0.1, regime='{"nu": 1}'))
    assert db.scored("a", "{}").id == 1
    assert db.scored("a", "{}", among_first=1) is None  # filed after the first program
    assert db.scored("a", "{}", among_first=2).id == 1
    assert db.scored("b", "{}") is None and db.scored("b", '{"nu": 1}').id == 3
    assert db.scored("c", "{}") is None
    resumed = ProgramDatabase(settings)
    resumed.load_state_dict(db.state_dict())
    assert resumed.scored("a", "{}", among_first=2).id == 1
    assert resumed.scored("a", "{}", among_first=1) is None
    assert resumed.scored("b", '{"nu": 1}').score == -0.1
