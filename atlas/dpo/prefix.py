"""Shared-prompt log-probabilities: each distinct prompt is run once, its completions after it.

A preference pair's chosen and rejected completions continue the same prompt, and a phase's
pairs come from a handful of prompts (one per island served), while prompts are 3-5x longer
than completions. Running every (prompt, completion) row in full repeats the prompt's work
in every row; here a prompt is run once (with gradient, when training), its keys and values
are handed to the completions of that prompt as a KV cache, and the completions run as one
right-padded batch after it. The maths is the same teacher-forced log-probability as
``atlas.dpo.logprobs`` (a test checks equality within float32 rounding); only the work
differs. Used by the DPO step (policy, with gradient), by the once-per-phase reference table
and by the gate's no-grad passes.

Truncation: a prompt and its completions share one cut. The prompt keeps its last
``max_length - longest completion`` tokens (at least one when a completion alone fills
``max_length``, which is then cut on the right), so both sides of a pair are scored given the
same context x, as DPO assumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache


class PromptGroup(NamedTuple):
    """A prompt's token ids and the completions (token ids, EOS included) scored after it.
    (A named tuple: Lightning moves batches through collections and rebuilds tuples.)"""

    prompt: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def cut_group(prompt: list[int], completions: Sequence[list[int]], eos: int, max_length: int
              ) -> PromptGroup:
    """Append EOS to each completion, then cut prompt and completions to ``max_length``."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    comps = [c if c and c[-1] == eos else [*c, eos] for c in completions]
    longest = max(len(c) for c in comps)
    if longest >= max_length:
        keep_prompt = 1 if prompt else 0
        comps = [c[: max_length - keep_prompt] for c in comps]
        prompt = prompt[len(prompt) - keep_prompt:]
    else:
        prompt = prompt[max(0, len(prompt) - (max_length - longest)):]
    return PromptGroup(tuple(prompt), tuple(tuple(c) for c in comps))


def encode_group(tokenizer, prompt: str, completions: Sequence[str], max_length: int
                 ) -> PromptGroup:
    """Tokenise a prompt and its completions apart (as the agent produced them) and cut."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no eos_token_id; set tokenizer.eos_token")
    return cut_group(_ids(tokenizer, prompt), [_ids(tokenizer, c) for c in completions], eos,
                     max_length)


def _group_logits(model: torch.nn.Module, prompt: torch.Tensor, comps: torch.Tensor,
                  lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits predicting each token of ``comps`` (k, m; right-padded, ``lengths`` real
    tokens) after the 1-D ``prompt``: (k, m, V), and the (k, m) mask of real tokens."""
    k, m = comps.shape
    n = prompt.shape[0]
    out = model(input_ids=prompt[None], use_cache=True, past_key_values=DynamicCache(),
                logits_to_keep=1)
    first = out.logits[:, -1].float()  # (1, V): predicts each completion's first token
    layers = [(layer.keys.expand(k, -1, -1, -1), layer.values.expand(k, -1, -1, -1))
              for layer in out.past_key_values.layers]
    cache = DynamicCache(ddp_cache_data=layers)
    pos = torch.arange(m, device=comps.device)
    valid = pos[None, :] < lengths[:, None]  # (k, m)
    attention = torch.cat([torch.ones((k, n), dtype=torch.long, device=comps.device),
                           valid.long()], dim=1)
    if m > 1:
        # completion token j >= 1 is predicted at completion position j - 1
        rest = model(input_ids=comps[:, :-1], attention_mask=attention[:, :-1],
                     position_ids=(n + pos[:-1])[None].expand(k, -1), past_key_values=cache,
                     use_cache=True).logits.float()  # (k, m-1, V)
        logits = torch.cat([first.expand(k, 1, -1), rest], dim=1)
    else:
        logits = first.expand(k, 1, -1)
    return logits, valid


def _group_token_logps(model: torch.nn.Module, prompt: torch.Tensor, comps: torch.Tensor,
                       lengths: torch.Tensor) -> torch.Tensor:
    """Per-token log p of ``comps`` after ``prompt``: (k, m), zeros on padding."""
    logits, valid = _group_logits(model, prompt, comps, lengths)
    picked = logits.gather(-1, comps[..., None]).squeeze(-1)
    return (picked - torch.logsumexp(logits, dim=-1)) * valid


def group_tensors(model: torch.nn.Module, group: PromptGroup
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A group as tensors on the model's device: prompt (n,), completions (k, m) right-padded,
    lengths (k,)."""
    device = next(p for p in model.parameters()).device
    if not group.prompt:
        raise ValueError("a prompt group needs at least one prompt token (the first completion "
                         "token is predicted from it)")
    lengths = torch.tensor([len(c) for c in group.completions], device=device)
    comps = torch.zeros((len(group.completions), int(lengths.max())), dtype=torch.long,
                        device=device)
    for i, c in enumerate(group.completions):
        comps[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    return torch.tensor(group.prompt, dtype=torch.long, device=device), comps, lengths


def group_logits(model: torch.nn.Module, group: PromptGroup
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (k, m, V) float32, completion ids (k, m), real-token mask (k, m)) of a group:
    what the gate's KL needs beyond log-probs."""
    prompt, comps, lengths = group_tensors(model, group)
    logits, valid = _group_logits(model, prompt, comps, lengths)
    return logits, comps, valid


def group_logps(model: torch.nn.Module, group: PromptGroup, reduction: str = "sum",
                recompute: bool = False) -> torch.Tensor:
    """Sequence log-prob of each completion of ``group``: ``sum`` (DPO) or ``mean`` (gate).

    ``recompute``: keep only the inputs of this group's forward and recompute it in the
    backward pass (activation checkpointing at the granularity of one prompt group).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    prompt, comps, lengths = group_tensors(model, group)
    if recompute and torch.is_grad_enabled():
        tok = checkpoint(_group_token_logps, model, prompt, comps, lengths, use_reentrant=False)
    else:
        tok = _group_token_logps(model, prompt, comps, lengths)
    total = tok.sum(-1)
    return total if reduction == "sum" else total / lengths.to(total.dtype)


def grouped_logps(model: torch.nn.Module, groups: Sequence[PromptGroup],
                  reduction: str = "sum", recompute: bool = False) -> list[torch.Tensor]:
    """``group_logps`` for each group, in order."""
    return [group_logps(model, g, reduction, recompute) for g in groups]


def chunked(group: PromptGroup, rows: int) -> list[PromptGroup]:
    """Split a group's completions into groups of at most ``rows`` (bounds no-grad memory)."""
    c = group.completions
    return [PromptGroup(group.prompt, c[i:i + rows]) for i in range(0, len(c), max(1, rows))]


@torch.no_grad()
def pair_logps_table(model: torch.nn.Module, encoded: Sequence[PromptGroup],
                     rows_per_pass: int = 8) -> torch.Tensor:
    """(n, 2) sequence log-probs of every pair's (chosen, rejected) under ``model`` as it is
    now: each distinct prompt of the whole phase runs once, each distinct completion once.
    The reference's table is computed once per phase, not once per step and epoch."""
    from atlas.dpo.batching import SharedPromptCollator

    if not encoded:
        raise ValueError("encoded: the table needs at least one pair")
    batch = SharedPromptCollator(encoded)(range(len(encoded)))
    flat = torch.cat([group_logps(model, part, "sum")
                      for g in batch["groups"] for part in chunked(g, rows_per_pass)])
    return flat[batch["slots"].to(flat.device)]
