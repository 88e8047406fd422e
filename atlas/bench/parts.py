"""Where a fine-tuning phase's time goes: each part measured, beside its arithmetic floor.

A part's floor is its least multiply-adds (``atlas.bench.floor.macs_per_token``: the decoder
layers' linear maps per token, the LM head per scored token; attention not counted) at the
machine's matrix-multiply rate at the model's shapes (``linear_rate``, measured in the same
process). The counts follow the work a phase must do, whatever the implementation:

- the steps' forward: every token a step runs through the layers, every completion token
  through the LM head;
- their backward: the same again (the gradient to each frozen layer's input is one product
  of the layer's size; LoRA's own gradients are a few hundredths of it, not counted);
- the optimiser: AdamW over the LoRA factors, no arithmetic worth a floor;
- the reference's table: each distinct prompt and completion of the phase once, no grad;
- the gate's pass: per policy, each item's prompt once and each distinct completion once,
  through the layers and the LM head.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atlas.bench.floor import macs_per_token


@dataclass(frozen=True)
class Part:
    """One part of a phase: measured seconds and the least multiply-adds its work takes."""

    name: str
    seconds: float
    macs: float

    def row(self, rate: float, phase_s: float) -> dict[str, Any]:
        floor = self.macs / rate if self.macs else 0.0
        return {"part": self.name, "seconds": self.seconds, "floor_s": floor,
                "x_floor": self.seconds / floor if floor else None,
                "share": self.seconds / phase_s if phase_s else None}


def group_tokens(groups: Sequence[Any]) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of ``PromptGroup``s, each group's prompt once."""
    return (sum(len(g.prompt) for g in groups),
            sum(len(c) for g in groups for c in g.completions))


def dpo_parts(metrics: dict[str, float], table: Sequence[Any], dims: dict[str, int],
              head_s: float) -> list[Part]:
    """A phase's parts from its ``PhaseResult.metrics`` (the module's part clock), the
    reference table's groups (``table``: each distinct prompt with its distinct completions)
    and ``head_s``, the measured seconds of the LM head and log-probs inside the forward."""
    body, head = macs_per_token(dims)
    tokens, scored = metrics["tokens"], metrics["scored_tokens"]
    step = tokens * body + scored * head
    prompts, comps = group_tokens(table)
    return [Part("forward (layers, LM head, log-probs, loss)", metrics["forward_seconds"], step),
            Part("  of it: LM head and log-probs", head_s, scored * head),
            Part("backward", metrics["backward_seconds"], step),
            Part("optimiser (clipping, AdamW on LoRA)", metrics["optimizer_seconds"], 0.0),
            Part("reference table (once a phase)", metrics["reference_table_seconds"],
                 (prompts + comps) * body + comps * head),
            Part("DPO phase, all of it", metrics["seconds"],
                 2 * step + (prompts + comps) * body + comps * head)]


def gate_part(seconds: float, groups: Sequence[Any], policies: int, dims: dict[str, int]
              ) -> Part:
    """The gate's pass over ``groups`` (one per item) for ``policies`` forwards each."""
    body, head = macs_per_token(dims)
    prompts, comps = group_tokens(groups)
    return Part(f"gate pass ({policies} policies)", seconds,
                policies * ((prompts + comps) * body + comps * head))


def head_seconds(model: Any, lengths: Sequence[int], repeats: int = 3) -> float:
    """Seconds of the LM head and the log-probs of the targets for completions of
    ``lengths`` tokens, as the DPO step runs them (gradients on, float32 log-softmax over
    the vocabulary); the best of ``repeats``."""
    import torch

    lm_head = model.get_output_embeddings()
    weight = lm_head.weight
    best = float("inf")
    for _ in range(repeats):
        hidden = [torch.randn(n, weight.shape[1], dtype=weight.dtype, device=weight.device,
                              requires_grad=True) for n in lengths]
        ids = [torch.randint(weight.shape[0], (n,), device=weight.device) for n in lengths]
        cuda = weight.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for h, y in zip(hidden, ids):
            logits = lm_head(h).float()
            (logits.gather(-1, y[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)).sum()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def print_parts(rows: list[dict[str, Any]], title: str) -> None:
    """One markdown table of a setting's parts."""
    print(f"\n{title}")
    print("| part | measured s | floor s | x floor | share of phase |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['x_floor']:.2f}x" if r["x_floor"] is not None else "-"
        share = f"{100 * r['share']:.0f} %" if r["share"] is not None else "-"
        print(f"| {r['part']} | {r['seconds']:.2f} | {r['floor_s']:.2f} | {ratio} | {share} |")
