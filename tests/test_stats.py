"""atlas.stats against hand-computed numbers (the study's intervals and tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atlas import stats

T4 = 2.7764451051977987  # t(0.975, df=4), from a t table


def test_t_interval_of_one_to_five_by_hand() -> None:
    # mean 3, s = sqrt(10/4) = 1.58114, half-width = 2.77645 * 1.58114 / sqrt(5) = 1.96324
    ci = stats.t_interval([1, 2, 3, 4, 5, None, math.nan])  # None/NaN (a crashed run) dropped
    assert ci["n"] == 5 and ci["mean"] == 3.0
    assert ci["std"] == pytest.approx(math.sqrt(2.5))
    assert (ci["lo"], ci["hi"]) == pytest.approx((3 - T4 * math.sqrt(2.5 / 5), 3 + T4 * math.sqrt(2.5 / 5)))
    assert ci["lo"] == pytest.approx(1.03676, abs=1e-5)
    one = stats.t_interval([0.5])  # a single seed has no interval
    assert one["mean"] == 0.5 and math.isnan(one["lo"]) and math.isnan(one["std"])
    assert stats.t_interval([])["n"] == 0


def test_bootstrap_interval_of_two_values_is_their_range() -> None:
    # resampled means of {a, b}: a (1/4), (a+b)/2 (1/2), b (1/4): the 2.5% / 97.5% points are a, b
    assert stats.bootstrap_interval([0.1, 0.3]) == pytest.approx((0.1, 0.3))
    assert stats.bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
    assert all(math.isnan(v) for v in stats.bootstrap_interval([1.0]))
    # reproducible (fixed generator seed) and inside the range of the data
    xs = [0.1, 0.05, 0.2, 0.15, 0.05]
    lo, hi = stats.bootstrap_interval(xs)
    assert (lo, hi) == stats.bootstrap_interval(xs)
    assert 0.05 <= lo < np.mean(xs) < hi <= 0.2


def test_exact_signed_rank_p_by_hand_and_its_floor() -> None:
    # all five differences positive: only 2 of the 32 sign patterns are as extreme -> 0.0625
    assert stats.signed_rank_p([0.1, 0.05, 0.2, 0.15, 0.05]) == pytest.approx(0.0625)
    assert stats.min_signed_rank_p(5) == 0.0625 and stats.min_signed_rank_p(3) == 0.25
    # ranks 1..5 with rank 5 negative: W+ = 10; subsets of {1..5} with sum <= 5: {}, 1, 2, 3,
    # 4, 5, 12, 13, 14, 23 = 10, and by symmetry 10 with sum >= 10 -> p = 20/32
    assert stats.signed_rank_p([1, 2, 3, 4, -5]) == pytest.approx(0.625)
    assert stats.signed_rank_p([0, 0]) == 1.0  # zero differences are dropped


def test_signed_rank_p_matches_scipys_exact_test() -> None:
    from scipy.stats import wilcoxon

    rng = np.random.default_rng(3)
    for n in (4, 5, 6, 9):
        d = rng.normal(0.3, 1.0, size=n)
        assert stats.signed_rank_p(d) == pytest.approx(wilcoxon(d, method="exact").pvalue)


def test_paired_uses_only_seeds_both_methods_ran() -> None:
    a = {0: 1.0, 1: 2.0, 2: 3.0, 3: None}
    b = {0: 0.5, 1: 1.0, 2: 3.5, 4: 9.0}
    res = stats.paired(a, b)
    assert res["seeds"] == [0, 1, 2] and res["diffs"] == [0.5, 1.0, -0.5]
    assert res["mean"] == pytest.approx(1 / 3) and (res["wins"], res["losses"]) == (2, 1)
    assert res["p_min"] == 0.25  # 3 non-zero pairs: 2/8


def _enumerated_signed_rank_p(diffs: list[float]) -> float:
    """The signed-rank p by listing all 2^n sign patterns (the definition)."""
    from itertools import product

    d = np.asarray([x for x in diffs if x != 0.0])
    ranks = stats._ranks(np.abs(d))
    expected = ranks.sum() / 2
    dev = abs(ranks[d > 0].sum() - expected)
    null = np.array([sum(r for r, s in zip(ranks, signs) if s)
                     for signs in product((False, True), repeat=d.size)])
    return float(np.mean(np.abs(null - expected) >= dev - 1e-9))


def test_counted_signed_rank_p_equals_the_enumerated_one_with_ties_and_zeros() -> None:
    rng = np.random.default_rng(7)
    for n in (3, 6, 9, 12):
        # values on a coarse grid: many tied sizes and some zeros, as the agent's best gives
        d = list(rng.integers(-3, 4, size=n) * 0.25)
        if any(d):
            assert stats.signed_rank_p(d) == pytest.approx(_enumerated_signed_rank_p(d), abs=1e-12)
    # 20 blocks, all positive: only the two extreme patterns of 2^20 -> 2 / 1048576
    assert stats.signed_rank_p([0.01 * (i + 1) for i in range(20)]) == pytest.approx(2 / 2 ** 20)


def test_tie_counts_name_zero_and_tied_differences() -> None:
    assert stats.ties([0.0, 0.0, 0.1, -0.1, 0.2, None]) == {"zero": 2, "tied": 2}
    assert stats.ties([0.3, 0.1, 0.2]) == {"zero": 0, "tied": 0}
    res = stats.paired({0: 1.0, 1: 1.0, 2: 2.0, 3: 0.5}, {0: 1.0, 1: 0.5, 2: 1.5, 3: 0.0})
    assert res["ties"] == {"zero": 1, "tied": 3}  # diffs 0, 0.5, 0.5, 0.5
    # three tied positive pairs, seed 0's zero dropped: W+ = 6 of 6 -> 2/8
    assert res["p_signed_rank"] == pytest.approx(0.25) and res["p_min"] == 0.25


def test_holm_adjustment_by_hand() -> None:
    # sorted 0.01 (x4 = 0.04), 0.03 (x3 = 0.09), 0.04 (x2 = 0.08, kept monotone: 0.09), 0.20 (x1)
    assert stats.holm([0.01, 0.04, 0.03, 0.20]) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    # a comparison without data keeps its place in the family's size (m = 4) and gets None
    assert stats.holm([0.01, None, 0.03, 0.2]) == [pytest.approx(0.04), None,
                                                   pytest.approx(0.09), pytest.approx(0.4)]
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([]) == []


def test_a_rate_interval_stays_inside_zero_and_one() -> None:
    high = stats.rate_interval([1.0, 1.0, 0.5])  # t interval: 0.833 +- 0.717
    assert high["hi"] == 1.0 and high["clipped"] and high["lo"] == pytest.approx(
        5 / 6 - 4.302652729911275 * math.sqrt(1 / 12) / math.sqrt(3))
    low = stats.rate_interval([0.0, 0.0, 0.25])
    assert low["lo"] == 0.0 and low["clipped"]
    mid = stats.rate_interval([0.4, 0.5, 0.6])
    assert not mid["clipped"] and mid["lo"] == pytest.approx(stats.t_interval([0.4, 0.5, 0.6])["lo"])
    assert not stats.rate_interval([0.5])["clipped"]  # one seed: no interval to clip
