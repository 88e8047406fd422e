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

Copies (``atlas.novelty``): a program that repeats one the run already had is never the
chosen side (it would teach the agent to write out its prompt). With ``lazy`` each copy with
a prompt (evaluated or not) is the rejected side against the best valid agent program of the
same prompt that is not a copy: kind ``new_vs_copy``, ThetaEvolve's lazy-output penalty.

Cap (``max_pairs``): pairs are ordered so that every chosen program gets its best pair before
any gets a second (diversity over chosen), higher margin first within a rank; the two kinds
are then taken alternately (validity and quality signal both survive the cap). Failed
completions use the phase's failure floor for the margin (``atlas.evolution.buffer``).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from atlas.evolution.buffer import failure_floor, pairable, usable
from atlas.evolution.database import ProgramDatabase
from atlas.novelty import COPY
from atlas.types import PairKind, PreferencePair, Program, ProgramSource

PASSED_VS_PASSED = PairKind.PASSED_VS_PASSED
PASSED_VS_FAILED = PairKind.PASSED_VS_FAILED
SUPPORTER_VS_AGENT = PairKind.SUPPORTER_VS_AGENT
NEW_VS_COPY = PairKind.NEW_VS_COPY
PAIR_KINDS = tuple(PairKind)


def build_pairs(db: ProgramDatabase, programs: list[Program], *, top_k: int, max_pairs: int,
                score_threshold: float | None, seed: int, copies: Sequence[Any] = (),
                lazy: bool = False) -> list[PreferencePair]:
    """D_k for one phase (rules in the module docstring); ``seed`` breaks exact ties;
    ``copies``: the phase's copies that were not evaluated (``Explorer.copies``)."""
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
        fresh = p.novelty != COPY
        if pairable(p) and p.source == ProgramSource.SUPPORTER:
            if usable(p) and fresh:
                supporter.append(p)
        elif pairable(p):
            by_prompt[p.prompt].append(p)
            if usable(p) and fresh:
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
    if lazy:
        buckets[NEW_VS_COPY] = _lazy_pairs(by_prompt, programs, copies, floor)
    queues = [sorted(b, key=lambda t: t[0]) for b in buckets.values()]
    out: list[PreferencePair] = []
    idx = [0] * len(queues)
    while len(out) < max_pairs and any(i < len(q) for i, q in zip(idx, queues)):
        for qi, q in enumerate(queues):
            if len(out) < max_pairs and idx[qi] < len(q):
                out.append(q[idx[qi]][1])
                idx[qi] += 1
    return out


def _lazy_pairs(by_prompt: dict[str, list[Program]], programs: list[Program],
                copies: Sequence[Any], floor: float
                ) -> list[tuple[tuple[int, float, float], PreferencePair]]:
    """``new_vs_copy``: each copy with a prompt rejected against the best valid agent program
    of that prompt that is not a copy; a chosen program's first pair ranks before any
    second."""
    lazy = [(c.prompt, c.completion, getattr(c, "id", -1)) for c in copies
            if c.prompt and c.completion]
    lazy += [(p.prompt, p.completion, p.id) for p in programs
             if p.novelty == COPY and p.source == ProgramSource.AGENT and pairable(p)]
    used: dict[int, int] = defaultdict(int)
    out = []
    for prompt, completion, rid in lazy:
        new = [p for p in by_prompt.get(prompt, []) if p.novelty not in (COPY, "")
               and usable(p) and p.completion != completion]
        if not new:
            continue
        chosen = max(new, key=lambda q: (q.score, -q.id))
        rank = used[chosen.id]
        used[chosen.id] += 1
        pair = PreferencePair(prompt=prompt, chosen=chosen.completion, rejected=completion,
                              chosen_score=chosen.score, rejected_score=floor,
                              island=chosen.island, kind=NEW_VS_COPY, chosen_id=chosen.id,
                              rejected_id=rid)
        out.append(((rank, -(chosen.score - floor), 0.0), pair))
    return out
