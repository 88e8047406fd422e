"""Draft tokens for prompt-lookup decoding: what followed the row's last n-gram before.

An agent's program mostly copies a parent program that stands in its prompt, with small
edits, so the tokens that followed the most recent earlier occurrence of the row's last
few tokens (in the prompt or in what the row already wrote) are a good guess at what comes
next. ``sampling``'s lookup path runs such a guess through the model in one forward pass and
keeps the tokens the sampler itself would have drawn, so the guess decides only how many
tokens a pass yields, never which.
"""

from __future__ import annotations

DRAFT_TOKENS = 12  # tokens guessed per row and pass (more: wider passes, fewer of them)
NGRAM = (4, 1)  # the longest and shortest suffix looked up; a longer match is tried first


class Drafts:
    """One row's context (prompt and generated tokens) with an index from each n-gram to the
    position after its most recent occurrence that has a successor."""

    def __init__(self, context: list[int], longest: int = NGRAM[0], shortest: int = NGRAM[1]
                 ) -> None:
        if not 1 <= shortest <= longest:
            raise ValueError(f"n-gram lengths must satisfy 1 <= shortest <= longest, got "
                             f"{shortest}, {longest}")
        self.tokens: list[int] = []
        self.sizes = range(longest, shortest - 1, -1)
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens; every n-gram that now has a successor points at it."""
        ctx = self.tokens
        for t in tokens:
            ctx.append(t)
            end = len(ctx) - 1  # the new token is the successor of the n-grams ending before it
            for n in self.sizes:
                if end >= n:
                    self.after[tuple(ctx[end - n:end])] = end

    def guess(self, k: int) -> list[int]:
        """``k`` tokens that followed the longest suffix seen before (none found: []). A
        copy that runs into the end goes on from its own start, so a row that repeats
        itself (period p) is guessed k tokens ahead, not p."""
        ctx = self.tokens
        for n in self.sizes:
            if len(ctx) < n:
                continue
            at = self.after.get(tuple(ctx[len(ctx) - n:]))
            if at is not None:
                out = ctx[at:at + k]
                while len(out) < k:  # ctx + out repeats from ``at``: continue the copy
                    out.append(out[len(out) - (len(ctx) - at)])
                return out
        return []
