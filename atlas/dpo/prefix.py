"""Shared-prompt log-probabilities: each distinct prompt is run once, its completions after it.

A preference pair's chosen and rejected completions continue the same prompt, and a phase's
pairs come from a handful of prompts (one per island served), while prompts are 3-5x longer
than completions. Running every (prompt, completion) row in full repeats the prompt's work
in every row; here a prompt is run once (with gradient, when training), its keys and values
are handed to the completions of that prompt as a KV cache, and each completion runs after
it as one unpadded row (no work on padding; completions differ in length by 2x and more), or,
with ``padded``, all of a prompt's completions as one right-padded batch after it (fewer,
wider passes: what keeps a GPU busy; ``resolve_padded`` picks per device).
The maths is the same teacher-forced log-probability as
``atlas.dpo.logprobs`` (a test checks equality within float32 rounding); only the work
differs. Used by the DPO step (policy, with gradient), by the once-per-phase reference table
and by the gate's no-grad passes.

Truncation: a prompt and its completions share one cut. The prompt keeps its last
``max_length - longest completion`` tokens (at least one when a completion alone fills
``max_length``, which is then cut on the right), so both sides of a pair are scored given the
same context x, as DPO assumes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from atlas.dpo.batching import PromptGroup, SharedPromptCollator


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


def _prefix(model: torch.nn.Module, prompt: torch.Tensor
            ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Run the prompt once: the float32 logits that predict a completion's first token (V,)
    and every layer's keys and values (differentiable when gradients are on)."""
    out = model(input_ids=prompt[None], use_cache=True, past_key_values=DynamicCache(),
                logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return out.logits[0, -1].float(), kv


def _after_prefix(model: torch.nn.Module, n: int, first: torch.Tensor,
                  kv: list[tuple[torch.Tensor, torch.Tensor]], comp: torch.Tensor
                  ) -> torch.Tensor:
    """float32 logits (L, V) predicting each token of one completion ``comp`` (L,) after a
    prompt of ``n`` tokens. One unpadded row per completion: no work on padding, and the
    prompt's cache is read, never copied per row (``DynamicCache`` concatenates into new
    tensors, so ``kv`` stays as it was for the next completion)."""
    if comp.shape[0] == 1:
        return first[None]
    cache = DynamicCache(ddp_cache_data=kv)
    pos = torch.arange(n, n + comp.shape[0] - 1, device=comp.device)[None]
    rest = model(input_ids=comp[None, :-1], position_ids=pos, past_key_values=cache,
                 use_cache=True).logits[0].float()
    return torch.cat([first[None], rest])  # token j is predicted at completion position j - 1


def resolve_padded(setting: bool | str, device: torch.device | str) -> bool:
    """``dpo.padded`` / ``gate.padded``: true or false as given; ``auto``: padded on CUDA (one
    wide pass per prompt keeps the GPU busy; ``atlas.bench accept`` measures it there), one
    row each on the CPU (``python -m atlas.bench dpo`` measured both, docs/results.md)."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"padded must be true, false or auto, got {setting!r}")
    return torch.device(device).type == "cuda"


def _after_prefix_padded(model: torch.nn.Module, n: int, first: torch.Tensor,
                         kv: list[tuple[torch.Tensor, torch.Tensor]],
                         comps: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``_after_prefix`` for all ``comps`` at once: one right-padded batch after the prompt's
    cache (its rows expanded, not copied, until the cache concatenates). Right padding sits
    after every real token, so causal attention never reads it and no mask is needed; the
    padded positions' logits are dropped."""
    rest = [c[:-1] for c in comps]
    width = max(r.shape[0] for r in rest)
    if width == 0:
        return [first[None] for _ in comps]
    k = len(comps)
    ids = torch.zeros(k, width, dtype=torch.long, device=first.device)
    for i, r in enumerate(rest):
        ids[i, : r.shape[0]] = r
    cache = DynamicCache(ddp_cache_data=[(key.expand(k, -1, -1, -1), value.expand(k, -1, -1, -1))
                                         for key, value in kv])
    pos = torch.arange(n, n + width, device=first.device)[None].expand(k, -1)
    logits = model(input_ids=ids, position_ids=pos, past_key_values=cache,
                   use_cache=True).logits.float()
    return [torch.cat([first[None], logits[i, : r.shape[0]]]) for i, r in enumerate(rest)]


def _token_logps(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, ids[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _group_sums(model: torch.nn.Module, prompt: torch.Tensor, *comps: torch.Tensor
                ) -> torch.Tensor:
    """Summed log p of each completion after ``prompt``: (k,)."""
    first, kv = _prefix(model, prompt)
    n = prompt.shape[0]
    return torch.stack([_token_logps(_after_prefix(model, n, first, kv, c), c).sum()
                        for c in comps])


def _group_sums_padded(model: torch.nn.Module, prompt: torch.Tensor, *comps: torch.Tensor
                       ) -> torch.Tensor:
    """``_group_sums`` with the completions in one padded batch."""
    first, kv = _prefix(model, prompt)
    logits = _after_prefix_padded(model, prompt.shape[0], first, kv, comps)
    return torch.stack([_token_logps(lg, c).sum() for lg, c in zip(logits, comps)])


def group_tensors(model: torch.nn.Module, group: PromptGroup
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A group as tensors on the model's device: the prompt (n,) and each completion (L_i,)."""
    device = next(p for p in model.parameters()).device
    if not group.prompt:
        raise ValueError("a prompt group needs at least one prompt token (the first completion "
                         "token is predicted from it)")
    if not group.completions or not all(group.completions):
        raise ValueError("a prompt group needs non-empty completions")
    return (torch.tensor(group.prompt, dtype=torch.long, device=device),
            [torch.tensor(c, dtype=torch.long, device=device) for c in group.completions])


def completion_logits(model: torch.nn.Module, group: PromptGroup, padded: bool = False
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """For each completion of ``group``: (float32 logits (L, V) predicting its tokens, its ids
    (L,)). The prompt runs once for all. What the gate's KL needs beyond log-probs.
    ``padded``: the completions run as one padded batch (``resolve_padded``)."""
    prompt, comps = group_tensors(model, group)
    first, kv = _prefix(model, prompt)
    if padded:
        yield from zip(_after_prefix_padded(model, prompt.shape[0], first, kv, comps), comps)
        return
    for c in comps:
        yield _after_prefix(model, prompt.shape[0], first, kv, c), c


def group_logps(model: torch.nn.Module, group: PromptGroup, reduction: str = "sum",
                recompute: bool = False, padded: bool = False) -> torch.Tensor:
    """Sequence log-prob of each completion of ``group``: ``sum`` (DPO) or ``mean`` (gate).

    ``recompute``: keep only the inputs of this group's forward and recompute it in the
    backward pass (activation checkpointing at the granularity of one prompt group).
    ``padded``: the completions run as one padded batch (``resolve_padded``).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    prompt, comps = group_tensors(model, group)
    sums = _group_sums_padded if padded else _group_sums
    if recompute and torch.is_grad_enabled():
        total = checkpoint(sums, model, prompt, *comps, use_reentrant=False)
    else:
        total = sums(model, prompt, *comps)
    if reduction == "sum":
        return total
    lengths = torch.tensor([c.shape[0] for c in comps], dtype=total.dtype, device=total.device)
    return total / lengths


def grouped_logps(model: torch.nn.Module, groups: Sequence[PromptGroup],
                  reduction: str = "sum", recompute: bool = False, padded: bool = False
                  ) -> list[torch.Tensor]:
    """``group_logps`` for each group, in order."""
    return [group_logps(model, g, reduction, recompute, padded) for g in groups]


@torch.no_grad()
def pair_logps_table(model: torch.nn.Module, encoded: Sequence[PromptGroup]) -> torch.Tensor:
    """(n, 2) sequence log-probs of every pair's (chosen, rejected) under ``model`` as it is
    now: each distinct prompt of the whole phase runs once, each distinct completion once.
    The reference's table is computed once per phase, not once per step and epoch.

    It runs on the very kernels the policy's training forward runs on (no pre-packed
    weights): DPO subtracts the two, and in bf16 SmolLM2's packed and plain linear layers
    differ by up to ~1.4 nats in a sequence's log-prob, which would start a phase's
    log-ratios off zero (``tests/test_dpo.py`` checks the first step's loss is log 2)."""
    if not encoded:
        raise ValueError("encoded: the table needs at least one pair")
    batch = SharedPromptCollator(encoded)(range(len(encoded)))
    flat = torch.cat([group_logps(model, g, "sum") for g in batch["groups"]])
    return flat[batch["slots"].to(flat.device)]
