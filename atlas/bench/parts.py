"""Where a fine-tuning phase's time goes: each part measured, beside its arithmetic floor.

A part's floor is its least multiply-adds (``atlas.bench.floor``: the decoder layers' linear
maps per token, the LM head per scored token, attention's two products per causal (query,
key) pair) at the machine's matrix-multiply rate at the model's shapes (``linear_rate``,
measured in the same process). Attention counts: a phase's prompts are several times longer
than its completions, so its products are a fifth to a third of the layers' own work. The
counts follow the work a phase must do, whatever the implementation:

- the steps' forward: every token a step runs through the layers, every completion token
  through the LM head, every (query, key) pair its attention scores;
- their backward: the linear maps again (the gradient to each frozen layer's input is one
  product of the layer's size; LoRA's own gradients are a few hundredths of it, not
  counted), attention's twice (the gradients to queries, keys, values and scores are four
  products where the forward had two);
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

from atlas.bench.floor import attention_macs, macs_per_token


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


def forward_macs(groups: Sequence[Any], dims: dict[str, int]) -> float:
    """One no-grad forward over ``groups``, each prompt once and each completion after it:
    the layers, the LM head over the completions, attention."""
    # deferred: atlas.dpo loads torch; ``python -m atlas.bench dpo --help`` stays fast
    from atlas.dpo.batching import attended_pairs

    body, head = macs_per_token(dims)
    prompts, comps = group_tokens(groups)
    return (prompts + comps) * body + comps * head + attention_macs(dims, attended_pairs(groups))


def dpo_parts(metrics: dict[str, float], table: Sequence[Any], dims: dict[str, int],
              head_s: float) -> list[Part]:
    """A phase's parts from its ``PhaseResult.metrics`` (the module's part clock and its
    work: ``tokens``, ``scored_tokens``, ``attended``), the reference table's groups
    (``table``: each distinct prompt with its distinct completions) and ``head_s``, the
    measured seconds of the LM head and log-probs inside the forward."""
    body, head = macs_per_token(dims)
    tokens, scored = metrics["tokens"], metrics["scored_tokens"]
    attention = attention_macs(dims, metrics.get("attended", 0.0))
    forward = tokens * body + scored * head + attention
    backward = tokens * body + scored * head + 2 * attention
    table_macs = forward_macs(table, dims)
    return [Part("forward (layers, LM head, log-probs, loss)", metrics["forward_seconds"], forward),
            Part("  of it: LM head and log-probs", head_s, scored * head),
            Part("backward", metrics["backward_seconds"], backward),
            Part("optimiser (clipping, AdamW on LoRA)", metrics["optimizer_seconds"], 0.0),
            Part("reference table (once a phase)", metrics["reference_table_seconds"], table_macs),
            Part("DPO phase, all of it", metrics["seconds"], forward + backward + table_macs)]


def gate_part(seconds: float, groups: Sequence[Any], policies: int, dims: dict[str, int]
              ) -> Part:
    """The gate's pass over ``groups`` (one per item) for ``policies`` forwards each."""
    return Part(f"gate pass ({policies} policies)", seconds, policies * forward_macs(groups, dims))


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
