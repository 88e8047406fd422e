"""The control without an LLM (``method=random_literals``): random search over the numeric
literals of an island's best programs.

Why this baseline: most of what a run finds on these tasks is a better constant (a window, a
regulariser, a loss weight), and the rule-based exploration supporter finds its gains by
multiplying the seed's constants by 0.5, 2 or 4. So "does the LLM beat blind tuning?" needs an
arm that only tunes constants, through the same islands, parents, sandbox, budget and
records. Each candidate is one of the island's parents (the programs the agent's prompt would
show), with 1 to 3 of its numeric literals each multiplied by a factor drawn log-uniformly
from [1/4, 4]. Literals are edited in the source text (comments and layout stay); an integer
stays an integer of at least 2 and differs from its parent's, and ``0``, ``1``, booleans and
imaginary numbers are left alone, since they are mostly indices, flags and exponents rather
than tuning constants.
"""

from __future__ import annotations

import ast
import io
import math
import random
import tokenize
from collections.abc import Sequence

from atlas.types import Program

#: a literal is multiplied by exp(u), u uniform in [-LOG_SPAN, LOG_SPAN]: a factor 1/4 .. 4
LOG_SPAN = math.log(4.0)
MAX_EDITS = 3


def tunable_literals(code: str) -> list[tuple[tuple[int, int], tuple[int, int], float | int]]:
    """The literals a search may change: (start, end, value) of each number token that is a
    float other than 0 or an integer of at least 2; [] when the code does not tokenize."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    for tok in tokens:
        if tok.type != tokenize.NUMBER or tok.string[-1:] in "jJ":
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, float) and value != 0.0 and math.isfinite(value):
            out.append((tok.start, tok.end, value))
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 2:
            out.append((tok.start, tok.end, value))
    return out


def _new_value(value: float | int, rng: random.Random) -> str:
    factor = math.exp(rng.uniform(-LOG_SPAN, LOG_SPAN))
    if isinstance(value, int):
        new = max(2, round(value * factor))
        if new == value:
            new = value + 1 if factor >= 1 else max(2, value - 1)
        return str(new)
    return repr(float(f"{value * factor:.4g}"))


def mutate(code: str, rng: random.Random) -> str:
    """``code`` with 1..3 of its tunable literals redrawn (the module docstring's rule); the
    code unchanged when it has none."""
    found = tunable_literals(code)
    if not found:
        return code
    picks = rng.sample(found, rng.randint(1, min(MAX_EDITS, len(found))))
    lines = code.splitlines(keepends=True)
    # edit from the end of the text backwards, so earlier positions stay valid
    for (row, col), (_, end_col), value in sorted(picks, key=lambda t: t[0], reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + _new_value(value, rng) + line[end_col:]
    return "".join(lines)


class LiteralSearch:
    """The candidate writer of ``method=random_literals`` (``Explorer``'s ``writer``)."""

    def write(self, parents: Sequence[Program], samples: int, seed: int) -> list[str]:
        """``samples`` programs, each a parent drawn at random with its literals redrawn."""
        rng = random.Random(seed)
        codes = [p.code for p in parents if p.code]
        if not codes:
            return [""] * samples
        return [mutate(rng.choice(codes), rng) for _ in range(samples)]
