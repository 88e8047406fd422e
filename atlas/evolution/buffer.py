"""A phase's programs as D_k and G_k read them: grouped by prompt, failures at one floor.

Failure floor (D_k's margins and G_k's scores share it, so both see one scale): one
passed-score range below the worst passed score of the phase,
``floor = lo - max(hi - lo, 0.1 * |lo|, 1e-3)``; ``-1.0`` when nothing passed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from atlas.types import Program


def failure_floor(programs: Sequence[Program]) -> float:
    """Finite score given to failed completions (rule in the module docstring)."""
    scores = [p.score for p in programs if p.passed and math.isfinite(p.score)]
    if not scores:
        return -1.0
    lo, hi = min(scores), max(scores)
    return lo - max(hi - lo, 0.1 * abs(lo), 1e-3)


def pairable(p: Program) -> bool:
    """Whether ``p`` was written as a completion of a prompt (the seed and patches filed
    without one were not): only such a program can enter D_k or G_k."""
    return bool(p.prompt) and bool(p.completion)


def usable(p: Program) -> bool:
    """Whether ``p`` passed with a finite score (a failure scores at the floor)."""
    return p.passed and math.isfinite(p.score)


def by_prompt(programs: Sequence[Program]) -> dict[str, list[Program]]:
    """The pairable programs grouped by prompt, in id order (prompts in first-seen order)."""
    groups: dict[str, list[Program]] = defaultdict(list)
    for p in sorted(programs, key=lambda q: q.id):
        if pairable(p):
            groups[p.prompt].append(p)
    return groups
