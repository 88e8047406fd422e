"""The gate's evidence G_k for one phase: which prompts and completions it decides on.

One rule orders a phase's prompts for the gate (``gate_prompts``): the prompts held out of
D_k (``hold_out_prompts``) and G_k's items (``gate_items``) both come from it.

Two kinds, chosen per phase (``gate.evidence``) before D_k is built:

- **holdout**: prompts held out of D_k (``hold_out_prompts``), so the gate never scores a
  policy on what it was trained on. It needs many completions to see a gain: subsampled to
  32 informative completions, the gate bench's held-out G_k let a correctly trained policy
  through about 1 time in 4 (``python -m atlas.bench gate --power``);
- **buffer**: the paper's rule (2.2, "a randomly sampled gate subset drawn from the current
  phase buffer"): prompts of the phase's programs, D_k built from all of them. In-sample, so
  it asks whether training moved the policy toward the phase's better programs within the
  KL trust region, not whether that generalises to new prompts. Recorded as such.

``auto`` takes holdout when it carries ``gate.min_holdout_completions`` informative
completions, else the buffer: a CPU-sized phase (8-32 completions) decides on its buffer, a
paper-sized one on held-out prompts. Any G_k with fewer than ``gate.min_completions``
informative completions is "insufficient evidence": the phase makes no decision.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from atlas.dpo.config import GateConfig
from atlas.evolution.buffer import by_prompt, failure_floor, usable
from atlas.types import GateItem, Program

HOLDOUT = "holdout"
BUFFER = "buffer"


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
    groups = by_prompt(programs)
    prompts = list(groups)  # first-seen order by id: deterministic given the programs
    random.Random(seed).shuffle(prompts)

    def informative(ps: list[Program]) -> bool:
        vals = {round(float(q.score), 12) if usable(q) else None for q in ps}
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
    n = len(by_prompt(programs))
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
    groups = by_prompt(programs)
    items = []
    for prompt in prompts:
        comps = groups[prompt]
        if not comps:
            raise ValueError(f"gate prompt {prompt[:40]!r}... has no evaluated completion among "
                             "the programs given")
        scores = [p.score if usable(p) else floor for p in comps]
        best = max(range(len(comps)), key=lambda i: (scores[i], -comps[i].id))
        items.append(GateItem(prompt=prompt, completions=[p.completion for p in comps],
                              scores=scores, preferred=comps[best].completion,
                              ids=[p.id for p in comps]))
    return items


def informative_completions(items: Sequence[GateItem]) -> int:
    """Completions of the items whose scores differ: the ones that can show a gain."""
    return sum(len(it.completions) for it in items if it.informative)


@dataclass
class Evidence:
    """G_k as the gate will see it, and how it was chosen."""

    mode: str  # HOLDOUT | BUFFER
    items: list[GateItem]
    held: list[str] = field(default_factory=list)  # prompts kept out of D_k (holdout only)
    minimum: int = 0  # gate.min_completions
    why: str = ""

    @property
    def informative(self) -> int:
        return informative_completions(self.items)

    @property
    def sufficient(self) -> bool:
        return self.informative >= self.minimum

    def to_event(self) -> dict[str, Any]:
        """What the phase event records of G_k: enough to re-find every completion."""
        return {"mode": self.mode, "in_sample": self.mode == BUFFER,
                "prompts": len(self.items),
                "completions": sum(len(it.completions) for it in self.items),
                "informative_completions": self.informative, "minimum": self.minimum,
                "sufficient": self.sufficient, "why": self.why,
                "program_ids": [list(it.ids) for it in self.items]}


def choose_evidence(programs: Sequence[Program], gate: GateConfig, seed: int,
                    gated: bool) -> Evidence:
    """G_k of a phase whose programs are ``programs`` (rules in the module docstring).

    Ungated (EvoDPO records the gate's numbers and promotes anyway): the buffer's prompts.
    """
    floor = failure_floor(programs)

    def buffer(why: str) -> Evidence:
        prompts = gate_prompts(programs, seed, gate.subset_size)
        return Evidence(BUFFER, gate_items(programs, prompts, failure_score=floor),
                        minimum=gate.min_completions, why=why)

    if not gated:
        return buffer("ungated: numbers recorded, the phase-final policy promoted")
    if gate.evidence == BUFFER:
        return buffer("gate.evidence=buffer")
    held = hold_out_prompts(programs, gate, seed)
    holdout = Evidence(HOLDOUT, gate_items(programs, held, failure_score=floor), held=held,
                       minimum=gate.min_completions)
    if gate.evidence == HOLDOUT:
        holdout.why = "gate.evidence=holdout"
        return holdout
    if holdout.informative >= gate.min_holdout_completions:
        holdout.why = (f"auto: {holdout.informative} held-out informative completions >= "
                       f"gate.min_holdout_completions={gate.min_holdout_completions}")
        return holdout
    return buffer(f"auto: {holdout.informative} held-out informative completions < "
                  f"gate.min_holdout_completions={gate.min_holdout_completions}")
