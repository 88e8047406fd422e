"""Small-sample statistics for the study's tables (``atlas.report``).

Why these: a study has 5-10 seeds per method, so

* a method's mean gets a **Student t** 95% interval, ``mean +- t(0.975, n-1) * s / sqrt(n)``
  (exact if the per-seed values are normal; with n = 5, t = 2.776, so the interval is honest
  about how little 5 runs pin down, where a bootstrap of 5 values would be too narrow);
* a paired difference between two methods (the same seeds, so the same hidden environments)
  gets a **percentile bootstrap** 95% interval of the mean difference (``resamples`` draws of
  the n differences with replacement, a fixed generator seed so a table is reproducible), and
  its paired t interval beside it; the bootstrap makes no normality assumption but is known
  to be too narrow for n this small, which is why both are printed;
* the **exact two-sided Wilcoxon signed-rank p** counts all 2^n sign assignments, so with
  n = 5 no difference, however large, can reach p < 2/32 = 0.0625 (``min_signed_rank_p``):
  the table prints that floor rather than claim significance at 0.05, and how many pairs
  were zero or tied (``ties``);
* a pre-registered family of comparisons gets **Holm**-adjusted p (``holm``), and a rate's
  interval is clipped to [0, 1] (``rate_interval``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000
BOOT_SEED = 0


def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def t_interval(values: Sequence[float | None], level: float = LEVEL) -> dict[str, float | int]:
    """Mean, sample std (ddof=1), and the t interval of the mean over the finite values."""
    from scipy.stats import t

    xs = finite(values)
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "lo": math.nan, "hi": math.nan}
    mean = float(np.mean(xs))
    if n == 1:
        return {"n": 1, "mean": mean, "std": math.nan, "lo": math.nan, "hi": math.nan}
    std = float(np.std(xs, ddof=1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def bootstrap_interval(values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES,
                       seed: int = BOOT_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (NaN for fewer than 2 values)."""
    xs = np.asarray(finite(values))
    if xs.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, xs.size, size=(resamples, xs.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``a``, ties given their average rank."""
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    sorted_a = a[order]
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def signed_rank_p(diffs: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p: zero differences dropped, ties by average
    rank, the null distribution of W+ counted exactly over all 2^n signs. Why counted, not
    enumerated: average ranks are multiples of 1/2, so the sums of doubled ranks are integers
    and their distribution takes n * sum(ranks) steps, where listing 2^20 sign patterns for a
    study of 20 paired blocks would take seconds."""
    d = np.asarray([x for x in finite(diffs) if x != 0.0])
    n = d.size
    if n == 0:
        return 1.0
    doubled = [int(round(2 * r)) for r in _ranks(np.abs(d))]
    total = sum(doubled)
    w = sum(q for q, x in zip(doubled, d) if x > 0)
    counts = [1] + [0] * total  # counts[s]: sign patterns whose doubled W+ is s
    for q in doubled:
        counts = [c + (counts[s - q] if s >= q else 0) for s, c in enumerate(counts)]
    extreme = abs(2 * w - total)
    return sum(c for s, c in enumerate(counts) if abs(2 * s - total) >= extreme) / 2 ** n


def ties(diffs: Sequence[float]) -> dict[str, int]:
    """What the signed-rank test could not rank apart: ``zero`` differences (dropped before
    ranking) and ``tied`` non-zero differences whose size another shares (given their average
    rank). Why printed: the agent's best is mostly ties, and a p from 3 untied pairs of 10
    says less than its value suggests."""
    xs = finite(diffs)
    sizes = [abs(x) for x in xs if x != 0.0]
    return {"zero": sum(1 for x in xs if x == 0.0),
            "tied": sum(1 for a in sizes if sizes.count(a) > 1)}


def min_signed_rank_p(n: int) -> float:
    """The smallest two-sided p the exact signed-rank test can give with n non-zero pairs."""
    return 1.0 if n <= 0 else min(1.0, 2.0 / 2 ** n)


def paired(a: Mapping[Any, float | None], b: Mapping[Any, float | None],
           level: float = LEVEL) -> dict[str, Any]:
    """A - B over the keys (seeds, or (task, seed) blocks) both have a finite value for: mean
    difference, its bootstrap and t intervals, the exact signed-rank p with its tie counts
    and the smallest p that test could have given."""
    seeds = sorted(s for s in set(a) & set(b) if finite([a[s]]) and finite([b[s]]))
    diffs = [float(a[s]) - float(b[s]) for s in seeds]  # type: ignore[arg-type]
    t = t_interval(diffs, level)
    lo, hi = bootstrap_interval(diffs, level)
    nonzero = sum(1 for x in diffs if x != 0.0)
    return {"n": len(seeds), "seeds": seeds, "diffs": diffs, "mean": t["mean"],
            "boot_lo": lo, "boot_hi": hi, "t_lo": t["lo"], "t_hi": t["hi"],
            "wins": sum(1 for x in diffs if x > 0), "losses": sum(1 for x in diffs if x < 0),
            "p_signed_rank": signed_rank_p(diffs) if diffs else math.nan,
            "ties": ties(diffs), "p_min": min_signed_rank_p(nonzero)}


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p of a family, in the order given: sorted ascending, the
    i-th smallest (from 0) is multiplied by m - i, kept monotone and capped at 1. ``m`` is
    the family's size as given, a missing p (None or NaN: no paired data) included, so a
    comparison that could not be made still counts against the others, as pre-registered;
    it gets None."""
    m = len(ps)
    known = sorted((float(p), i) for i, p in enumerate(ps)
                   if p is not None and math.isfinite(float(p)))
    out: list[float | None] = [None] * m
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def rate_interval(values: Sequence[float | None], level: float = LEVEL) -> dict[str, float | int]:
    """``t_interval`` of per-seed rates with its ends clipped to [0, 1], and ``clipped`` True
    where one was. Why: a t interval of rates near 0 or 1 reaches past them (+0.5 [-0.07,
    1.07]), which no rate can be."""
    ci = t_interval(values, level)
    lo, hi = ci["lo"], ci["hi"]
    clipped = bool(math.isfinite(lo) and (lo < 0.0 or hi > 1.0))
    if math.isfinite(lo):
        ci["lo"], ci["hi"] = max(0.0, lo), min(1.0, hi)
    return {**ci, "clipped": clipped}


def binomial_p(k: int, n: int) -> float | None:
    """Exact two-sided binomial p of ``k`` successes in ``n`` fair trials (the sum of the
    outcomes no more likely than ``k``); None for n = 0. The exact sign (McNemar) test of
    ``k`` fail -> pass against ``n - k`` pass -> fail, and the test of a held-out accuracy
    of ``k / n`` against chance."""
    if n <= 0:
        return None
    probs = [math.comb(n, i) / 2.0 ** n for i in range(n + 1)]
    p = sum(q for q in probs if q <= probs[k] * (1 + 1e-9))
    return min(1.0, p)


#: below this many held-out pairs an accuracy is printed as "too few pairs": with 9 pairs,
#: even 7 of 9 right has p = 0.18
MIN_ACCURACY_PAIRS = 10


def wilson_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """Wilson score interval of a rate ``k / n``: always inside [0, 1] (None for n = 0)."""
    from scipy.stats import norm

    if n <= 0:
        return None
    z = float(norm.ppf(0.5 + level / 2))
    phat = k / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))
