"""Preference data D_k, built from one phase's evaluated programs.

The gate's G_k is built from the same phase (``atlas.dpo.evidence``); when its prompts are
held out, the caller leaves them out of ``programs``.

D_k (paper 2.1): programs are partitioned into passed and failed; per island, the
coverage-aware count-based top-k passed programs (``ProgramDatabase.select_top_k``) are the
*chosen* completions; each is paired with completions sampled **from the same prompt** (DPO
needs one x per pair) that are either passed with a strictly lower score
(``passed_vs_passed``) or failed (``passed_vs_failed``). Chosen programs below
``score_threshold`` are dropped. Programs without a prompt/completion (seed, supporter
patches filed without one) cannot be paired.

Supporter supervision (paper 2.1-2.2, "constructs preference supervision"): a supporter's
program filed *with* the prompt whose completions the supporter reviewed (its patch written
as a completion of that prompt, ``atlas.evolution.extract.as_completion``) is chosen, if it
passed, against that prompt's agent completions that scored strictly lower or failed: kind
``supporter_vs_agent``. It is not part of the per-island agent top-k (it does not displace an
agent's chosen program), and only the agent's own completions are ever rejected.

Cap (``max_pairs``): pairs are ordered so that every chosen program gets its best pair before
any gets a second (diversity over chosen), higher margin first within a rank; the two kinds
are then taken alternately (validity and quality signal both survive the cap). Failed
completions use the phase's failure floor for the margin (``atlas.evolution.buffer``).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

from atlas.evolution.buffer import failure_floor, pairable, usable
from atlas.evolution.database import ProgramDatabase
from atlas.types import PairKind, PreferencePair, Program, ProgramSource

PASSED_VS_PASSED = PairKind.PASSED_VS_PASSED
PASSED_VS_FAILED = PairKind.PASSED_VS_FAILED
SUPPORTER_VS_AGENT = PairKind.SUPPORTER_VS_AGENT
PAIR_KINDS = tuple(PairKind)


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
        if pairable(p) and p.source == ProgramSource.SUPPORTER:
            if usable(p):
                supporter.append(p)
        elif pairable(p):
            by_prompt[p.prompt].append(p)
            if usable(p):
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
            if usable(other):
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
