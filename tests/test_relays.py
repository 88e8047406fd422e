"""Issue 56: a relay between candidates through the kernel's caches forges no score.

The kernel's caches (names looked up that do not exist, pages read) are shared by every
process, so one candidate can leave marks there that the next one reads back by timing
(docs/sandbox.md, "Known residual channels"). These tests run such relays as attacks that
must fail: each program faces hidden inputs of its own (``atlas.sandbox.inputs``), so what a
sender learnt in hindsight about its inputs is worth nothing to a receiver facing other
ones, and a program is scored once, so it cannot relay to a later run of itself. Each test
first shows, in the same sandbox, that the relay does carry its message (a sender and a
receiver made to face the same inputs, as every candidate did before): an attack that could
not try would pass for the wrong reason.
"""

from __future__ import annotations

import os
import statistics

import pytest

from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.inputs import INPUTS_OF, program_key
from atlas.sandbox.isolation import probe_bwrap
from atlas.tasks.bandit import BanditTask
from atlas.tasks.bandit.evaluator import build_envs
from atlas.tasks.binpacking.evaluator import load_instances

MODES = ["rlimits", pytest.param("bwrap", marks=pytest.mark.skipif(
    not probe_bwrap()[0], reason="bubblewrap unusable here"))]
SECRET = "5e" * 32
ARM0 = "def policy(contexts, history, t, state):\n    return 0\n"
#: a small bandit whose drifting parameter a sender can estimate well in hindsight
TASK = dict(T=200, K=5, d=5, env_seeds=[0, 1], noise_sigma=0.05, drift_budget=2.0)
PILOT = [1, 0] * 8

#: plays uniformly at random (for a good regression), then at its last step estimates each
#: environment's drifting parameter in hindsight (ridge regression on a window around every
#: step, future steps included), turns it into the best arm of every step and sends those
#: arms, 3 bits each after the pilot bits, as missing names looked up in the standard
#: library's folder; once a process: the program's twin, which plays the public environment
#: after it (``atlas.sandbox.behaviour``), would send its own arms over the message
SENDER = '''import os

import numpy as np

NAMES = [os.path.join(FOLDER, "atlas-relay-" + NONCE + "-" + str(i)) for i in range(N_NAMES)]
PILOT = [1, 0] * 8
SEEN = []


def _send(bits):
    for name, bit in zip(NAMES, PILOT + bits):
        if bit:
            try:
                os.stat(name)
            except OSError:
                pass


def _best_arms(state):
    X, r, C = np.array(state["x"]), np.array(state["r"]), state["contexts"]
    arms = []
    for t in range(len(C)):
        lo, hi = max(0, t - 15), min(len(r), t + 16)
        A = X[lo:hi].T @ X[lo:hi] + 1e-3 * np.eye(X.shape[1])
        theta = np.linalg.solve(A, X[lo:hi].T @ r[lo:hi])
        arms.append(int(np.argmax(C[t] @ theta)))
    return arms


def policy(contexts, history, t, state):
    if t == 0:
        SEEN.append(state)
        state.update(x=[], r=[], contexts=[], rng=np.random.default_rng(len(SEEN)))
    if history:
        arm, x, reward = history[-1]
        state["x"].append(np.asarray(x))
        state["r"].append(float(reward))
    state["contexts"].append(np.array(contexts))
    arm = int(state["rng"].integers(contexts.shape[0]))
    if t == HORIZON - 1 and state is SEEN[-1] and not getattr(os, "relay_sent", False):
        os.relay_sent = True  # the last call of the episode: send, not again from its twin
        bits = []
        for s in SEEN:
            for a in _best_arms(s):
                bits += [(a >> 2) & 1, (a >> 1) & 1, a & 1]
        _send(bits)
    return arm
'''

#: times its lookup of each name, decodes the arms with a threshold learnt from the pilot
#: bits and plays them; where the pilot bits do not decode (nothing was sent), arm 0
RECEIVER = '''import math
import os
import time

NAMES = [os.path.join(FOLDER, "atlas-relay-" + NONCE + "-" + str(i)) for i in range(N_NAMES)]
PILOT = [1, 0] * 8
RELAY = []
ENVS = []


def _receive():
    times = []
    for name in NAMES:
        t0 = time.perf_counter()
        try:
            os.stat(name)
        except OSError:
            pass
        times.append(math.log(max(time.perf_counter() - t0, 1e-9)))
    ones = sorted(x for x, b in zip(times, PILOT) if b)[4]
    zeros = sorted(x for x, b in zip(times, PILOT) if not b)[4]
    cut = (ones + zeros) / 2
    bits = [int((x > cut) == (ones > zeros)) for x in times]
    if sum(a != b for a, b in zip(bits, PILOT)) > 2 or ones >= zeros:
        return []
    body = bits[len(PILOT):]
    return [body[i] * 4 + body[i + 1] * 2 + body[i + 2] for i in range(0, len(body) - 2, 3)]


def policy(contexts, history, t, state):
    if not RELAY:
        RELAY.append(_receive())
    if t == 0:  # the environments begin in order, each with a state of its own
        state["env"] = len(ENVS)
        ENVS.append(state)
    arms, i = RELAY[0], state["env"] * HORIZON + t
    if i < len(arms) and arms[i] < contexts.shape[0]:
        return arms[i]
    return 0
'''


def _programs(nonce: str) -> tuple[str, str]:
    n = len(PILOT) + 3 * TASK["T"] * len(TASK["env_seeds"])
    fill = {"FOLDER": repr(os.path.dirname(os.__file__)), "NONCE": repr(nonce),
            "N_NAMES": str(n), "HORIZON": str(TASK["T"])}
    out = []
    for template in (SENDER, RECEIVER):
        for key, value in fill.items():
            template = template.replace(key, value)
        out.append(template)
    return out[0], out[1]


def _sandbox(mode: str, **confinement: object) -> Sandbox:
    return Sandbox.for_task(BanditTask(**TASK), secret=SECRET,
                            resources=Resources(workers=1, memory_mb=1024),
                            confinement=Confinement(isolation=mode, **confinement))


def test_a_program_key_ignores_comments_layout_and_docstrings_only():
    """The same program with other comments, blank lines or docstrings faces the same inputs;
    any change of its code, a no-op statement included, faces others."""
    base = "def policy(c, h, t, s):\n    return 0\n"
    same = ['"""A policy."""\n# arm 0\n\n\ndef policy(c, h, t, s):\n    """Doc."""\n'
            '    return 0  # always\n', "def policy(c,h,t,s): return 0\n"]
    other = [base + "_x = 1\n", base.replace("0", "1"), base.replace("s)", "state)")]
    assert all(program_key(code) == program_key(base) for code in same)
    assert len({program_key(code) for code in [base, *other]}) == 1 + len(other)
    assert program_key("def (") != program_key("def )")  # unparsable: by its text


def test_each_program_faces_hidden_inputs_of_its_own():
    """Bandit environments and bin-packing Weibull instances follow the secret and the
    program key: the same key, the same inputs; another key or secret, others. Without a key
    (baselines, the public draw) nothing changes."""
    config = BanditTask(**TASK).evaluator_config()
    a, b = program_key(ARM0), program_key(ARM0 + "_x = 1\n")

    def thetas(secret, key):
        return [env.thetas.tolist() for env in build_envs(config, secret, key)]

    assert thetas(SECRET, a) == thetas(SECRET, a)
    assert thetas(SECRET, a) != thetas(SECRET, b) != thetas(SECRET, None)
    assert thetas(SECRET, a) != thetas("6f" * 32, a)
    assert thetas(None, a) == thetas(None, None)  # no secret: the public environments
    bp = {"weibull": {"count": 2, "n_items": 50, "seed": 0}}
    items = [[i.items for i in load_instances(bp, SECRET, k)] for k in (a, a, b)]
    assert items[0] == items[1] != items[2]


@pytest.mark.parametrize("mode", MODES)
def test_a_hindsight_relay_through_missing_names_forges_no_score(mode):
    """Issue 56's bandit attack: a sender estimates its environments' drifting parameter in
    hindsight and sends every step's best arm (1,200 bits) through missing-name lookups; the
    next candidate plays them. Made to face the sender's inputs (``INPUTS_OF``, the old
    design), the receiver scores far above its honest arm-0 fallback: the relay works here.
    Facing its own inputs, as every program does, it gains nothing over that fallback."""
    nonce = os.urandom(6).hex()
    with _sandbox(mode) as sb:
        sender, receiver = _programs("shared-" + nonce)
        shared = {"round": 1, INPUTS_OF: program_key(receiver)}
        sent = sb.evaluate(sender, shared)
        relayed = sb.evaluate(receiver, {"round": 1})
        fallback = sb.evaluate(ARM0, shared)
        sender, receiver = _programs("own-" + nonce)
        sent_own = sb.evaluate(sender, {"round": 1})
        got = sb.evaluate(receiver, {"round": 1})
        honest = sb.evaluate(ARM0, {"round": 1, INPUTS_OF: program_key(receiver)})
    for ev in (sent, relayed, fallback, sent_own, got, honest):
        assert ev.passed, ev
    gain_shared = relayed.score - fallback.score
    gain_own = got.score - honest.score
    assert gain_shared > 0.2, (relayed.score, fallback.score)  # the relay carried the arms
    assert gain_own < gain_shared / 4, (got.score, honest.score, gain_shared)


@pytest.mark.parametrize("mode", MODES)
def test_a_program_cannot_relay_to_a_later_run_of_itself(mode):
    """A program that looks a fresh missing name up and plays arm 1 where the lookup was
    already cached (a run of it before looked it up) scores the same every time: the sandbox
    scores a program once per regime (a later round included), and a copy with other
    comments is the same program.
    With ``score_once=False`` the second run does play arm 1: the relay would work."""
    stem = os.path.join(os.path.dirname(os.__file__), f"atlas-self-{os.urandom(6).hex()}")
    code = f'''import os
import statistics
import time

NAMES = [{stem!r} + "-" + str(i) for i in range(32)]


def _lookup_us(name):
    t0 = time.perf_counter()
    try:
        os.stat(name)
    except OSError:
        pass
    return (time.perf_counter() - t0) * 1e6


def _cached_before():
    ratios = []
    for name in NAMES:
        probe = [_lookup_us(name) for _ in range(4)]
        ratios.append(probe[0] / min(probe[1:]))
    return statistics.median(ratios) < 1.5


def policy(contexts, history, t, state):
    if t == 0:
        state["again"] = _cached_before()
    return 1 if state["again"] else 0
'''
    with _sandbox(mode) as sb:
        first = sb.evaluate(code, {"round": 1})
        again = sb.evaluate(code, {"round": 1})
        commented = sb.evaluate("# the same, once more\n" + code, {"round": 1})
        later = sb.evaluate(code, {"round": 7})
    assert first.passed and first.to_dict() == again.to_dict() == commented.to_dict() \
        == later.to_dict(), (first, again, commented, later)
    with _sandbox(mode, score_once=False) as sb:
        runs = [sb.evaluate(code.replace(stem, stem + "-control"), {"round": 1})
                for _ in range(2)]
    assert runs[0].passed and runs[1].passed and runs[0].score != runs[1].score, runs


def test_the_variance_a_programs_own_inputs_add_is_measured():
    """What a program's own inputs cost: its score now varies with its key as it varied
    with the secret before (the same spread), and two programs no longer share inputs. The
    seed policy's scores over 12 keys (no-op variants) on the default task's scale, in
    process: their spread is what ``docs/sandbox.md`` reports, and it is below the gap
    between the seed and arm 0 (a comparison of methods can bear it)."""
    from atlas.sandbox.candidate import load_candidate
    from atlas.tasks.bandit.evaluator import score_policy

    task = BanditTask(T=400, env_seeds=[0, 1, 2, 3])
    config = task.evaluator_config()
    seed = load_candidate(task.seed_program(), "policy")
    arm0 = load_candidate(ARM0, "policy")
    seeds, zeros = [], []
    for i in range(12):
        key = program_key(task.seed_program() + f"\n_variant = {i}\n")
        envs = build_envs(config, SECRET, key)
        seeds.append(score_policy(lambda env: seed, envs)[0])
        zeros.append(score_policy(lambda env: arm0, envs)[0])
    spread = statistics.stdev(seeds)
    gap = statistics.mean(seeds) - statistics.mean(zeros)
    assert 0 < spread < gap / 2, (spread, gap, seeds)


#: bin packing: the sender records the first ``N_ITEMS`` items it is given and sends them, 7
#: bits each, through missing names, a pair of names a bit (it looks up the first of the pair
#: for a 1, the second for a 0; the receiver compares the two, which needs no threshold), once
#: a process (its twin's packing of the public instance would overwrite the message); the
#: receiver decodes them, and where they are the items it is given too (32 of 40 suffice: a
#: slow lookup flips a bit now and then), packs worst fit
#: instead of best fit (its score then differs from the honest one). Issue 56's version
#: relayed whole instances and packed them offline
BP_SENDER = '''import os

NAMES = [os.path.join(FOLDER, "atlas-bp-" + NONCE + "-" + str(i)) for i in range(N_NAMES)]
SEEN = []


def priority(item, bins):
    if len(SEEN) < N_ITEMS:
        SEEN.append(int(item))
        if len(SEEN) == N_ITEMS and not getattr(os, "relay_sent", False):
            os.relay_sent = True  # once a process: not again from its twin's public packing
            bits = [(x >> k) & 1 for x in SEEN for k in range(7)]
            for i, bit in enumerate(bits):
                try:
                    os.stat(NAMES[2 * i + (0 if bit else 1)])
                except OSError:
                    pass
    return -(bins - item)
'''

BP_RECEIVER = '''import os
import time

NAMES = [os.path.join(FOLDER, "atlas-bp-" + NONCE + "-" + str(i)) for i in range(N_NAMES)]
RELAY = []
SEEN = []


def _receive():
    times = []
    for name in NAMES:
        t0 = time.perf_counter()
        try:
            os.stat(name)
        except OSError:
            pass
        times.append(time.perf_counter() - t0)
    bits = [int(times[2 * i] < times[2 * i + 1]) for i in range(len(NAMES) // 2)]
    return [sum(bits[i * 7 + k] << k for k in range(7)) for i in range(N_ITEMS)]


def priority(item, bins):
    if not RELAY:
        RELAY.append(_receive())
    if len(SEEN) < N_ITEMS:
        SEEN.append(int(item))
    same = sum(a == b for a, b in zip(SEEN, RELAY[0]))
    if len(SEEN) == N_ITEMS and same >= N_ITEMS - 8:  # they are its own items: act on them
        return bins - item
    return -(bins - item)
'''


@pytest.mark.parametrize("mode", MODES)
def test_a_relay_of_bin_packing_items_reaches_no_later_program(mode):
    """Issue 56's bin-packing relay, scaled down: the sender sends the first 40 items it was
    given; the receiver packs otherwise where they are its own items. Made to face the
    sender's instances (``INPUTS_OF``) the receiver does pack otherwise: the relay works.
    Facing its own, it scores exactly best fit's score on its instances (the seed's, there)."""
    from atlas.tasks.binpacking import BinPackingTask

    task = BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=0)
    n_items = 40
    nonce = os.urandom(6).hex()

    def programs(tag: str) -> tuple[str, str]:
        fill = {"FOLDER": repr(os.path.dirname(os.__file__)), "NONCE": repr(tag + nonce),
                "N_NAMES": str(2 * 7 * n_items), "N_ITEMS": str(n_items)}
        out = []
        for template in (BP_SENDER, BP_RECEIVER):
            for key, value in fill.items():
                template = template.replace(key, value)
            out.append(template)
        return out[0], out[1]

    with Sandbox.for_task(task, secret=SECRET, resources=Resources(workers=1),
                          confinement=Confinement(isolation=mode)) as sb:
        sender, receiver = programs("shared-")
        shared = {**task.context(1), INPUTS_OF: program_key(receiver)}
        sb.evaluate(sender, shared)
        relayed = sb.evaluate(receiver, task.context(1))
        fallback = sb.evaluate(task.seed_program(), shared)
        sender, receiver = programs("own-")
        sent = sb.evaluate(sender, task.context(1))
        got = sb.evaluate(receiver, task.context(1))
        honest = sb.evaluate(task.seed_program(),
                             {**task.context(1), INPUTS_OF: program_key(receiver)})
    assert sent.passed and fallback.passed and honest.passed, (sent, fallback, honest)
    assert relayed.passed and relayed.score < fallback.score, (relayed, fallback)
    assert got.passed and got.score == honest.score, (got, honest)


#: bin packing's packing runner and its own audit runner: the packing runner finds its whole
#: instance in its caller's frame and steers every item into an offline first-fit-decreasing
#: plan (as ``tests/attacks/binpacking/lookahead_memo.py``), and, at its last item, sends every
#: instance's items through missing names (a pair of names a bit, each bit three times); the
#: fresh audit runner, the same program, decodes them, replays the same plan and answers each
#: audited step as the packing did
AUDIT_RELAY = '''import os
import sys
import time

import numpy as np

BASE = os.path.join(FOLDER, "atlas-audit-" + NONCE + "-")
COUNTS, CAP, REP = N_PER_INSTANCE, CAPACITY, 3
_plan, _memo, _seen = {}, {}, []


def _ffd(items, cap):
    label, rem = [0] * len(items), []
    for i in sorted(range(len(items)), key=lambda i: -items[i]):
        for b, r in enumerate(rem):
            if r >= items[i]:
                rem[b] = r - items[i]
                label[i] = b
                break
        else:
            rem.append(cap - items[i])
            label[i] = len(rem) - 1
    return label


def _one_hot(n, c):
    p = np.zeros(n)
    p[c] = 1.0
    return p


def _replay(items):
    """The packing's states and answers under the plan, as online_pack meets them."""
    n, plan, where = len(items), _ffd(items, float(CAP)), {}
    bins, hi = np.full(n, float(CAP)), 0
    for i, item in enumerate(items):
        idx = np.flatnonzero(bins[:hi] >= item)
        view = np.concatenate([bins[:hi][idx], np.full(n - hi, float(CAP))])
        if plan[i] in where:
            c = int(np.searchsorted(idx, where[plan[i]]))
        else:
            where[plan[i]], c = hi, len(idx)
        _memo[(float(item), view.tobytes())] = c
        j = int(idx[c]) if c < len(idx) else hi + c - len(idx)
        bins[j] -= item
        hi = max(hi, j + 1)


def _bits(instances):
    return [(int(x) >> k) & 1 for items in instances for x in items for k in range(7)]


def _send(instances):
    for i, bit in enumerate(_bits(instances)):
        for r in range(REP):
            try:
                os.stat(BASE + str(2 * (i * REP + r) + (0 if bit else 1)))
            except OSError:
                pass


def _receive():
    n_bits = 7 * sum(COUNTS)
    times = []
    for k in range(2 * REP * n_bits):
        t0 = time.perf_counter()
        try:
            os.stat(BASE + str(k))
        except OSError:
            pass
        times.append(time.perf_counter() - t0)
    bits = [int(sum(times[2 * (i * REP + r)] < times[2 * (i * REP + r) + 1]
                    for r in range(REP)) >= 2) for i in range(n_bits)]
    items, at = [], 0
    for count in COUNTS:
        items.append([float(sum(bits[(at + t) * 7 + k] << k for k in range(7)))
                      for t in range(count)])
        at += count
    return items


def priority(item, bins):
    f = sys._getframe(1)
    while f is not None and not {"items", "hi", "idx", "cap"} <= f.f_locals.keys():
        f = f.f_back
    if f is not None:  # packing: the future in view
        loc = f.f_locals
        items, i = loc["items"], loc["i"]
        if i == 0:
            _seen.append(list(items))
            _replay(list(items))
        if len(_seen) == len(COUNTS) and i == len(items) - 1:
            _send(_seen)
        return _one_hot(len(bins), _memo[(float(item), bins.tobytes())])
    if not _memo:  # the fresh audit runner: what the packing runner sent
        for items in _receive():
            _replay(items)
    c = _memo.get((float(item), bins.tobytes()))
    return _one_hot(len(bins), c) if c is not None else -(bins - item)
'''


@pytest.mark.xfail(strict=False, reason="known hole (docs/sandbox.md, known channels): bin "
                   "packing's packing runner can relay its own instance to its fresh audit "
                   "runner, the same program on the same inputs")
@pytest.mark.parametrize("mode", MODES)
def test_bin_packing_s_audit_runner_hears_nothing_from_its_packing_runner(mode):
    """The packing runner packs offline (first fit decreasing, the future read from its
    caller's frame) and relays its instances (2 x 300 items, 25,200 names) to its own fresh
    audit runner, which then answers the 16 audited steps as the packing did. Must fail: not
    passed, or not better than best fit on its instances. It gets through (xfail): the
    measured size of the hole is its score against best fit's, in the failure message."""
    from atlas.tasks.binpacking import BinPackingTask

    task = BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=16)
    fill = {"FOLDER": repr(os.path.dirname(os.__file__)), "NONCE": repr(os.urandom(6).hex()),
            "N_PER_INSTANCE": "[300, 300]", "CAPACITY": "100"}
    code = AUDIT_RELAY
    for key, value in fill.items():
        code = code.replace(key, value)
    with Sandbox.for_task(task, secret=SECRET, resources=Resources(workers=1),
                          confinement=Confinement(isolation=mode)) as sb:
        ev = sb.evaluate(code, task.context(1))
        honest = sb.evaluate(task.seed_program(),
                             {**task.context(1), INPUTS_OF: program_key(code)})
    assert honest.passed, honest
    assert not ev.passed or ev.score <= honest.score, \
        f"got through: {ev.score:.3f} against best fit's {honest.score:.3f} ({ev.metrics})"
