"""The study's pre-registered verdict: four comparisons, one per paper question, on endpoints
fixed before the first study run, with Holm-adjusted p. Every other table is exploratory.

Why: one study prints some 80 paired rows and 100 intervals, and at 10 seeds a reader cannot
tell a finding from the one-in-twenty that chance gives. So the test of each question is
fixed here, once (``PREREGISTRATION``; docs/study/README.md, "Pre-registration", quotes it):

- the **arms** form a chain, each adding one part to the one before: ``random_literals``
  (no LLM), ``sample`` (the LLM, never trained), ``evotune`` (fine-tuning on a fixed
  reference), ``evodpo`` (the evolving reference), ``atlas`` (supporters and gate); each
  question compares two neighbours, so it isolates one part;
- the **endpoint** is continuous and per program, where the best score is mostly ties: the
  agent's new-and-valid programs per proposal over phases 3-4 (rounds 5-8 of
  ``experiment=study``, written after 2 and 3 fine-tunings), pooled per run (the sum over the
  phases of ``new_valid`` over the sum of ``proposals``, ``results.json``'s
  ``novelty.by_phase``);
- except for the LLM question: blind tuning only changes numeric literals, so its programs
  are ``constants_only``, never ``new``, and its new-and-valid rate is 0 by construction.
  That question's endpoint is the valid programs above the best parent in their prompt per
  proposal (any novelty label), which blind tuning can earn;
- each comparison pairs the blocks (one task, one seed) of both tasks, so each question has
  one exact two-sided signed-rank p over up to 20 differences, and Holm adjusts the four. A
  block enters a comparison only if both runs finished and share the task secret
  (``atlas.pairing``); every block left out is named with its reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atlas import pairing, stats

#: the most comparisons a family may hold: one per paper question
MAX_FAMILY = 4


@dataclass(frozen=True)
class Endpoint:
    """A per-run rate: the ``writer``'s ``count`` (a field of ``atlas.novelty.tally``) per
    proposal, pooled over the exploration ``phases``."""

    label: str
    count: str
    phases: tuple[int, ...] = (3, 4)
    writer: str = "agent"

    def value(self, run: dict[str, Any]) -> float | None:
        """The run's rate; None without proposals in the phases, or in a record written
        before the count existed (the comparison then names the block, never guesses)."""
        tallies = [row.get(self.writer) or {}
                   for row in (run.get("novelty") or {}).get("by_phase") or []
                   if int(row.get("phase", 0)) in self.phases]
        tallies = [t for t in tallies if t.get("proposals")]
        proposals = sum(int(t["proposals"]) for t in tallies)
        if not proposals or any(self.count not in t for t in tallies):
            return None
        return sum(int(t[self.count] or 0) for t in tallies) / proposals


@dataclass(frozen=True)
class Comparison:
    """One paper question: ``a`` minus ``b`` on ``endpoint``, paired on blocks."""

    question: str
    a: str
    b: str
    endpoint: Endpoint


@dataclass(frozen=True)
class Preregistration:
    """The study the family is about (the runs it counts), the family itself, and the level
    a Holm-adjusted p is read against."""

    experiment: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    family: tuple[Comparison, ...]
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if not 1 <= len(self.family) <= MAX_FAMILY:
            raise ValueError(f"Preregistration.family: {len(self.family)} comparisons; a family "
                             f"holds 1 to {MAX_FAMILY}, one per paper question: move the rest "
                             f"to the exploratory tables")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"Preregistration.alpha: {self.alpha} is not a level; use a number "
                             f"between 0 and 1, e.g. 0.05")
        if len({c.question for c in self.family}) < len(self.family):
            raise ValueError("Preregistration.family: two comparisons ask one question; give "
                             "each question one comparison")
        for i, c in enumerate(self.family):
            for side in ("a", "b"):
                if getattr(c, side) not in self.arms:
                    raise ValueError(f"Preregistration.family[{i}].{side}: "
                                     f"{getattr(c, side)!r} is not one of arms {self.arms}; "
                                     f"add it to arms or fix the name")


NEW_VALID = Endpoint("agent's new & valid per proposal, phases 3-4", "new_valid")
ABOVE_PARENTS = Endpoint("agent's valid above parents per proposal, phases 3-4",
                         "beats_parents")

#: the study of docs/study/README.md ("Pre-registration"); changing it after the first
#: study run restarts the study
PREREGISTRATION = Preregistration(
    experiment="study",
    tasks=("bandit", "pinn"),
    seeds=tuple(range(10, 20)),
    arms=("random_literals", "sample", "evotune", "evodpo", "atlas"),
    family=(
        Comparison("does the LLM beat blind tuning?", "sample", "random_literals",
                   ABOVE_PARENTS),
        Comparison("does fine-tuning help?", "evotune", "sample", NEW_VALID),
        Comparison("does the evolving reference help?", "evodpo", "evotune", NEW_VALID),
        Comparison("does ATLAS help?", "atlas", "evodpo", NEW_VALID),
    ),
)


def in_study(run: dict[str, Any], prereg: Preregistration = PREREGISTRATION) -> bool:
    """Whether a run is one the pre-registration counts: its experiment, task, seed and arm
    (a run without a recorded experiment is not)."""
    return (run.get("experiment") == prereg.experiment and run["task"] in prereg.tasks
            and int(run["seed"]) in prereg.seeds and run["method"] in prereg.arms)


def _left_out(ra: dict[str, Any] | None, rb: dict[str, Any] | None, c: Comparison
              ) -> str | None:
    """Why a block cannot enter comparison ``c``, in a few words; None when it can."""
    for arm, r in ((c.a, ra), (c.b, rb)):
        if r is None:
            return f"no {arm} run"
    assert ra is not None and rb is not None
    for arm, r in ((c.a, ra), (c.b, rb)):
        if not r.get("complete"):
            return f"{arm} unfinished"
    differ = pairing.conflicts([ra, rb])
    if differ:
        return "secrets differ: " + "; ".join(differ)
    for arm, r in ((c.a, ra), (c.b, rb)):
        if c.endpoint.value(r) is None:
            return f"{arm} has no {c.endpoint.count} per proposal in phases " \
                   f"{'-'.join(map(str, c.endpoint.phases))}"
    return None


def _compare(runs: Sequence[dict[str, Any]], c: Comparison, tasks: Sequence[str],
             seeds: Sequence[int]) -> dict[str, Any]:
    by = {(r["task"], r["method"], int(r["seed"])): r for r in runs}
    a: dict[tuple[str, int], float | None] = {}
    b: dict[tuple[str, int], float | None] = {}
    left_out = []
    for task in tasks:
        for seed in seeds:
            ra, rb = by.get((task, c.a, seed)), by.get((task, c.b, seed))
            why = _left_out(ra, rb, c)
            if why:
                left_out.append({"task": task, "seed": seed, "reason": why})
                continue
            assert ra is not None and rb is not None
            a[(task, seed)], b[(task, seed)] = c.endpoint.value(ra), c.endpoint.value(rb)
    res = stats.paired(a, b)
    return {"question": c.question, "a": c.a, "b": c.b, "endpoint": c.endpoint.label,
            "tasks": list(tasks), **res, "blocks": [f"{t} s{s}" for t, s in res["seeds"]],
            "left_out": left_out}


def family(runs: Sequence[dict[str, Any]], prereg: Preregistration = PREREGISTRATION
           ) -> list[dict[str, Any]]:
    """The pre-registered comparisons over the study's runs, each pooled over its tasks'
    blocks, with the exact signed-rank p and its Holm adjustment over the whole family (a
    comparison without data counts in the family's size, so the others are not favoured)."""
    study = [r for r in runs if in_study(r, prereg)]
    rows = [_compare(study, c, prereg.tasks, prereg.seeds) for c in prereg.family]
    adjusted = stats.holm([r["p_signed_rank"] if r["n"] else None for r in rows])
    for row, p in zip(rows, adjusted):
        row["p_holm"] = p
        row["family_size"] = len(rows)
    return rows


def by_task(runs: Sequence[dict[str, Any]], prereg: Preregistration = PREREGISTRATION
            ) -> list[dict[str, Any]]:
    """The family's comparisons per task: exploratory (no adjustment, not the verdict)."""
    study = [r for r in runs if in_study(r, prereg)]
    return [{**_compare(study, c, (task,), prereg.seeds), "task": task}
            for c in prereg.family for task in prereg.tasks]


def endpoint_means(runs: Sequence[dict[str, Any]], prereg: Preregistration = PREREGISTRATION
                   ) -> list[dict[str, Any]]:
    """Per task, arm and endpoint of the family: the mean rate over the finished study runs
    with its t interval clipped to [0, 1] (a rate; ``stats.rate_interval``)."""
    endpoints = list(dict.fromkeys(c.endpoint for c in prereg.family))
    study = [r for r in runs if in_study(r, prereg) and r.get("complete")]
    rows = []
    for task in prereg.tasks:
        for arm in prereg.arms:
            rs = [r for r in study if r["task"] == task and r["method"] == arm]
            if not rs:
                continue
            for e in endpoints:
                rows.append({"task": task, "method": arm, "endpoint": e.label,
                             **stats.rate_interval([e.value(r) for r in rs])})
    return rows


def left_out_summary(row: dict[str, Any]) -> str:
    """The blocks a comparison left out, counted by reason (the blocks themselves are in
    ``report.json``)."""
    reasons = Counter(x["reason"].split(":")[0] for x in row["left_out"])
    return "; ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "none"
