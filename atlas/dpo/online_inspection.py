"""The Policy Inspector's on-line score (``gate.score_mode=online``, docs/design.md).

S(pi) = the mean task score of programs that pi writes *now* for the gate prompts G_k,
each scored in the sandbox; a failed program counts as the phase's failure floor, as in the
offline score. Why offer it beside the offline score: the offline score re-weights
completions written by earlier policies, so it can only rank what was already sampled; the
on-line score measures what a candidate would write, at the price of (|C_k| + 1) x |G_k| x
``gate.online_samples`` extra samples and evaluations per phase. Every policy samples with
the same seeds (common random numbers), so differences come from the policies, not from the
sampler's noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from atlas.dpo.scoring import PolicySpec, check_spec, running_policy
from atlas.evolution.explorer import Explorer
from atlas.types import Evaluation


@dataclass
class OnlineInspector:
    """Callable ``spec -> S(spec)``; ``records`` keeps every measurement for telemetry."""

    explorer: Explorer  # the agent, the sandbox and the task the phase explored with
    prompts: list[str]
    context: dict[str, Any]  # the task context the programs are scored under (current round)
    samples: int
    temperature: float
    failure_score: float
    seed: int
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts: the on-line inspector needs at least one gate prompt "
                             "(gate.subset_size >= 1)")
        if not math.isfinite(self.failure_score):
            raise ValueError(f"failure_score must be finite, got {self.failure_score!r}")

    def __call__(self, spec: PolicySpec, name: str = "") -> float:
        spec = check_spec(spec, "policy")
        with running_policy(self.explorer.agent.model, spec):
            rows = self.sample_and_score(spec.adapter)
        score = self.score_of(rows)
        flat = [ev for row in rows for ev in row]
        self.records.append({
            "policy": name or spec.kind, "score": score,
            "samples": len(flat), "valid": sum(ev.passed for ev in flat),
            "best": max((ev.score for ev in flat if ev.passed), default=None)})
        return score

    def sample_and_score(self, adapter: str | None) -> list[list[Evaluation]]:
        """Sample ``samples`` completions per gate prompt from ``adapter`` and score them in
        the explorer's sandbox, filing nothing (``Explorer.write_unfiled``)."""
        rows = self.explorer.write_unfiled(self.prompts, self.samples,
                                           temperature=self.temperature, seed=self.seed,
                                           context=self.context, adapter=adapter)
        return [[a.evaluation for a in row] for row in rows]

    def score_of(self, rows: list[list[Evaluation]]) -> float:
        """Mean over prompts of the mean score of that prompt's programs (floor if failed)."""
        per_prompt = []
        for row in rows:
            vals = [ev.score if ev.passed and math.isfinite(ev.score) else self.failure_score
                    for ev in row]
            per_prompt.append(sum(vals) / len(vals))
        return sum(per_prompt) / len(per_prompt)
