"""SDPA's forward and backward on the CPU at a DPO phase's shapes, bf16 against float32.

    python scripts/attention_backward_cpu.py

SmolLM2's attention (9 heads of 64) for a causal prompt (L x L) and for a completion of Lq
tokens after a cache (Lq x Lk, a bottom-right causal mask), best-of-4 milliseconds after one
warm-up, with the flash kernel (what transformers' ``sdpa`` runs) and with plain matrix
products (``manual``). Numbers belong to one machine: run it with nothing else running.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F


def _mask(lq: int, lk: int) -> torch.Tensor | None:
    return None if lq == lk else torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)


def flash(q, k, v):
    mask = _mask(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


def manual(q, k, v):
    lq, lk = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def timed(fn, dtype: torch.dtype, lq: int, lk: int, reps: int = 5) -> tuple[float, float]:
    """Best forward and backward milliseconds over ``reps - 1`` calls after a warm-up."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 9, n, 64, generator=gen).to(dtype).requires_grad_()
               for n in (lq, lk, lk))
    grad = torch.randn(1, 9, lq, 64, generator=gen).to(dtype)
    fw, bw = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn(q, k, v)
        t1 = time.perf_counter()
        out.backward(grad)
        fw.append(t1 - t0)
        bw.append(time.perf_counter() - t1)
    return min(fw[1:]) * 1e3, min(bw[1:]) * 1e3


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for lq, lk in [(700, 700), (350, 350), (200, 900), (100, 800)]:
        for dtype in (torch.bfloat16, torch.float32):
            for fn in (flash, manual):
                f, b = timed(fn, dtype, lq, lk)
                print(f"{lq:4d} x {lk:4d}  {str(dtype)[6:]:8s} {fn.__name__:6s} "
                      f"forward {f:6.1f} ms  backward {b:6.1f} ms")


if __name__ == "__main__":
    main()
