"""Causal attention in blocks of queries: eager's products over the keys a block can see.

A phase's prompts are several times longer than its completions, and a prompt attends to
itself causally: transformers' eager kernel scores every query against every key and masks
half of them away, and it copies each key and value head once per query head that shares it
(``repeat_kv``). Here the queries run in blocks of ``BLOCK`` rows, each against the keys up
to its last query only, so the prompt's products are a little over half the square; the
query heads that share a key head run as one matrix product against it, so nothing is
copied. Each block's scores go through the same float32 softmax as eager's, so the
log-probs equal eager's and SDPA's within float rounding (``tests/test_dpo.py``).

It serves the causal passes of a phase only: a pass whose keys end with its queries and
which masks nothing else (no padding), as every shared-prompt forward is
(``atlas.dpo.prefix``: one unpadded row, or right-padded rows whose padding no real query
reads). Anything else (a padding mask, dropout in training) runs eager's own code. Selected
by ``dpo.attention=blocked`` (``atlas.dpo.attention``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import causal_mask_function, eager_mask, prepare_padding_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

#: the attention implementation's name in transformers' registries
NAME = "atlas_blocked"
#: queries per block: small enough that the prompt's masked corner stays small (the
#: products are (1 + BLOCK / n) / 2 of the square for an n-token prompt), large enough that
#: each block's products stay matrix-sized
BLOCK = 128


def bottom_right_causal(q_length: int, kv_length: int, q_offset: int, kv_offset: int,
                        mask_function: Any, attention_mask: torch.Tensor | None) -> bool:
    """Whether a pass's mask is plain causal with its queries the last of its keys."""
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    return (mask_function is causal_mask_function
            and (padding is None or bool(padding.all()))
            and int(q_offset) + q_length == int(kv_offset) + kv_length)


def blocked_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                 kv_offset: int = 0, mask_function: Any = causal_mask_function,
                 attention_mask: torch.Tensor | None = None, **kwargs: Any
                 ) -> torch.Tensor | None:
    """No mask where the pass is plain causal (the kernel builds each block's own corner);
    eager's float mask otherwise (the kernel then runs eager's code)."""
    if bottom_right_causal(q_length, kv_length, q_offset, kv_offset, mask_function,
                           attention_mask):
        return None
    return eager_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                      q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                      attention_mask=attention_mask, **kwargs)


def blocked_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float, dropout: float = 0.0, **kwargs: Any
                      ) -> tuple[torch.Tensor, None]:
    """Causal attention of ``query`` (B, H, Lq, D) over ``key``/``value`` (B, Hkv, Lk, D)
    whose last Lq positions are the queries'; returns (B, Lq, H, D) as eager does."""
    if attention_mask is not None or (dropout and module.training):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling,
                                       dropout, **kwargs)
    b, h, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    g, past = h // hkv, lk - lq
    # query head kv*g + j reads key head kv; the scale on the queries, not on the scores
    # (exact where it is a power of two, as 1/sqrt(64) is)
    q = (query * scaling).reshape(b, hkv, g, lq, d)
    outs = []
    for start in range(0, lq, BLOCK):
        end = min(lq, start + BLOCK)
        rows = end - start
        seen = past + end  # keys up to the block's last query
        qb = q[:, :, :, start:end].reshape(b, hkv, g * rows, d)
        scores = torch.matmul(qb, key[:, :, :seen].transpose(2, 3))
        # the block's corner: query i (at past + start + i) sees no key after itself; only
        # the block's last ``rows`` keys can be ahead of one of its queries
        ahead = torch.ones(rows, rows, dtype=torch.bool, device=query.device).triu(1)
        scores[..., seen - rows:].masked_fill_(ahead.repeat(g, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        outs.append(torch.matmul(probs, value[:, :, :seen]).reshape(b, hkv, g, rows, d))
    out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
    return out.reshape(b, h, lq, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, blocked_attention)
AttentionMaskInterface.register(NAME, blocked_mask)
