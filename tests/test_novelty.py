"""Novelty: labels of every proposal, copies never evaluated or chosen, attribution that
ignores dead code (B1), probe statistics on counts."""

from __future__ import annotations

import json

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.explorer import Explorer
from atlas.evolution.preferences import build_pairs
from atlas.novelty import (
    CONSTANTS_ONLY,
    COPY,
    NEW,
    SAME_BEHAVIOUR,
    NoveltyIndex,
    beats_parents,
    labelled,
    program_key,
    shape_key,
    tally,
)
from atlas.probe import valid_change
from atlas.results import _origins
from atlas.stats import binomial_p, wilson_interval
from atlas.types import Evaluation, FailureKind, PairKind, Program, ProgramSource
from tests.conftest import explore_settings
from tests.test_evolution_explorer import ScriptedAgent, ThreadSandbox, ToyTask

POLICY = '''import math

def helper(x):
    return x + 1

def policy(t, arms):
    """Pick an arm."""
    # a comment
    return helper(t) % arms
'''


def test_program_key_ignores_comments_docstrings_and_code_the_entry_point_never_reaches():
    dead = POLICY + "\ndef policy_v3(t, arms):\n    return 0\n\nUNUSED = 3\nimport os\n"
    reformatted = POLICY.replace('    """Pick an arm."""\n', "").replace("# a comment", "")
    assert program_key(dead, "policy") == program_key(POLICY, "policy")
    assert program_key(reformatted, "policy") == program_key(POLICY, "policy")
    # without the entry point every definition counts: the dead function makes it another
    assert program_key(dead, None) != program_key(POLICY, None)
    # a live change (the helper the entry point calls) is a different program
    assert program_key(POLICY.replace("x + 1", "x + 2"), "policy") != program_key(POLICY,
                                                                                  "policy")
    # a constant only the dead code reads is dead too; one the entry point reads is live
    live = "K = 3\n\ndef policy(t, arms):\n    return K % arms\n"
    assert program_key(live, "policy") != program_key(live.replace("K = 3", "K = 4"), "policy")
    assert shape_key(live, "policy") == shape_key(live.replace("K = 3", "K = -4.5"), "policy")


def _prog(pid: int, code: str, score: float | None, *, parents=(), source="agent",
          regime="r") -> Program:
    ev = (Evaluation(score=score, passed=True) if score is not None
          else Evaluation.failure(FailureKind.EXCEPTION, "x"))
    return Program(id=pid, island=0, round=1, code=code, evaluation=ev, parents=list(parents),
                   source=ProgramSource(source), regime=regime, prompt="p" if source != "seed"
                   else "", completion=code)


def test_labels_copy_same_behaviour_constants_only_new_and_beats_parents():
    index = NoveltyIndex("policy")
    seed = _prog(0, POLICY, -0.5, source="seed")
    index.add_program(seed)
    assert index.label(POLICY + "\n# more\n", -0.5, "r", [seed]) == COPY
    renamed = POLICY.replace("helper", "plus_one")
    assert index.label(renamed, -0.5, "r", [seed]) == SAME_BEHAVIOUR
    assert index.label(renamed, -0.5, "other regime", [seed]) == NEW  # scores compare per regime
    tuned = POLICY.replace("x + 1", "x + 7")
    assert index.label(tuned, -0.4, "r", [seed]) == CONSTANTS_ONLY
    rewritten = POLICY.replace("helper(t) % arms", "(t * 3) % arms")
    assert index.label(rewritten, -0.4, "r", [seed]) == NEW
    assert index.label(rewritten, None, "r", [seed]) == NEW  # a failed program is new or not by code
    assert beats_parents(-0.4, "r", [seed]) is True
    assert beats_parents(-0.6, "r", [seed]) is False
    assert beats_parents(None, "r", [seed]) is False
    assert beats_parents(-0.4, "other", [seed]) is None  # no parent scored on that equation


def test_database_labels_what_it_files_and_rebuilds_the_index_on_resume():
    db = ProgramDatabase(explore_settings(islands=1, temperatures=[0.5]), 0, entry_point="policy")
    db.add(_prog(0, POLICY, -0.5, source="seed"))
    copy = _prog(1, POLICY + "\ndef unused():\n    pass\n", -0.5, parents=[0])
    new = _prog(2, POLICY.replace("% arms", "% (arms - 1)"), -0.3, parents=[0])
    db.add(copy)
    db.add(new)
    assert (copy.novelty, new.novelty, new.beats_parents) == (COPY, NEW, True)
    again = ProgramDatabase(explore_settings(islands=1, temperatures=[0.5]), 0,
                            entry_point="policy")
    again.load_state_dict(json.loads(json.dumps(db.state_dict())))
    assert [p.novelty for p in again.all_programs()] == ["", COPY, NEW]
    assert again.copy_of(new.code) == 2


COPY_OF_SEED = "\n    return 0\n```"          # the seed, written out again
NEW_ONES = ["\n    return 3\n```", "\n    return 2\n```", "\n    return 1\n```"]


class RetryAgent(ScriptedAgent):
    """The first call copies the seed in every other sample; each re-ask writes new code."""

    def generate(self, prompts, num_samples, **kw):
        first = not self.calls
        super().generate(prompts, num_samples, **kw)
        if first:
            return [[COPY_OF_SEED if i % 2 else NEW_ONES[i // 2 % 3] for i in range(num_samples)]
                    for _ in prompts]
        return [["\n    return len(xs) - " + str(len(self.calls) + i) + "\n```"
                 for i in range(num_samples)] for _ in prompts]


def _explorer(agent, **cfg):
    settings = explore_settings(islands=1, islands_per_round=1, samples_per_prompt=4,
                                temperatures=[0.5], **cfg)
    db = ProgramDatabase(settings, seed=0, entry_point="pick")
    sandbox = ThreadSandbox()
    return Explorer(ToyTask(), agent, sandbox, db, settings, seed=3), sandbox, db


def test_a_copy_is_recorded_not_evaluated_and_the_agent_is_asked_again():
    agent = RetryAgent(["unused"])
    ex, sandbox, db = _explorer(agent, copies="skip", copy_retries=1)
    ex.seed_islands()
    new = ex.run_round(1, 1)
    stats = ex.last_stats
    # 4 samples: 2 copies of the seed, re-asked once for 2 more, all new
    assert [c.of for c in stats.copies] == [0, 0] and stats.retries == 1
    assert len(new) == 4 and all(p.novelty != COPY for p in new)
    assert COPY_OF_SEED.strip("\n`").strip() not in "".join(sandbox.submitted[1:])
    assert len(sandbox.submitted) == 1 + 4  # the seed, then only the 4 new programs
    assert agent.calls[1]["n"] == 2 and agent.calls[1]["seed"] != agent.calls[0]["seed"]
    assert ex.copies == stats.copies and len(db) == 1 + 4


def test_copies_left_after_the_bound_leave_the_budget_unspent_and_evaluate_restores_them():
    agent = ScriptedAgent([COPY_OF_SEED, NEW_ONES[0]])  # copies the seed on every re-ask
    ex, sandbox, _ = _explorer(agent, copies="skip", copy_retries=2)
    ex.seed_islands()
    new = ex.run_round(1, 1)
    # each draw alternates the seed and "return 3": after the first "return 3" every sample
    # is a copy (of the seed, or of the round's own earlier proposal): 3 + 3 + 3 copies
    assert len(new) == 1 and len(ex.last_stats.copies) == 9
    assert len(agent.calls) == 3  # the first draw and two re-asks: bounded, never a hang
    assert ex.last_stats.retry_samples == 6 and len(sandbox.submitted) == 1 + 1
    agent2 = ScriptedAgent([COPY_OF_SEED, NEW_ONES[0]])
    ex2, sandbox2, _ = _explorer(agent2, copies="evaluate")
    ex2.seed_islands()
    old = ex2.run_round(1, 1)
    assert len(old) == 4 and [p.novelty for p in old] == [COPY, CONSTANTS_ONLY, COPY, COPY]
    assert len(agent2.calls) == 1


def test_a_copy_is_never_chosen_and_lazy_pairs_reject_it():
    db = ProgramDatabase(explore_settings(islands=1, temperatures=[0.5]), 0, entry_point="pick")
    seed = _prog(0, "def pick(xs):\n    return 0\n", -0.75, source="seed")
    db.add(seed)
    copy = _prog(1, "def pick(xs):\n    return 0\n", -0.75, parents=[0])
    worse = _prog(2, "def pick(xs):\n    return 4\n", -1.0, parents=[0])
    good = _prog(3, "def pick(xs):\n    return 3\n", 0.0, parents=[0])
    for p in (copy, worse, good):
        db.add(p)
    pairs = build_pairs(db, [copy, worse, good], top_k=4, max_pairs=20, score_threshold=None,
                        seed=0)
    assert pairs and all(p.chosen_id != copy.id for p in pairs)
    assert any(p.chosen_id == good.id and p.rejected_id == copy.id for p in pairs)  # as rejected
    lazy = build_pairs(db, [copy, worse, good], top_k=4, max_pairs=20, score_threshold=None,
                       seed=0, lazy=True)
    kinds = [p for p in lazy if p.kind == PairKind.NEW_VS_COPY]
    assert [(p.chosen_id, p.rejected_id) for p in kinds] == [(good.id, copy.id)]


def test_attribution_counts_a_supporter_patch_with_dead_code_appended_as_the_supporters():
    patch = "def policy(t, arms):\n    return t % arms\n"
    records = [
        {"id": 0, "source": "seed", "code": "def policy(t, arms):\n    return 0\n"},
        {"id": 1, "source": "supporter", "code": patch},
        {"id": 2, "source": "agent", "code": patch + "\ndef policy_v3(t, arms):\n    return 1\n"},
        {"id": 3, "source": "agent", "code": patch.replace("t % arms", "(t + 1) % arms")},
    ]
    assert _origins(records, "policy") == {0: "seed", 1: "supporter", 2: "supporter_copy",
                                           3: "agent"}
    assert _origins(records, None)[2] == "agent"  # the old whole-module rule credited the agent


def test_labelled_replays_labels_for_records_written_without_them():
    records = [{"id": 0, "source": "seed", "code": "def pick(xs):\n    return 0\n",
                "evaluation": {"passed": True, "score": -0.75}, "regime": "r"},
               {"id": 1, "source": "agent", "code": "def pick(xs):\n    return 0  # again\n",
                "evaluation": {"passed": True, "score": -0.75}, "regime": "r", "parents": [0]},
               {"id": 2, "source": "agent", "code": "def pick(xs):\n    return 3\n",
                "evaluation": {"passed": True, "score": 0.0}, "regime": "r", "parents": [0]}]
    out = labelled(records, "pick")
    assert [r.get("novelty") for r in out] == [None, COPY, CONSTANTS_ONLY]
    assert out[2]["beats_parents"] is True
    t = tally(out[1:], skipped=[{"of": 0}])
    assert (t["proposals"], t["copies"], t["evaluated"], t["valid"]) == (3, 2, 2, 2)
    assert t["copy_rate"] == 2 / 3 and t["new_valid"] == 0
    # the constants-only program beats its parent: counted whatever its label
    assert (t["beats_parents"], t["new_beats_parents"]) == (1, 0)


def test_probe_statistics_are_counts_with_exact_p_and_stay_inside_their_range():
    change = valid_change([False, False, True, True, False, True],
                          [True, True, True, True, True, True])
    assert (change["fail_to_pass"], change["pass_to_fail"], change["mean"]) == (3, 0, 0.5)
    assert change["p"] == 0.25  # 3 of 3 one way: 2 / 2^3
    assert abs(binomial_p(4, 6) - 44 / 64) < 1e-12  # 4 of 6 right is no evidence
    assert abs(binomial_p(9, 10) - 22 / 1024) < 1e-12
    assert binomial_p(0, 0) is None
    for k, n in ((0, 6), (6, 6), (3, 7)):
        lo, hi = wilson_interval(k, n)
        assert 0.0 <= lo <= k / n <= hi <= 1.0
