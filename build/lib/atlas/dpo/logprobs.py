"""Teacher-forced log-probabilities of completion tokens, computed only where they matter.

The logits at position t predict token t+1, so completion token t is scored by the logits
at t-1 ("standard causal alignment"). Only completion positions are projected through the
LM head's softmax: prompts are often longer than completions and the vocabulary is large, so
``logits_to_keep`` drops the prompt prefix common to the batch and the softmax runs on the
selected rows only (in float32, whatever the model's dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CompletionLogits:
    """Logits at the positions that predict completion tokens, flattened over the batch."""

    logits: torch.Tensor  # (N, V): one row per scored completion token
    targets: torch.Tensor  # (N,): the token each row predicts
    rows: torch.Tensor  # (N,): which batch row the token belongs to
    n_rows: int

    def token_logps(self) -> torch.Tensor:
        """log p(target) per scored token, float32, differentiable."""
        logits = self.logits.float()
        picked = logits.gather(-1, self.targets[:, None]).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    def per_row(self, values: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        """Sum (or mean) per-token ``values`` into one number per batch row."""
        out = torch.zeros(self.n_rows, dtype=values.dtype, device=values.device)
        out = out.index_add(0, self.rows, values)
        if reduction == "sum":
            return out
        if reduction == "mean":
            counts = torch.bincount(self.rows, minlength=self.n_rows).to(values.dtype)
            return out / counts.clamp(min=1)
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")

    def token_counts(self) -> torch.Tensor:
        """Scored completion tokens per row."""
        return torch.bincount(self.rows, minlength=self.n_rows)


def completion_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> CompletionLogits:
    """Run ``model`` on a right-padded batch; keep logits that predict completion tokens."""
    device = next(p for p in model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention = batch["attention_mask"].to(device)
    mask = batch["completion_mask"].to(device)
    width = input_ids.shape[1]
    # target t is predicted at t-1; the first target sits one left of the earliest completion
    scored = mask[:, 1:].bool()  # (B, T-1): target position t+1 is a completion token
    if not scored.any():
        raise ValueError("batch has no scorable completion tokens (empty prompt and completion?)")
    first = int(scored.any(0).nonzero()[0])  # earliest logit position used by any row
    keep = width - first
    out = model(input_ids=input_ids, attention_mask=attention, use_cache=False,
                logits_to_keep=keep)
    logits = out.logits  # (B, keep, V) for positions first..T-1
    logits = logits[:, : keep - 1]  # position T-1 predicts nothing
    sel = scored[:, first:]
    rows = torch.arange(input_ids.shape[0], device=device)[:, None].expand_as(sel)[sel]
    targets = input_ids[:, first + 1:][sel]
    return CompletionLogits(logits=logits[sel], targets=targets, rows=rows,
                            n_rows=input_ids.shape[0])


def sequence_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                   reduction: str = "sum") -> torch.Tensor:
    """Sequence log-prob of each row's completion: ``sum`` (DPO) or ``mean`` (inspector)."""
    cl = completion_logits(model, batch)
    return cl.per_row(cl.token_logps(), reduction)
