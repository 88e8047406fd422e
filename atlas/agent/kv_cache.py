"""The decode's KV cache: prompts prefilled once, copied per sample, in preallocated buffers.

The n samples of one prompt share the prompt, so each prompt runs once and its keys and
values are repeated n times (``prefill_rows``); the buffers are sized for the whole call
(``BufferLayer``), so a step writes in place instead of ``torch.cat``. The lookup path's rows
keep lengths of their own (``RaggedLayer``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer


class BufferLayer(DynamicLayer):
    """A KV layer backed by a preallocated buffer; ``update`` writes in place, returns a view."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int,
                 zeros: bool = False) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        alloc = keys.new_zeros if zeros else keys.new_empty
        self.kbuf = alloc((b, h, capacity, d))
        self.vbuf = alloc((b, h, capacity, d))
        self.kbuf[:, :, :n].copy_(keys)
        self.vbuf[:, :, :n].copy_(values)
        self.length = n
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.kbuf[:, :, : self.length]
        self.values = self.vbuf[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        s = key_states.shape[-2]
        if self.length + s > self.kbuf.shape[2]:
            raise RuntimeError("KV buffer overflow: capacity was sized for max_new_tokens")
        self.kbuf[:, :, self.length : self.length + s].copy_(key_states)
        self.vbuf[:, :, self.length : self.length + s].copy_(value_states)
        self.length += s
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf = self.kbuf.index_select(0, indices)
        self.vbuf = self.vbuf.index_select(0, indices)
        self._views()


class RaggedLayer(BufferLayer):
    """A KV layer whose rows keep their own lengths (the lookup path): a pass writes each
    row's new keys and values at that row's ``slots`` and attention reads the buffer up to
    ``length`` (set per pass) under the pass's mask, so a row's rejected guesses are simply
    overwritten. Zeros, not empty: a masked slot weighs 0 in attention, and 0 * NaN is NaN."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__(keys, values, capacity, zeros=True)
        self.slots: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        at = self.slots[:, None, :, None].expand(-1, key_states.shape[1], -1,
                                                 key_states.shape[-1])
        self.kbuf.scatter_(2, at, key_states.to(self.kbuf.dtype))
        self.vbuf.scatter_(2, at, value_states.to(self.vbuf.dtype))
        self._views()
        return self.keys, self.values


def buffer_cache(layers: list[DynamicLayer]) -> DynamicCache:
    """A ``DynamicCache`` over the given layers (what the model's forward writes to)."""
    cache = DynamicCache()
    cache.layers = layers
    return cache


@dataclass
class Prefilled:
    """The prompts' KV (padded to one width, one row per sample), mask and last logits."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    prompt_mask: torch.Tensor
    logits: torch.Tensor
    prompt_tokens: int = 0  # real prompt tokens, each prompt counted once
    seconds: float = 0.0


def _prefill(model, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
             device: torch.device) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Prompt caches (one per padded batch of prompts), last logits, attention mask.

    Prompts of one length share a forward pass; different lengths are prefilled apart, so
    that no prompt's prefill depends on another's padding.
    """
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    padded = bool((mask == 0).any())
    cache = DynamicCache(config=model.config)
    pos = (mask.cumsum(-1) - 1).clamp_(min=0)
    out = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[:, -1].float(), mask


def prefill_rows(model, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                 streams: Sequence[int], counts: Sequence[int], device: torch.device
                 ) -> Prefilled:
    """Each prompt's KV and last logits repeated once per sample (``counts[j]`` rows for
    prompt j), left-padded to one width. Prompts that share a random stream (``sample``'s)
    are prefilled as one padded batch when every prompt does; else one prefill each."""
    t0 = time.perf_counter()
    groups: list[list[int]] = []
    for j in range(len(prompts)):
        if groups and streams[groups[-1][0]] == streams[j] and len(set(streams)) == 1:
            groups[-1].append(j)
        else:
            groups.append([j])
    parts = [_prefill(model, tokenizer, [prompts[j] for j in g], device) for g in groups]
    width = max(m.shape[1] for _, _, m in parts)
    prompt_tokens = int(sum(m.sum() for _, _, m in parts))
    reps = [torch.tensor([counts[j] for j in g], device=device) for g in groups]
    keys, values = [], []
    for li in range(len(parts[0][0].layers)):
        ks, vs = [], []
        for (cache, _, m), rep in zip(parts, reps):
            k = cache.layers[li].keys.repeat_interleave(rep, dim=0)
            v = cache.layers[li].values.repeat_interleave(rep, dim=0)
            pad = width - m.shape[1]
            if pad:
                k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                v = torch.nn.functional.pad(v, (0, 0, pad, 0))
            ks.append(k)
            vs.append(v)
        keys.append(torch.cat(ks))
        values.append(torch.cat(vs))
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0))
                      .repeat_interleave(rep, dim=0) for (_, _, m), rep in zip(parts, reps)])
    logits = torch.cat([lg.repeat_interleave(rep, dim=0) for (_, lg, _), rep in zip(parts, reps)])
    return Prefilled(keys, values, mask, logits, prompt_tokens=prompt_tokens,
                     seconds=time.perf_counter() - t0)
