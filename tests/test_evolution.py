"""Program database, clustering, coverage-aware top-k, prompts, extraction, D_k and G_k."""

from __future__ import annotations

import ast
import json
import math
import warnings

import pytest

from atlas.dpo.evidence import gate_items, gate_prompts, hold_out_prompts
from atlas.evolution.buffer import failure_floor
from atlas.evolution.clustering import FAILED, IslandClusters, code_features, similarity
from atlas.evolution.database import ProgramDatabase, select_top_k
from atlas.evolution.extract import extract_program, parse, split_program
from atlas.evolution.preferences import PASSED_VS_FAILED, PASSED_VS_PASSED, build_pairs
from atlas.evolution.prompts import build_prompt
from atlas.novelty import program_key as code_key
from atlas.tasks.base import PromptSpec
from atlas.types import Evaluation, FailureKind, Program
from tests.conftest import explore_settings

GREEDY = """import numpy as np

def policy(contexts, history, t, state):
    # greedy on the mean reward of each arm
    means = np.zeros(len(contexts))
    for arm, x, r in history[-{w}:]:
        means[arm] += r
    return int(np.argmax(means))
"""
LINUCB = """import numpy as np

def policy(contexts, history, t, state):
    d = contexts.shape[1]
    A = {lam} * np.eye(d)
    b = np.zeros(d)
    for _, x, r in history[-50:]:
        A += np.outer(x, x)
        b += r * x
    A_inv = np.linalg.inv(A)
    theta = A_inv @ b
    bonus = np.sqrt(np.sum((contexts @ A_inv) * contexts, axis=1))
    return int(np.argmax(contexts @ theta + 1.0 * bonus))
"""
RANDOM = """import random

def policy(contexts, history, t, state):
    return random.randrange(len(contexts))
"""
SPEC = PromptSpec(system="You are a research agent.", problem="Write policy(...). Return an arm.",
                  signature="def policy(contexts, history, t, state):", entry_point="policy",
                  hints=("Use numpy only.",))


def prog(pid: int, code: str, score: float | None, island: int = 0, prompt: str = "",
         completion: str = "", kind: FailureKind = FailureKind.EXCEPTION) -> Program:
    ev = (Evaluation(score=score, passed=True) if score is not None
          else Evaluation.failure(kind, "boom"))
    return Program(id=pid, island=island, round=0, code=code, evaluation=ev, prompt=prompt,
                   completion=completion)


# ---- clustering ---------------------------------------------------------------------------
def test_constants_and_names_do_not_split_a_cluster_but_algorithms_do():
    a, b = code_features(GREEDY.format(w=10)), code_features(GREEDY.format(w=500))
    renamed = code_features(GREEDY.format(w=10).replace("means", "totals"))
    assert similarity(a, b) == 1.0 and similarity(a, renamed) == 1.0
    assert similarity(a, code_features(LINUCB.format(lam=1.0))) < 0.6
    clusters = IslandClusters(max_clusters=8, threshold=0.85)
    ids = [clusters.assign(c) for c in (GREEDY.format(w=10), LINUCB.format(lam=1.0),
                                        GREEDY.format(w=99), LINUCB.format(lam=0.1), RANDOM)]
    assert ids == ["c0", "c1", "c0", "c1", "c2"]


def test_cluster_cap_joins_the_most_similar_cluster():
    clusters = IslandClusters(max_clusters=2, threshold=0.85)
    assert clusters.assign(GREEDY.format(w=1)) == "c0"
    assert clusters.assign(RANDOM) == "c1"
    # a third algorithm cannot found a cluster: it joins its nearest (greedy shares numpy/loops)
    assert clusters.assign(LINUCB.format(lam=1.0)) == "c0"
    assert len(clusters.leaders) == 2
    with pytest.raises(ValueError, match="explore.clusters"):
        IslandClusters(max_clusters=0, threshold=0.85)


# ---- database -----------------------------------------------------------------------------
def filled_db() -> ProgramDatabase:
    db = ProgramDatabase(explore_settings(islands=2, buffer_size=16, clusters=8))
    # cluster of greedy variants with high scores, one LinUCB lower, one random lowest
    for code, score in [(GREEDY.format(w=1), -0.10), (GREEDY.format(w=2), -0.11),
                        (GREEDY.format(w=3), -0.12), (LINUCB.format(lam=1.0), -0.20),
                        (RANDOM, -0.60)]:
        db.add(prog(db.next_id(), code, score))
    db.add(prog(db.next_id(), "def policy(:", None, kind=FailureKind.SYNTAX_ERROR))
    return db


def test_top_k_prefers_a_new_cluster_inside_the_pool():
    db = filled_db()
    top = db.top_k(0, 2)
    # pool = best 4 -> greedy(-0.10) then LinUCB(-0.20) beats greedy duplicate (-0.11)
    assert [p.score for p in top] == [-0.10, -0.20]
    assert len({p.cluster for p in top}) == 2
    # k=3: pool of 6 holds all three clusters, so the random policy gets in
    assert [p.score for p in db.top_k(0, 3)] == [-0.10, -0.20, -0.60]
    # a pool of 3 holds only greedy variants: diversity never reaches outside the pool
    assert [p.score for p in select_top_k(db.island(0), 2, pool_factor=1.5)] == [-0.10, -0.11]
    # pool factor 1: plain score top-k
    plain = select_top_k(db.island(0), 2, pool_factor=1.0)
    assert [p.score for p in plain] == [-0.10, -0.11]
    cov = db.coverage(0, 2)
    assert cov["clusters_in_buffer"] == 3 and cov["clusters_in_top_k"] == 2
    assert cov["ratio"] == pytest.approx(2 / 3)
    assert db.coverage(1, 2) == {"clusters_in_buffer": 0, "clusters_in_top_k": 0, "ratio": 0.0,
                                 "buffer_size": 0}


def test_top_k_drops_exact_duplicates_and_failed():
    ps = [prog(0, RANDOM, -0.5), prog(1, RANDOM, -0.5), prog(2, "x", None)]
    for p in ps:
        p.cluster = "c0"
    assert [p.id for p in select_top_k(ps, 3)] == [0]


def test_failed_programs_are_archived_not_buffered_and_best_ignores_them():
    db = filled_db()
    assert len(db.island(0)) == 5 and len(db.all_programs()) == 6
    assert db.all_programs()[-1].cluster == FAILED
    assert db.best().score == -0.10 and db.best(1) is None
    with pytest.raises(ValueError, match="explore.islands"):
        db.island(2)


def test_eviction_keeps_the_last_member_of_a_cluster():
    db = ProgramDatabase(explore_settings(islands=1, buffer_size=3, clusters=8))
    db.add(prog(db.next_id(), RANDOM, -0.9))  # its own cluster, worst score
    db.add(prog(db.next_id(), GREEDY.format(w=1), -0.1))
    db.add(prog(db.next_id(), GREEDY.format(w=2), -0.2))
    db.add(prog(db.next_id(), GREEDY.format(w=3), -0.3))  # overflow: evict the worst greedy
    assert sorted(p.score for p in db.island(0)) == [-0.9, -0.2, -0.1]
    assert len(db.all_programs()) == 4  # the archive keeps it


def test_state_dict_round_trip_is_json_and_continues_identically():
    db = filled_db()
    state = json.loads(json.dumps(db.state_dict()))  # JSON-able, -inf became null
    db2 = ProgramDatabase(explore_settings(islands=2, buffer_size=16, clusters=8))
    db2.load_state_dict(state)
    assert [p.to_dict() for p in db2.all_programs()] == [p.to_dict() for p in db.all_programs()]
    assert db2.all_programs()[-1].score == -math.inf
    assert [p.id for p in db2.top_k(0, 2)] == [p.id for p in db.top_k(0, 2)]
    assert db2.next_id() == db.next_id() == 6
    new = LINUCB.format(lam=0.5)  # clustering state survived: joins the LinUCB cluster
    db.add(prog(7, new, -0.3))
    db2.add(prog(7, new, -0.3))
    assert db2.all_programs()[-1].cluster == db.all_programs()[-1].cluster == "c1"
    with pytest.raises(ValueError, match="buffer_size"):
        ProgramDatabase(explore_settings(islands=2, buffer_size=8, clusters=8)).load_state_dict(state)


# ---- prompts ------------------------------------------------------------------------------
def test_prompt_shows_versions_worst_to_best_with_scores_and_ends_with_prefill():
    best = prog(3, "import numpy as np\nW = 5\n\n" + GREEDY.format(w=1).split("\n\n", 1)[1], -0.1)
    worse = prog(1, RANDOM, -0.612)
    system, user, prefill = build_prompt(SPEC, [best, worse], critique="Try a   window.")
    assert system == SPEC.system
    assert user.index("# v0: score -0.612") < user.index("# v1: score -0.1")
    assert "random.randrange" in user and "Reviewer note: Try a window." in user
    assert "Write v2" in user and "- Use numpy only." in user
    # the best parent's preamble (imports, constants) precedes the signature, and its opening
    # body comment follows it (indentation and "rewrite this" mode, no statement committed)
    assert prefill == ("```python\nimport numpy as np\nW = 5\n\n"
                       "def policy(contexts, history, t, state):\n"
                       "    # greedy on the mean reward of each arm")
    # no parents: still a prefilled header
    _, user0, prefill0 = build_prompt(SPEC, [])
    assert "v0:" not in user0 and prefill0 == "```python\ndef policy(contexts, history, t, state):"
    # never a bare trailing newline: "\n" + indentation is one BPE token, a lone "\n" token
    # made SmolLM2 start at column 0 and leave the function
    assert not prefill.endswith("\n") and not prefill0.endswith("\n")
    with pytest.raises(ValueError, match="signature"):
        build_prompt(PromptSpec("s", "p", "policy(x)", "policy"), [])


def test_prompt_prefill_plus_parent_body_is_a_valid_program():
    _, _, prefill = build_prompt(SPEC, [prog(0, LINUCB.format(lam=1.0), -0.3)])
    body = split_program(LINUCB.format(lam=1.0), "policy")[1].split("\n", 1)[1]
    code = extract_program(prefill, "\n" + body + "\n```\nDone.", "policy")
    assert code is not None and ast.parse(code)
    assert "np.linalg.inv" in code and "Done" not in code


# ---- extraction ---------------------------------------------------------------------------
PREFILL = "```python\nimport numpy as np\n\ndef policy(contexts, history, t, state):"


@pytest.mark.parametrize("completion, must_have, must_not", [
    ("    return int(np.argmax(contexts[:, 0]))\n```\nThis picks arm 0.", "np.argmax", "picks"),
    ("    x = 1\n    return x\n\nThis function always returns 1.\n", "return x", "always"),
    ("    s = contexts.sum(1)\n    for a in range(5):\n        s[a] += 1\n    return int(np.argm",
     "s[a] += 1", "argm"),
    ("def policy(contexts, history, t, state):\n    return 2\n```", "return 2", "```"),
    ("x = 3\nreturn x\n```", "    return x", "```"),
    ("\treturn 4\n```", "    return 4", "\t"),
    ("    return 0\n\nprint(policy(1, 2, 3, 4))\nif __name__ == '__main__':\n    policy(1,2,3,4)\n```",
     "return 0", "print"),
    ("    return _helper(contexts)\n\ndef _helper(c):\n    return 0\n```", "def _helper", "```"),
    ("```python\ndef policy(contexts, history, t, state):\n    return np.int64(3)\n```",
     "np.int64(3)", "```"),
])
def test_extraction_repairs_messy_completions(completion, must_have, must_not):
    code = extract_program(PREFILL, "\n" + completion, "policy")  # samples open with "\n   "
    assert code is not None, completion
    tree = ast.parse(code)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "policy" for n in tree.body)
    assert must_have in code and must_not not in code
    assert code.startswith("import numpy as np")  # imports from the prefill are kept


def test_extraction_when_the_sampler_dropped_the_line_break():
    code = extract_program(PREFILL, "    x = 1\n    return x\n```", "policy")
    assert code == "import numpy as np\n\ndef policy(contexts, history, t, state):\n    x = 1\n    return x\n"


@pytest.mark.parametrize("completion", ["I'm sorry, I cannot write code.", "```\nHere you go.", "",
                                        "Sure! Here is the policy:\n"])
def test_extraction_returns_none_without_usable_code(completion):
    assert extract_program(PREFILL, completion, "policy") is None


def test_extraction_of_external_code_without_prefill():
    text = "Here is my patch:\nimport math\ndef policy(c, h, t, s):\n    return 1\nThat's it."
    assert extract_program("", text, "policy") == "import math\n\ndef policy(c, h, t, s):\n    return 1\n"
    # parses but lacks the entry point: returned, the sandbox classifies it
    assert extract_program("", "def pick(c):\n    return 1\n", "policy") == "def pick(c):\n    return 1\n"


def test_a_candidates_invalid_escape_prints_no_warning_in_the_host():
    """A program's own invalid escape (a SyntaxWarning from Python 3.12, a DeprecationWarning
    before) is the candidate's: extraction and the duplicate key parse it without a warning
    (as an error here, it would cut the program at that line)."""
    text = 'def policy(c, h, t, s):\n    label = "\\E"\n    return 0\n'
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert extract_program("", text, "policy") == text
        assert code_key(text) == code_key(text + "\n# a comment\n")
        assert parse(text) is not None


# ---- preference pairs D_k -----------------------------------------------------------------
def phase_programs() -> tuple[ProgramDatabase, list[Program]]:
    db = ProgramDatabase(explore_settings(islands=2, buffer_size=32, clusters=8))
    rows = [  # (island, prompt, code, score or None)
        (0, "P0", GREEDY.format(w=1), -0.10), (0, "P0", GREEDY.format(w=2), -0.30),
        (0, "P0", "bad", None), (0, "P0", LINUCB.format(lam=1.0), -0.20),
        (0, "P1", RANDOM, -0.50), (0, "P1", "bad", None),
        (1, "Q0", GREEDY.format(w=9), -0.40), (1, "Q0", RANDOM, -0.40),  # tie: no pair
    ]
    out = []
    for i, (island, prompt, code, score) in enumerate(rows):
        p = prog(db.next_id(), code, score, island=island, prompt=prompt, completion=f"c{i}")
        db.add(p)
        out.append(p)
    return db, out


def test_pairs_share_the_prompt_and_order_scores():
    db, programs = phase_programs()
    pairs = build_pairs(db, programs, top_k=2, max_pairs=100, score_threshold=None, seed=0)
    by_id = {p.id: p for p in programs}
    assert pairs, "expected pairs"
    for pr in pairs:
        c, r = by_id[pr.chosen_id], by_id[pr.rejected_id]
        assert c.prompt == r.prompt == pr.prompt and pr.chosen == c.completion
        assert pr.rejected == r.completion and pr.island == c.island
        if pr.kind == PASSED_VS_PASSED:
            assert r.passed and pr.chosen_score > pr.rejected_score
        else:
            assert pr.kind == PASSED_VS_FAILED and not r.passed
            assert pr.rejected_score == -math.inf
    got = {(pr.chosen_id, pr.rejected_id, pr.kind) for pr in pairs}
    # island 0 top-2 (coverage-aware) = greedy -0.10 (id 0) and LinUCB -0.20 (id 3)
    assert got == {(0, 1, PASSED_VS_PASSED), (0, 3, PASSED_VS_PASSED), (0, 2, PASSED_VS_FAILED),
                   (3, 1, PASSED_VS_PASSED), (3, 2, PASSED_VS_FAILED)}
    assert json.dumps([pr.to_dict() for pr in pairs])  # metadata serialises


def test_pair_threshold_cap_and_kind_balance():
    db, programs = phase_programs()
    only_best = build_pairs(db, programs, top_k=2, max_pairs=100, score_threshold=-0.15, seed=0)
    assert {pr.chosen_id for pr in only_best} == {0}
    capped = build_pairs(db, programs, top_k=2, max_pairs=2, score_threshold=None, seed=0)
    assert len(capped) == 2 and {pr.kind for pr in capped} == {PASSED_VS_PASSED, PASSED_VS_FAILED}
    assert build_pairs(db, programs, top_k=2, max_pairs=0, score_threshold=None, seed=0) == []
    with pytest.raises(ValueError, match="dpo.score_threshold"):
        build_pairs(db, programs, top_k=2, max_pairs=4, score_threshold=float("nan"), seed=0)


def test_failure_floor_is_below_every_passed_score():
    _, programs = phase_programs()
    floor = failure_floor(programs)
    assert floor == pytest.approx(-0.50 - 0.40)
    assert failure_floor([prog(0, "x", None)]) == -1.0


# ---- gate subset G_k ----------------------------------------------------------------------
def gate_programs() -> list[Program]:
    out, pid = [], 0
    for k in range(12):
        for j in range(3):
            score = None if j == 2 else -0.1 * (k + j)
            out.append(prog(pid, "x", score, prompt=f"prompt{k}", completion=f"p{k}c{j}"))
            pid += 1
    out.append(prog(pid, "x", -0.1, prompt="single", completion="only"))  # one completion only
    # all completions score the same: no signal for the gate (every policy scores it -0.2)
    out += [prog(pid + 1 + j, "x", -0.2, prompt="tied", completion=f"t{j}") for j in range(3)]
    out += [prog(pid + 4 + j, "x", None, prompt="failed", completion=f"f{j}") for j in range(2)]
    return out


def test_gate_prompts_put_informative_prompts_first_fresh_per_seed():
    programs = gate_programs()
    a, b = gate_prompts(programs, seed=1, size=4), gate_prompts(programs, seed=2, size=4)
    assert a == gate_prompts(programs, seed=1, size=4)  # deterministic (resume-exact)
    assert len(a) == 4 and set(a) != set(b)
    assert set(a) | set(b) <= {f"prompt{k}" for k in range(12)}
    everything = gate_prompts(programs, seed=0, size=100)
    assert len(everything) == 15 and set(everything[:12]) == {f"prompt{k}" for k in range(12)}
    # a tie, a lone completion and an all-failed prompt only fill in, in seeded order
    assert set(everything[12:]) == {"single", "tied", "failed"}
    assert gate_prompts(programs, seed=0, size=0) == []
    with pytest.raises(ValueError, match=r"must be >= 0.*gate.subset_size"):
        gate_prompts(programs, seed=0, size=-1)


def test_the_hold_out_is_the_head_of_the_gate_order():
    from atlas.dpo.config import GateConfig

    programs = gate_programs()
    for seed in range(5):
        held = hold_out_prompts(programs, GateConfig(holdout=0.25, subset_size=8), seed)
        assert held == gate_prompts(programs, seed, 4)  # round(0.25 * 15) prompts
    assert hold_out_prompts(programs, GateConfig(holdout=0.9, subset_size=3), 0) == \
        gate_prompts(programs, 0, 3)


def test_gate_items_hold_every_completion_of_their_prompts():
    programs = gate_programs()
    order = ["prompt3", "tied", "prompt0"]
    items = gate_items(programs, order)
    assert [g.prompt for g in items] == order
    floor = failure_floor(programs)
    g = items[0]
    assert g.completions == ["p3c0", "p3c1", "p3c2"] and g.scores[2] == floor
    assert g.scores[:2] == [pytest.approx(-0.3), pytest.approx(-0.4)]
    assert g.preferred == "p3c0"  # the best-scored completion
    assert items[1].preferred == "t0"  # a tie goes to the first filed
    custom = gate_items(programs, ["prompt1"], failure_score=-5.0)
    assert custom[0].scores[2] == -5.0
    with pytest.raises(ValueError, match="failure_score must be finite"):
        gate_items(programs, ["prompt1"], failure_score=float("-inf"))
    with pytest.raises(ValueError, match="no evaluated completion"):
        gate_items(programs, ["never served"])


def test_database_rejects_bad_settings_by_field_name():
    with pytest.raises(ValueError, match="explore.buffer_size must be >= 1"):
        explore_settings(buffer_size=0)
    with pytest.raises(ValueError, match="explore.topk_pool_factor must be >= 1"):
        explore_settings(topk_pool_factor=0.5)
    with pytest.raises(ValueError, match="explore.cluster_similarity must be > 0"):
        explore_settings(cluster_similarity=0.0)
    with pytest.raises(ValueError, match="top_k"):
        select_top_k([], -1)
    assert select_top_k([prog(0, RANDOM, -0.1)], 0) == []
    db = ProgramDatabase(explore_settings(islands=3, buffer_size=5, clusters=2,
                                          topk_pool_factor=1.0, cluster_similarity=0.9))
    assert (db.num_islands, db.buffer_size, db.max_clusters, db.pool_factor) == (3, 5, 2, 1.0)
    assert db.cluster_similarity == 0.9


def test_regime_queries_pick_the_incumbents_once_and_trace_rescores_to_their_origin():
    """best_score compares within one equation; incumbents are the seed, the best of any
    source and the agent's best on it, each once, named by the program a re-score measured."""
    db = ProgramDatabase(explore_settings(islands=1, buffer_size=8, clusters=4))
    old, new = '{"nu": 1}', '{"nu": 2}'

    def add(pid, code, score, source, regime=old, parents=()):
        p = prog(pid, code, score)
        p.source, p.regime, p.parents = source, regime, list(parents)
        db.add(p, buffer=source != "rescore")
        return p

    seed = add(0, RANDOM, -3.0, "seed")
    agent = add(1, GREEDY.format(w=5), -2.0, "agent")
    patch = add(2, LINUCB.format(lam=1.0), -1.0, "supporter")
    add(3, GREEDY.format(w=9), None, "agent")  # failed: never an incumbent
    add(4, RANDOM, -0.5, "agent", regime=new)  # scored on another equation
    assert db.best_score(old) == -1.0 and db.best_score(new) == -0.5
    assert db.best_score('{"nu": 3}') == -math.inf
    assert [(p.id, s) for p, s in db.incumbents(old)] == [(0, -3.0), (2, -1.0), (1, -2.0)]
    # on the new equation: a re-score of the seed beats the agent's program there, and is
    # reported as the seed (its origin); a re-score of the same code is not picked twice
    again = add(5, RANDOM, -0.1, "rescore", regime=new, parents=[seed.id])
    assert db.origin(again) is seed and db.origin(agent) is agent and db.origin(patch) is patch
    assert [(p.id, s) for p, s in db.incumbents(new)] == [(0, -0.1)]
