"""Preference data D_k and the gate subset G_k, built from one phase's evaluated programs.

G_k's prompts (``gate_prompts``, one ordering rule) are held out of D_k when the gate decides
(``hold_out_prompts``); ``gate_items`` turns chosen prompts into the gate's items.

D_k (paper 2.1): programs are partitioned into passed and failed; per island, the
coverage-aware count-based top-k passed programs (``ProgramDatabase.select_top_k``) are the
*chosen* completions; each is paired with completions sampled **from the same prompt** (DPO
needs one x per pair) that are either passed with a strictly lower score
(``passed_vs_passed``) or failed (``passed_vs_failed``). Chosen programs below
``score_threshold`` are dropped. Programs without a prompt/completion (seed, supporter
patches filed without one) cannot be paired.

Supporter supervision (paper 2.1-2.2, "constructs preference supervision"): a supporter's
program filed *with* the prompt whose completions the supporter reviewed (its patch written
as a completion of that prompt, ``atlas.supporters.patching.as_completion``) is chosen, if it
passed, against that prompt's agent completions that scored strictly lower or failed: kind
``supporter_vs_agent``. It is not part of the per-island agent top-k (it does not displace an
agent's chosen program), and only the agent's own completions are ever rejected.

Cap (``max_pairs``): pairs are ordered so that every chosen program gets its best pair before
any gets a second (diversity over chosen), higher margin first within a rank; the two kinds
are then taken alternately (validity and quality signal both survive the cap). Failed
completions use the finite floor score below for the margin.

Failure floor (shared with the gate subset, so both see one scale): one passed-score range
below the worst passed score of the phase,
``floor = lo - max(hi - lo, 0.1 * |lo|, 1e-3)``; ``-1.0`` when nothing passed.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

from atlas.dpo.config import GateConfig
from atlas.evolution.database import ProgramDatabase
from atlas.types import GateItem, PairKind, PreferencePair, Program, ProgramSource

PASSED_VS_PASSED = PairKind.PASSED_VS_PASSED
PASSED_VS_FAILED = PairKind.PASSED_VS_FAILED
SUPPORTER_VS_AGENT = PairKind.SUPPORTER_VS_AGENT
PAIR_KINDS = tuple(PairKind)


def failure_floor(programs: Sequence[Program]) -> float:
    """Finite score given to failed completions (rule in the module docstring)."""
    scores = [p.score for p in programs if p.passed and math.isfinite(p.score)]
    if not scores:
        return -1.0
    lo, hi = min(scores), max(scores)
    return lo - max(hi - lo, 0.1 * abs(lo), 1e-3)


def _pairable(p: Program) -> bool:
    return bool(p.prompt) and bool(p.completion)


def _usable(p: Program) -> bool:
    return p.passed and math.isfinite(p.score)


def build_pairs(db: ProgramDatabase, programs: list[Program], *, top_k: int, max_pairs: int,
                score_threshold: float | None, seed: int) -> list[PreferencePair]:
    """D_k for one phase (rules in the module docstring); ``seed`` breaks exact ties."""
    if max_pairs < 0:
        raise ValueError(f"max_pairs must be >= 0, got {max_pairs} (config field dpo.max_pairs)")
    if score_threshold is not None and not math.isfinite(float(score_threshold)):
        raise ValueError(f"score_threshold must be a finite number or null, got "
                         f"{score_threshold!r} (config field dpo.score_threshold)")
    rng = random.Random(seed)
    floor = failure_floor(programs)
    by_prompt: dict[str, list[Program]] = defaultdict(list)  # the agent's completions
    by_island: dict[int, list[Program]] = defaultdict(list)
    supporter: list[Program] = []
    for p in programs:
        if _pairable(p) and p.source == ProgramSource.SUPPORTER:
            if _usable(p):
                supporter.append(p)
        elif _pairable(p):
            by_prompt[p.prompt].append(p)
            if _usable(p):
                by_island[p.island].append(p)

    buckets: dict[str, list[tuple[tuple[int, float, float], PreferencePair]]] = {
        k: [] for k in PAIR_KINDS}
    chosen_list = [c for island in sorted(by_island)
                   for c in db.select_top_k(by_island[island], top_k)]
    chosen_list += sorted(supporter, key=lambda q: q.id)
    for chosen in chosen_list:
        if score_threshold is not None and chosen.score < float(score_threshold):
            continue
        per_kind: dict[str, list[tuple[float, float, PreferencePair]]] = defaultdict(list)
        for other in by_prompt[chosen.prompt]:
            if other.id == chosen.id or other.completion == chosen.completion:
                continue
            if _usable(other):
                if not other.score < chosen.score:
                    continue
                kind, rej_score = PASSED_VS_PASSED, other.score
            else:
                kind, rej_score = PASSED_VS_FAILED, floor
            if chosen.source == ProgramSource.SUPPORTER:
                kind = SUPPORTER_VS_AGENT
            pair = PreferencePair(
                prompt=chosen.prompt, chosen=chosen.completion, rejected=other.completion,
                chosen_score=chosen.score, rejected_score=other.score, island=chosen.island,
                kind=kind, chosen_id=chosen.id, rejected_id=other.id)
            per_kind[kind].append((chosen.score - rej_score, rng.random(), pair))
        for kind, items in per_kind.items():
            items.sort(key=lambda t: (-t[0], t[1]))
            buckets[kind].extend(((rank, -m, tie), pr) for rank, (m, tie, pr)
                                 in enumerate(items))
    queues = [sorted(b, key=lambda t: t[0]) for b in buckets.values()]
    out: list[PreferencePair] = []
    idx = [0] * len(queues)
    while len(out) < max_pairs and any(i < len(q) for i, q in zip(idx, queues)):
        for qi, q in enumerate(queues):
            if len(out) < max_pairs and idx[qi] < len(q):
                out.append(q[idx[qi]][1])
                idx[qi] += 1
    return out


def gate_prompts(programs: Sequence[Program], seed: int, size: int) -> list[str]:
    """At most ``size`` of this phase's prompts in the order the gate takes them: the one
    rule for both the prompts held out of D_k and G_k's items.

    Informative prompts come first: two or more completions whose scores differ, a failure
    counting at the floor (so one passed completion among them). A prompt whose completions
    all score the same gives the gate no signal (every policy's re-weighted score of it is
    that score); such prompts, and those with one completion, fill in only when there are too
    few. Within each group the order is a shuffle with ``seed``: pass a different one each
    phase (``atlas.fine_tuning.phase_seed``) so G_k is not reused across phases (paper B.7).
    """
    if size < 0:
        raise ValueError(f"gate subset size must be >= 0, got {size} (config field gate.subset_size)")
    groups = _by_prompt(programs)
    prompts = list(groups)  # first-seen order by id: deterministic given the programs
    random.Random(seed).shuffle(prompts)

    def informative(ps: list[Program]) -> bool:
        vals = {round(float(q.score), 12) if _usable(q) else None for q in ps}
        return len(ps) >= 2 and len(vals) >= 2

    good = [x for x in prompts if informative(groups[x])]
    rest = [x for x in prompts if not informative(groups[x])]
    return (good + rest)[:size]


def hold_out_prompts(programs: Sequence[Program], gate: GateConfig, seed: int) -> list[str]:
    """The prompts of this phase held out of D_k for G_k (paper 2.2: the gate must not score
    a policy on what D_k trained it on), in ``gate_prompts``' order.

    ``round(holdout * n)`` of the phase's n pairable prompts, at least 1 when n >= 2, at most
    ``subset_size`` and never all of them (D_k keeps at least one); none when n < 2.
    """
    n = len(_by_prompt(programs))
    if n < 2:
        return []
    return gate_prompts(programs, seed, min(max(1, round(gate.holdout * n)), gate.subset_size,
                                            n - 1))


def gate_items(programs: Sequence[Program], prompts: Sequence[str],
               failure_score: float | None = None) -> list[GateItem]:
    """G_k: one ``GateItem`` per prompt of ``prompts`` (in that order) with all its evaluated
    completions among ``programs``; the preferred completion is the best-scored one. Failed
    completions score ``failure_score`` (default ``failure_floor(programs)``)."""
    floor = failure_floor(programs) if failure_score is None else float(failure_score)
    if not math.isfinite(floor):
        raise ValueError(f"failure_score must be finite, got {failure_score!r}")
    groups = _by_prompt(programs)
    items = []
    for prompt in prompts:
        comps = groups[prompt]
        if not comps:
            raise ValueError(f"gate prompt {prompt[:40]!r}... has no evaluated completion among "
                             "the programs given")
        scores = [p.score if _usable(p) else floor for p in comps]
        best = max(range(len(comps)), key=lambda i: (scores[i], -comps[i].id))
        items.append(GateItem(prompt=prompt, completions=[p.completion for p in comps],
                              scores=scores, preferred=comps[best].completion,
                              ids=[p.id for p in comps]))
    return items


def _by_prompt(programs: Sequence[Program]) -> dict[str, list[Program]]:
    """The pairable programs grouped by prompt, in id order (prompts in first-seen order)."""
    groups: dict[str, list[Program]] = defaultdict(list)
    for p in sorted(programs, key=lambda q: q.id):
        if _pairable(p):
            groups[p.prompt].append(p)
    return groups
