"""The behaviour fingerprint: ``same_behaviour`` under hidden inputs of each program's own.

Each bandit or bin-packing program faces hidden inputs drawn from the secret and its own
program key (``atlas.sandbox.inputs``), so two programs that behave the same no longer score
the same. The scorer also lets a twin of the program play a public input and hashes its
actions (``atlas.sandbox.behaviour``); ``atlas.novelty`` compares those fingerprints. These
tests show that a rewrite keeps its original's fingerprint while its score moves, that a
program that plays otherwise gets another, that the public input changes no score, and that
the fingerprint is the scorer's, not the candidate's word.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from atlas.evolution.database import ProgramDatabase
from atlas.novelty import NEW, SAME_BEHAVIOUR, NoveltyIndex, labelled
from atlas.sandbox import Resources, Sandbox, TaskSpec
from atlas.sandbox.behaviour import check_behaviour, fingerprint
from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.inputs import program_key
from atlas.sandbox.protocol import ProtocolError, validate_evaluation
from atlas.tasks.bandit import BanditTask
from atlas.tasks.bandit.evaluator import PUBLIC_STEPS, BanditScorer, public_env, unpack_floats
from atlas.tasks.binpacking import BinPackingTask
from atlas.tasks.binpacking.evaluator import BinPackingScorer, public_instance
from atlas.types import Evaluation, FailureKind, Program
from tests.conftest import explore_settings
from tests.test_novelty import _prog
from tests.test_relays import ARM0, MODES, SECRET, TASK, _sandbox

REGIME = "{}"
#: the seed policy (sliding-window LinUCB) with every name it binds renamed: a rewrite
RENAMES = {"state": "memory", "contexts": "arms_x", "history": "past", "window": "span"}
#: epsilon-greedy on numpy's global random stream, steered by a module-level sum of every
#: reward it saw, which also decides how many numbers it draws: where the twin started from
#: the scored copy's module or random streams, its play would follow the hidden inputs
EPS = '''import numpy as np

TOTAL = [0.0]


def policy(contexts, history, t, state):
    if history:
        TOTAL[0] += history[-1][2]
        if history[-1][2] > 0:
            np.random.rand()
    if np.random.rand() < 0.3:
        return int(np.random.randint(contexts.shape[0]))
    return int(np.argmax(contexts[:, int(abs(TOTAL[0]) * 1000) % contexts.shape[1]]))
'''
GREEDY = ("import numpy as np\n\ndef policy(contexts, history, t, state):\n"
          "    return int(np.argmax(contexts.sum(axis=1)))\n")
BP_FIRST_FIT = ("import numpy as np\n\ndef priority(item, bins):\n"
                "    return -np.arange(len(bins), dtype=float)\n")


def _rename(code: str) -> str:
    for old, new in RENAMES.items():
        code = code.replace(old, new)
    return code


def _with(task, behaviour: bool) -> Sandbox:
    """The task's sandbox, its scorer with or without the public input."""
    spec = TaskSpec.of(task)
    spec = replace(spec, evaluator_config={**spec.evaluator_config, "behaviour": behaviour},
                   timeout_s=60.0)
    return Sandbox(spec, resources=Resources(workers=1), secret=SECRET)


def _bandit(behaviour: bool = True) -> Sandbox:
    return _with(BanditTask(**TASK), behaviour)


def _binpacking(behaviour: bool = True) -> Sandbox:
    return _with(BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=8), behaviour)


def _filed(pid: int, code: str, ev: Evaluation, parents=()) -> Program:
    return Program(id=pid, island=0, round=1, code=code, evaluation=ev, parents=list(parents),
                   regime=REGIME, prompt="p", completion=code)


@pytest.mark.parametrize("mode", MODES)
def test_a_rewrite_keeps_its_fingerprint_and_is_labelled_same_behaviour(mode):
    """The seed policy with its names changed faces other hidden environments (another
    program key) and scores otherwise, but plays the public environment arm for arm as the
    seed: same fingerprint, ``same_behaviour``. By score alone it would be ``new`` (the blind
    spot the fingerprint closes). So for a random policy with module-level state. A policy
    that plays otherwise has another fingerprint and is ``new``."""
    seed = BanditTask(**TASK).seed_program()
    renamed = _rename(seed)
    assert program_key(renamed) != program_key(seed) and renamed != seed
    with _sandbox(mode) as sb:
        ev = dict(zip(["seed", "renamed", "eps", "eps2", "greedy"], sb.evaluate_many(
            [seed, renamed, EPS, EPS.replace("TOTAL", "RUNNING"), GREEDY], {"round": 1})))
    assert all(e.passed and e.behaviour for e in ev.values()), ev
    assert ev["renamed"].score != ev["seed"].score  # its own environments
    assert ev["renamed"].behaviour == ev["seed"].behaviour
    assert ev["eps2"].score != ev["eps"].score and ev["eps2"].behaviour == ev["eps"].behaviour
    assert len({ev[k].behaviour for k in ("seed", "eps", "greedy")}) == 3

    index = NoveltyIndex("policy")
    origin = _filed(0, seed, ev["seed"])
    index.add_program(origin)
    index.add_program(_filed(1, EPS, ev["eps"]))

    def label(name: str, code: str, **kw) -> str:
        return index.label(code, ev[name].score, REGIME, [origin], **kw)

    assert label("renamed", renamed, behaviour=ev["renamed"].behaviour) == SAME_BEHAVIOUR
    assert label("eps2", EPS.replace("TOTAL", "RUNNING"),
                 behaviour=ev["eps2"].behaviour) == SAME_BEHAVIOUR
    assert label("greedy", GREEDY, behaviour=ev["greedy"].behaviour) == NEW
    assert label("renamed", renamed) == NEW  # by its score: blind under own inputs


def test_a_bin_packing_rewrite_keeps_its_fingerprint():
    """Best fit with its names changed packs its own instances (another score) and the
    public instance bin for bin as the seed; first fit packs it otherwise."""
    seed = BinPackingTask().seed_program()
    renamed = seed.replace("item", "size").replace("bins", "space")
    with _binpacking() as sb:
        a, b, ff = sb.evaluate_many([seed, renamed, BP_FIRST_FIT], {})
    assert a.passed and b.passed and ff.passed, (a, b, ff)
    assert a.score != b.score and a.behaviour == b.behaviour
    assert ff.behaviour not in (None, a.behaviour)
    index = NoveltyIndex("priority")
    index.add_program(_filed(0, seed, a))
    assert index.label(renamed, b.score, REGIME, behaviour=b.behaviour) == SAME_BEHAVIOUR
    assert index.label(BP_FIRST_FIT, ff.score, REGIME, behaviour=ff.behaviour) == NEW


#: plays the seed's rule but answers 7 (not an arm) on the public environment's 100th step,
#: which it recognises by its contexts (the public seed is public): the twin raises there
RECOGNISER = '''import numpy as np

PUBLIC_X = np.array(PUBLIC_CONTEXTS)


def policy(contexts, history, t, state):
    if t == 100 and np.array_equal(contexts, PUBLIC_X):
        return 7
    return int(np.argmax(contexts.sum(axis=1)))
'''


def test_the_public_input_changes_no_score():
    """With the public input and without it (``behaviour: false``), a program scores the
    same to the last bit, its metrics too: the deterministic seed, a random policy whose
    counter and draws are module-level, and a program whose twin raises on the public
    environment (its play there ends, recorded in its fingerprint; the program passes). Bin
    packing's seed likewise."""
    public = public_env(BanditTask(**TASK).evaluator_config())
    recogniser = RECOGNISER.replace("PUBLIC_CONTEXTS", repr(public.contexts[100].tolist()))
    codes = [BanditTask(**TASK).seed_program(), EPS, recogniser, GREEDY]
    runs = {}
    for behaviour in (True, False):
        with _bandit(behaviour) as sb:
            runs[behaviour] = sb.evaluate_many(codes, {"round": 1})
    for on, off in zip(runs[True], runs[False]):
        assert on.passed and off.passed, (on, off)
        assert (on.score, on.metrics) == (off.score, off.metrics)
        assert on.behaviour is not None and off.behaviour is None
    stopped, greedy = runs[True][2].behaviour, runs[True][3].behaviour
    assert stopped != greedy  # the same play up to step 100, then the twin raised
    bp = {}
    for behaviour in (True, False):
        with _binpacking(behaviour) as sb:
            bp[behaviour] = sb.evaluate(BinPackingTask().seed_program(), {})
    assert (bp[True].score, bp[True].metrics) == (bp[False].score, bp[False].metrics)
    assert bp[True].behaviour is not None and bp[False].behaviour is None


class _ScriptedLink:
    """A runner that answers the scorer from a function of its message (no process)."""

    def __init__(self, answer):
        self.answer, self.last, self.sent = answer, None, []

    def send(self, msg):
        self.last = msg
        self.sent.append(msg)

    def recv(self, timeout_s=None):
        return self.answer(self.last)


def test_the_fingerprint_is_the_scorers_not_the_candidates(monkeypatch):
    """The fingerprint is the hash the trusted scorer makes of the actions it received; a
    runner that answers the public environment with anything but its arms, or packs the
    public instance invalidly, is ``tampered``; a frame whose evaluation carries anything but
    hex digits is refused, and a failed evaluation carries none."""
    from atlas.tasks.bandit import evaluator

    monkeypatch.setattr(evaluator, "PUBLIC_CHUNK", 200)  # three messages of the public play
    scorer = BanditScorer(BanditTask(**{**TASK, "T": 1200}).evaluator_config(), SECRET)
    horizon = PUBLIC_STEPS  # the public environment's, whatever the task's
    assert scorer.public.horizon == horizon < 1200

    def runner(public):
        """Arm 0 on the hidden environments; ``public(steps, t0)`` on the public one."""
        def answer(m):
            if "public" in m:
                return {"p": public(len(unpack_floats(m["r"], -1, TASK["K"])), m["public"])}
            return {"a": [0] * len(m["x"])}
        return answer

    honest = scorer.score(ARM0, {}, _ScriptedLink(runner(lambda n, t0: [0] * n)))
    assert honest.behaviour == fingerprint("bandit", [0] * horizon)
    for forged in ([7], [-1], ["0"], [1.0], [True], 0, None):
        link = _ScriptedLink(runner(lambda n, t0, f=forged: f * n if isinstance(f, list) else f))
        with pytest.raises(CandidateError) as err:
            scorer.score(ARM0, {}, link)
        assert err.value.kind == FailureKind.TAMPERED
    too_many = _ScriptedLink(runner(lambda n, t0: [0] * (n + 1)))
    with pytest.raises(CandidateError):
        scorer.score(ARM0, {}, too_many)
    # a twin that raised answers fewer arms: its play ends there, and no more is asked
    link = _ScriptedLink(runner(lambda n, t0: [0] * 5))
    assert scorer.score(ARM0, {}, link).behaviour == fingerprint("bandit", [0] * 5, 5)
    assert [m["public"] for m in link.sent if "public" in m] == [0]
    link = _ScriptedLink(runner(lambda n, t0: [1] * (n if t0 == 0 else 3)))
    assert scorer.score(ARM0, {}, link).behaviour == fingerprint("bandit", [1] * 203, 203)
    assert [m["public"] for m in link.sent if "public" in m] == [0, 200]

    task = BinPackingTask(weibull_count=1, weibull_items=50, audit_steps=0)
    bp = BinPackingScorer(task.evaluator_config(), SECRET)
    assert bp.public is not None and len(bp.public.items) == 50
    n = len(bp.public.items)

    def packer(bad):
        def answer(m):
            if m.get("done"):
                return {}
            if "public" in m:
                return bad
            return {"assign": list(range(len(m["items"])))}  # a bin each: valid
        return answer

    ok = bp.score("x", {}, _ScriptedLink(packer({"assign": list(range(n))})))
    assert ok.behaviour == fingerprint("binpacking", list(range(n)))
    for bad in ({"assign": [0] * n}, {"assign": None}, {"assign": None, "stopped": n}):
        with pytest.raises(CandidateError) as err:
            bp.score("x", {}, _ScriptedLink(packer(bad)))
        assert err.value.kind == FailureKind.TAMPERED

    frame = {"score": -0.5, "passed": True, "failure_kind": "ok", "metrics": {}}
    assert validate_evaluation({**frame, "behaviour": "ab" * 16}).behaviour == "ab" * 16
    for bad in ("AB" * 16, "xyz", 12, "a" * 200, ["ab"]):
        with pytest.raises(ProtocolError):
            validate_evaluation({**frame, "behaviour": bad})
    failed = {"score": None, "passed": False, "failure_kind": "exception",
              "behaviour": "ab" * 16}
    assert validate_evaluation(failed).behaviour is None
    assert check_behaviour(None) is None


def test_public_inputs_come_from_the_public_seed_not_the_secret():
    """The public bandit environment and bin-packing instance are the same whatever the
    secret or the program: built from ``PUBLIC_SEED`` and the task's shape."""
    config = BanditTask(**TASK).evaluator_config()
    a, b = BanditScorer(config, SECRET), BanditScorer(config, "6f" * 32)
    assert a.public is not None and b.public is not None
    assert np.array_equal(a.public.rewards, b.public.rewards)
    assert a.public.horizon == TASK["T"]
    assert all(not np.array_equal(a.public.rewards, env.rewards)
               for env in a.envs_for(ARM0, {}))
    bp = BinPackingTask().evaluator_config()
    assert public_instance(bp) == public_instance(json.loads(json.dumps(bp)))
    assert len(public_instance(bp).items) == 1000
    assert public_instance({**bp, "behaviour": False}) is None


def test_the_fingerprint_survives_the_record_round_trip():
    """``Evaluation.behaviour`` goes into ``programs.jsonl`` (``Program.to_dict``, as the
    run writes it) and comes back (``Program.from_dict``, a resume); labelling replayed
    from records (``atlas.novelty.labelled``) compares it as the run's database does, and
    the database's state keeps it."""
    fp, other = fingerprint("bandit", [0, 1, 2]), fingerprint("bandit", [2, 1, 0])
    seed = Program(id=0, island=0, round=0, code=ARM0, regime=REGIME, source="seed",
                   evaluation=Evaluation(score=-0.5, passed=True, behaviour=fp))
    rewrite = _filed(1, ARM0.replace("state", "s"), Evaluation(score=-0.4, passed=True,
                                                               behaviour=fp), parents=[0])
    other_play = _filed(2, ARM0.replace("return 0", "return t % 5"),
                        Evaluation(score=-0.5, passed=True, behaviour=other), parents=[0])
    lines = [json.dumps(p.to_dict()) for p in (seed, rewrite, other_play)]
    back = [Program.from_dict(json.loads(line)) for line in lines]
    assert [p.evaluation.behaviour for p in back] == [fp, fp, other]
    assert back[1].evaluation == rewrite.evaluation
    records = labelled([json.loads(line) for line in lines], "policy")
    # equal fingerprint, other score: the same behaviour; equal score, other fingerprint: new
    assert [r["novelty"] for r in records] == ["", SAME_BEHAVIOUR, NEW]
    # the run's own labelling (the database files them) and its resume (state round trip)
    db = ProgramDatabase(explore_settings(islands=1, temperatures=[0.5]), 0,
                         entry_point="policy")
    for p in back:
        p.novelty = ""
        db.add(p)
    assert [p.novelty for p in back] == ["", SAME_BEHAVIOUR, NEW]
    again = ProgramDatabase(explore_settings(islands=1, temperatures=[0.5]), 0,
                            entry_point="policy")
    again.load_state_dict(json.loads(json.dumps(db.state_dict())))
    assert [p.evaluation.behaviour for p in again.all_programs()] == [fp, fp, other]
    assert again.novelty.behaviours[REGIME] == {fp, other}
    failed = Evaluation.failure(FailureKind.EXCEPTION, "x")
    assert Evaluation.from_dict(failed.to_dict()).behaviour is None
    assert Evaluation.from_dict({"score": -1.0, "passed": True, "behaviour": 3}).behaviour \
        is None
    assert not math.isfinite(Evaluation.from_dict(failed.to_dict()).score)


def test_labels_compare_fingerprints_where_both_have_one_and_scores_where_not():
    """Within a regime: two fingerprints decide alone (an equal score with another one is
    ``new``); a program without one (PINN, an older record) is compared by score, both
    ways; regimes never mix."""
    index = NoveltyIndex("policy")
    index.add(0, "def policy(c, h, t, s):\n    return 0\n", -0.5, "r", "aa" * 16)
    index.add(1, "def policy(c, h, t, s):\n    return 1\n", -0.7, "r")  # no fingerprint
    assert index.same_behaviour(-0.1, "r", "aa" * 16)  # its fingerprint, another score
    assert not index.same_behaviour(-0.5, "r", "bb" * 16)  # its score, another fingerprint
    assert index.same_behaviour(-0.7, "r", "bb" * 16)  # vs. one without: by score
    assert index.same_behaviour(-0.5, "r") and index.same_behaviour(-0.7, "r")  # none: scores
    assert not index.same_behaviour(-0.1, "other", "aa" * 16)  # per regime
    assert not index.same_behaviour(None, "r", "aa" * 16)  # failed: never
    prog = _prog(5, "def policy(c, h, t, s):\n    return 2\n", -0.3)
    prog.evaluation.behaviour = "cc" * 16
    index.add_program(prog)
    assert index.same_behaviour(-0.9, "r", "cc" * 16)
