"""The gate's evidence G_k for one phase: which prompts and completions it decides on.

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from atlas.dpo.config import GateConfig
from atlas.evolution.preferences import failure_floor, gate_items, gate_prompts, hold_out_prompts
from atlas.types import GateItem, Program

HOLDOUT = "holdout"
BUFFER = "buffer"


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
