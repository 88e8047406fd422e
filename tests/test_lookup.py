"""Prompt-lookup drafts: the tokens that followed the row's last n-gram before."""

from __future__ import annotations

import pytest

from atlas.agent.lookup import Drafts


def test_the_longest_suffix_seen_before_gives_its_most_recent_continuation():
    d = Drafts([1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 0, 2, 3])
    # suffix (2, 3) was last followed by 4 5 0 ...; the longer (0, 2, 3) was never seen
    assert d.guess(3) == [4, 5, 0]
    d.extend([7])  # (3, 7) and (7,) were never seen: nothing to guess
    assert d.guess(4) == []
    d.extend([1, 2])  # (7, 1, 2) unseen, (1, 2) last followed by 3 4 5
    assert d.guess(2) == [3, 4]


def test_a_copy_that_runs_into_the_end_repeats_itself():
    d = Drafts([5, 6, 7, 5, 6, 7])  # period 3: the copy from the last (5, 6, 7) is 3 long
    assert d.guess(8) == [5, 6, 7, 5, 6, 7, 5, 6]
    d = Drafts([4, 4, 4])
    assert d.guess(5) == [4, 4, 4, 4, 4]


def test_no_context_no_guess_and_bad_sizes_are_refused():
    assert Drafts([]).guess(4) == [] and Drafts([1]).guess(4) == []
    with pytest.raises(ValueError, match="n-gram lengths"):
        Drafts([1, 2], longest=1, shortest=2)
