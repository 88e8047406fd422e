"""Scoring half of online bin packing, with FunSearch's exact semantics.

An instance of n items starts with n bins at full capacity. For each item in order the
candidate's ``priority(item, bins)`` gets the remaining capacities of every bin the item fits
in (a fresh float64 array, in bin order, the still-empty bins included) and returns one
priority per bin; the item goes to the first bin of highest priority (``np.argmax``). Bins
used = bins no longer at full capacity. Score = -(mean bins used - mean L1 bound) / mean L1
bound * 100 over the instance set (``instances.excess_pct``), so higher is better and <= 0.

Split (why it is fast and still checked): the untrusted runner packs a whole instance in its
own process (one message per instance, not per item) and returns the assignment, item ->
bin. The trusted scorer replays it with the same float arithmetic: every item must go to a
bin it fits in at that moment (a valid packing), and it counts the bins itself. Then it
audits ``audit_steps`` steps drawn from the run secret and the code: it starts the program
in a fresh runner that never saw an instance, sends it the state it replayed before each
step (one at a time, in packing order) and that runner must answer the same bin by calling
``priority``, so an assignment that no online ``priority`` call produced (an offline packing,
a forged one, one that peeked at future items and memorised its answers) fails. ``make_evaluator`` plays both halves in one process for trusted code (baselines).
After the scored instances the runner's twin of the program packs a short public instance
(``public_instance``): its bin choices become ``Evaluation.behaviour``, the fingerprint
``atlas.novelty`` compares (``atlas.sandbox.behaviour``); it counts in no score.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from atlas.sandbox.behaviour import PUBLIC_SEED, Twin, fingerprint
from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.inputs import inputs_key
from atlas.sandbox.link import Link
from atlas.sandbox.secret import derive_seed
from atlas.tasks.binpacking.instances import (
    Instance,
    check_instance,
    excess_pct,
    weibull_instances,
)
from atlas.types import Evaluation, FailureKind

Priority = Callable[[float, np.ndarray], Any]
ENTRY_POINT = "priority"

# bound at import, before any candidate runs: a candidate sharing this process's numpy must
# not bend the packing loop by reassigning np.argmax or np.flatnonzero
_asarray, _flatnonzero, _full, _empty = np.asarray, np.flatnonzero, np.full, np.empty
_float64, _int64 = np.float64, np.int64

#: items of the public instance every program also packs, for its behaviour fingerprint
PUBLIC_ITEMS = 1000


def _at(step: int) -> str:
    return f"item {step}" if step >= 0 else "an audited step (the scorer re-asking)"


def check_priorities(p: Any, n_valid: int, step: int) -> int:
    """The index of the candidate's highest priority (the first one on ties), after checking
    the answer is (n_valid,) numbers without NaN; WRONG_RETURN naming the fix otherwise."""
    try:
        arr = _asarray(p, dtype=_float64)
    except (TypeError, ValueError):
        raise CandidateError(FailureKind.WRONG_RETURN, f"priority returned {repr(p)[:60]} "
                             f"({type(p).__name__}) for {_at(step)}; return a numpy array of "
                             f"numbers, one per bin in `bins`") from None
    if arr.shape != (n_valid,):
        raise CandidateError(FailureKind.WRONG_RETURN, f"priority returned shape {arr.shape} "
                             f"for {_at(step)} but bins has shape ({n_valid},); return one "
                             f"priority per bin, e.g. -(bins - item)")
    best = int(arr.argmax())
    if arr[best] != arr[best]:  # argmax stops at the first NaN: no separate scan needed
        raise CandidateError(FailureKind.WRONG_RETURN, f"priority returned NaN for "
                             f"{_at(step)}; guard divisions (e.g. add 1e-9) so every bin gets a "
                             f"number")
    return best


def choose(priority: Priority, item: float, remaining: np.ndarray, step: int) -> int:
    """Index into ``remaining`` of the bin ``priority`` picks (first of the highest).

    ``remaining`` must be a fresh array (fancy indexing makes one): the candidate may
    scribble on its argument, and a copy per item is measurable at 25,000 items.
    """
    return check_priorities(priority(item, remaining), len(remaining), step)


def online_pack(priority: Priority, items: Sequence[float], capacity: float) -> np.ndarray:
    """FunSearch's ``online_binpack``: the (n,) bin index each item goes to."""
    n, cap = len(items), float(capacity)
    bins = _full(n, cap, dtype=_float64)
    assign = _empty(n, dtype=_int64)
    hi = 0  # bins[hi:] were never touched: all full, and every item fits in them
    for i, item in enumerate(items):
        head = bins[:hi]
        idx = _flatnonzero(head >= item)
        m = len(idx)
        view = _empty(m + n - hi, dtype=_float64)  # = bins[bins >= item], built faster
        view[:m] = head[idx]
        view[m:] = cap
        c = choose(priority, item, view, i)
        j = int(idx[c]) if c < m else hi + c - m
        bins[j] -= item
        assign[i] = j
        if j >= hi:
            hi = j + 1
    return assign


def online_pack_plain(priority: Priority, items: Sequence[float], capacity: float
                      ) -> np.ndarray:
    """FunSearch's loop written plainly (``online_pack`` must agree with it; tests)."""
    bins = np.full(len(items), float(capacity))
    assign = np.empty(len(items), dtype=np.int64)
    for i, item in enumerate(items):
        valid = np.nonzero((bins - item) >= 0)[0]
        j = valid[int(np.argmax(priority(item, bins[valid])))]
        bins[j] -= item
        assign[i] = j
    return assign


def replay(inst: Instance, assign: Any, snapshot_at: frozenset[int] = frozenset()
           ) -> tuple[int, dict[int, list[float]]]:
    """Check ``assign`` is a valid online packing of ``inst`` and count its bins.

    Replays with the runner's arithmetic (float64 subtraction in item order), so "fits" means
    exactly what it meant to the runner. Returns (bins used, {step: remaining capacities of
    all n bins before that step}) for the steps in ``snapshot_at``. TAMPERED otherwise: the
    runner checks every choice, so an invalid assignment was not produced by it.
    """
    n, cap = len(inst.items), float(inst.capacity)
    if type(assign) is not list or len(assign) != n or not all(
            type(j) is int and 0 <= j < n for j in assign):
        raise CandidateError(FailureKind.TAMPERED, f"instance {inst.name}: the runner answered "
                             f"{repr(assign)[:60]}, not {n} bin indices in [0, {n})")
    bins = [cap] * n
    snaps: dict[int, list[float]] = {}
    for i, (item, j) in enumerate(zip(inst.items, assign)):
        if i in snapshot_at:
            snaps[i] = list(bins)
        if not bins[j] >= item:
            raise CandidateError(FailureKind.TAMPERED, f"instance {inst.name}: item {i} "
                                 f"(size {item:g}) was put in bin {j} with {bins[j]:g} left: "
                                 f"not a valid packing")
        bins[j] -= item
    return sum(1 for b in bins if b != cap), snaps


def audit_plan(instances: Sequence[Instance], steps: int, seed: int) -> list[tuple[int, int]]:
    """``steps`` distinct (instance, item) pairs to re-ask the runner about."""
    total = sum(len(i.items) for i in instances)
    rng = np.random.default_rng(seed)
    flat = sorted(rng.choice(total, size=min(steps, total), replace=False).tolist())
    out, start, k = [], 0, 0
    for f in flat:
        while f >= start + len(instances[k].items):
            start += len(instances[k].items)
            k += 1
        out.append((k, f - start))
    return out


def metrics_of(instances: Sequence[Instance], used: Sequence[int]) -> dict[str, float]:
    """Score metrics: the excess, bins used and L1 bound (means), excess per instance."""
    bound = [i.l1_bound for i in instances]
    out = {"excess_pct": excess_pct(used, instances),
           "bins_used": float(sum(used)) / len(used),
           "l1_bound": float(sum(bound)) / len(bound)}
    for k, (u, b) in enumerate(zip(used, bound)):
        out[f"excess_pct_{k}"] = 100.0 * (u - b) / b
    return out


def load_instances(config: dict[str, Any], secret: str | None = None,
                   program: str | None = None) -> list[Instance]:
    """The instance set the host task put into the evaluator config, checked again; generated
    Weibull sets (``config["weibull"]``) are drawn here from the run secret, which the scorer
    needs for them: without it the set would be the public draw a program can rebuild; a
    ``program`` key draws the program's own set (``weibull_instances``). A listed set is
    public (a program can rebuild it): it is the same for every program."""
    if "weibull" in config:
        if not secret:
            raise ValueError("binpacking scorer: generated Weibull instances are drawn from the "
                             "run secret and none was given (build the sandbox with "
                             "Sandbox.for_task(task, secret=...))")
        return weibull_instances(**config["weibull"], secret=secret, program=program)
    data = config.get("instances")
    if not isinstance(data, list) or not data:
        raise ValueError("binpacking evaluator config needs 'instances': a non-empty list "
                         "(BinPackingTask.evaluator_config builds it)")
    return [check_instance(Instance.from_json(d), "binpacking evaluator") for d in data]


def public_instance(config: dict[str, Any]) -> Instance | None:
    """The short public instance every program also packs, for its behaviour fingerprint
    (``atlas.sandbox.behaviour``): ``PUBLIC_ITEMS`` items of the generated sets'
    distribution drawn from ``PUBLIC_SEED``, never from the secret; for a listed (public)
    set, the first ``PUBLIC_ITEMS`` items of its first instance. None where the scorer's
    config says ``behaviour: false`` (a trusted caller's switch)."""
    if not config.get("behaviour", True):
        return None
    if "weibull" in config:
        params = {**config["weibull"], "count": 1, "seed": PUBLIC_SEED}
        params["n_items"] = min(PUBLIC_ITEMS, int(params.get("n_items", PUBLIC_ITEMS)))
        inst = weibull_instances(**params)[0]
    else:
        inst = load_instances(config)[0]
    return Instance("public", inst.capacity, inst.items[:PUBLIC_ITEMS])


class BinPackingScorer:
    """Trusted half: sends items, replays and counts the returned packing, audits choices.

    After the scored instances the runner also packs the public instance
    (``public_instance``) with a twin of the program (``atlas.sandbox.behaviour.Twin``):
    the scorer replays that packing (a valid one, or ``tampered``) and hashes its bin
    choices into ``Evaluation.behaviour``; it counts in no score and is not audited."""

    def __init__(self, config: dict[str, Any], secret: str | None = None) -> None:
        self.config = dict(config)
        self.instances = load_instances(config, secret)
        self.public = public_instance(self.config)
        self.audit_steps = int(config.get("audit_steps", 0))
        self.secret = secret
        self._by_program: dict[str, list[Instance]] = {}

    def instances_for(self, code: str, context: dict[str, Any]) -> list[Instance]:
        """The program's own hidden instances (``atlas.sandbox.inputs``): items an earlier
        candidate saw and relayed are not this program's. A listed (public) set, or no
        secret: the same set for every program."""
        if "weibull" not in self.config or not self.secret:
            return self.instances
        key = inputs_key(code, context)
        if key not in self._by_program:
            if len(self._by_program) >= 4:
                self._by_program.pop(next(iter(self._by_program)))
            self._by_program[key] = load_instances(self.config, self.secret, key)
        return self._by_program[key]

    def public_config(self) -> dict[str, Any]:
        return {}  # the runner learns the instances from the scorer's messages

    def _audit_seed(self, code: str) -> int:
        digest = hashlib.sha256(code.encode()).hexdigest()[:16]
        return derive_seed(self.secret or "00", "binpacking-audit", digest)

    def score(self, code: str, context: dict[str, Any], link: Link,
              fresh: Callable[[], Link] | None = None) -> Evaluation:
        """Pack every instance in the candidate's runner, replay and count; then audit.

        The audit runs in a *fresh* runner (``fresh()``, from the worker) that never saw an
        instance, one question at a time in packing order: the packing runner holds whole
        instances, so its ``priority`` can see future items (the caller's frame) and remember
        what it answered; re-asking that process would only check its memory. A fresh one can
        only answer from the state it is shown, as an online priority must.
        """
        start = time.perf_counter()
        instances = self.instances_for(code, context)
        plan = audit_plan(instances, self.audit_steps, self._audit_seed(code))
        used: list[int] = []
        assigns: list[list[int]] = []
        questions: list[dict[str, Any]] = []
        for k, inst in enumerate(instances):
            link.send({"pack": k, **inst.to_json()})
            assign = link.recv().get("assign")
            steps = frozenset(i for kk, i in plan if kk == k)
            n_used, snaps = replay(inst, assign, steps)
            used.append(n_used)
            assigns.append(assign)
            for i in sorted(steps):
                remaining = snaps[i]
                item = inst.items[i]
                valid = [b for b in remaining if b >= item]
                questions.append({"k": k, "i": i, "item": item, "bins": valid,
                                  "_valid": [j for j, b in enumerate(remaining) if b >= item]})
        behaviour = None if self.public is None else self._public_packing(link)
        if questions:
            if fresh is not None:
                link = fresh()
            answer = []
            for q in questions:  # (instance, item) order: no answer sees a later state
                link.send({"audit": [{"item": q["item"], "bins": q["bins"]}]})
                got = link.recv().get("choice")
                if type(got) is not list or len(got) != 1 or type(got[0]) is not int:
                    raise CandidateError(FailureKind.TAMPERED, f"the runner answered the "
                                         f"audit with {repr(got)[:60]}, not one index")
                answer.append(got[0])
            for q, c in zip(questions, answer):
                if not 0 <= c < len(q["_valid"]) or q["_valid"][c] != assigns[q["k"]][q["i"]]:
                    raise CandidateError(
                        FailureKind.WRONG_RETURN,
                        f"instance {instances[q['k']].name}, item {q['i']}: priority "
                        f"called again on the same (item, bins) picks another bin than the "
                        f"packing did; priority must be a pure function of its arguments (no "
                        f"random numbers, globals or call counters)")
        link.send({"done": True})
        metrics = metrics_of(instances, used)
        metrics["audited_steps"] = float(len(questions))
        return Evaluation(score=-metrics["excess_pct"], passed=True, metrics=metrics,
                          seconds=time.perf_counter() - start, behaviour=behaviour)

    def _public_packing(self, link: Link) -> str:
        """The fingerprint of the twin's packing of the public instance, checked as a
        scored packing is; where the twin raised, of the item it raised at."""
        inst = self.public
        assert inst is not None
        link.send({"public": True, **inst.to_json()})
        got = link.recv()
        assign = got.get("assign")
        if assign is None:
            stopped = got.get("stopped")
            if type(stopped) is not int or not 0 <= stopped < len(inst.items):
                raise CandidateError(FailureKind.TAMPERED, f"the runner answered the public "
                                     f"instance with {repr(got)[:60]}, not a packing")
            return fingerprint("binpacking", [], stopped)
        replay(inst, assign)
        return fingerprint("binpacking", assign)


def make_scorer(config: dict[str, Any], secret: str | None = None) -> BinPackingScorer:
    """Factory of the trusted half (once per scorer worker)."""
    return BinPackingScorer(config, secret)


def make_runner(config: dict[str, Any]) -> Callable[[str, dict[str, Any], Link], None]:
    """Factory of the untrusted half: packs what the scorer sends, answers audits."""

    def run(code: str, context: dict[str, Any], link: Link) -> None:
        twin = Twin(code, ENTRY_POINT)  # first: its random streams begin as the seeded ones
        priority = load_candidate(code, ENTRY_POINT)
        while True:
            msg = link.recv()
            if msg.get("done"):
                return
            if "public" in msg:
                link.send(_pack_public(twin, [float(x) for x in msg["items"]],
                                       float(msg["capacity"])))
                continue
            if "audit" in msg:
                link.send({"choice": [
                    choose(priority, float(q["item"]), _asarray(q["bins"], dtype=_float64), -1)
                    for q in msg["audit"]]})
                continue
            items = [float(x) for x in msg["items"]]
            link.send({"assign": online_pack(priority, items, float(msg["capacity"])).tolist()})

    return run


def _pack_public(twin: Twin, items: list[float], capacity: float) -> dict[str, Any]:
    """The twin's packing of the public instance, or the item where it raised (the scored
    packings stand: the twin's failure is no failure of the program's)."""
    calls = [0]

    def counted(priority: Priority) -> Callable[[float, np.ndarray], Any]:
        def call(item: float, bins: np.ndarray) -> Any:
            calls[0] += 1
            return priority(item, bins)
        return call

    try:
        return {"assign": twin.within(
            lambda priority: online_pack(counted(priority), items, capacity)).tolist()}
    except Exception:  # noqa: BLE001 - the twin's failure ends its packing, not the program
        return {"assign": None, "stopped": max(calls[0] - 1, 0)}


def score_priority(priority: Priority, instances: Sequence[Instance]
                   ) -> tuple[float, dict[str, float]]:
    """(score, metrics) of a trusted ``priority`` (baselines, tests): same replay and count."""
    used = [replay(inst, online_pack(priority, inst.items, inst.capacity).tolist())[0]
            for inst in instances]
    metrics = metrics_of(instances, used)
    return -metrics["excess_pct"], metrics


def make_evaluator(config: dict[str, Any]) -> Callable[[str, dict[str, Any]], Evaluation]:
    """Both halves in one process, for trusted programs only (baselines, tests); generated
    sets are the public draw here (no secret: nothing untrusted runs)."""
    instances = (weibull_instances(**config["weibull"]) if "weibull" in config
                 else load_instances(config))

    def evaluate(code: str, context: dict[str, Any]) -> Evaluation:
        start = time.perf_counter()
        score, metrics = score_priority(load_candidate(code, ENTRY_POINT), instances)
        return Evaluation(score=score, passed=True, metrics=metrics,
                          seconds=time.perf_counter() - start)

    return evaluate
