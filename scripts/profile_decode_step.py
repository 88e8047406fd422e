"""Where a CPU decode step's time goes, and what its linear layers cost apart from it.

    python scripts/profile_decode_step.py --rows 4 --tokens 64

1. One island's rows decoded on the compact path (SmolLM2 in ``--dtype``, the bandit's seed
   prompt, as ``atlas.bench sampler`` builds it), once to warm up, then once under the torch
   profiler: the ops that took the most self CPU time.
2. SmolLM2's linear shapes at ``--rows`` rows, each weight multiplied many times over (so it
   stays in cache, unlike a decode step that streams every weight from memory): plain
   ``F.linear``, oneDNN-packed (what the compact path runs) and int8 weight-only
   (``aten._weight_int8pack_mm``, per-output-channel scales), summed to one step's worth
   (30 layers' q, k, v, o, gate, up, down and the LM head).

Numbers belong to one machine: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import time
from functools import partial


def _median_ms(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2] * 1e3


def linears(rows: int, dtype) -> None:
    """Part 2: the layer shapes' in-cache cost per decode step, three ways."""
    import torch
    import torch.nn.functional as F

    per_step = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30,
                (49152, 576): 1}  # (out, in): calls per step
    total = {"plain": 0.0, "packed": 0.0, "int8": 0.0}
    gen = torch.Generator().manual_seed(0)
    for (n, k), calls in per_step.items():
        w = torch.randn(n, k, generator=gen) * 0.02
        x = torch.randn(rows, k, generator=gen).to(dtype)
        wd = w.to(dtype)
        scales = w.abs().amax(1) / 127
        wq = torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8)
        ms = {"plain": _median_ms(partial(F.linear, x, wd)),
              "int8": _median_ms(partial(torch.ops.aten._weight_int8pack_mm, x, wq,
                                         scales.to(dtype)))}
        if dtype == torch.bfloat16:
            packed = torch.ops.mkldnn._reorder_linear_weight(wd, rows)
            ms["packed"] = _median_ms(partial(torch.ops.mkldnn._linear_pointwise, x, packed,
                                              None, "none", [], ""))
        else:
            ms["packed"] = ms["plain"]  # the compact path packs bf16 weights only
        for key in total:
            total[key] += ms[key] * calls
        print(f"  {n:5d} x {k:4d}  " + "  ".join(f"{key} {ms[key]:.3f} ms" for key in total))
    print("  a step's linear layers, in cache: "
          + ", ".join(f"{key} {v:.1f} ms" for key, v in total.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=20, help="profiler rows to print")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from atlas.agent.research_agent import ResearchAgent
    from atlas.agent.sampling import sample_requests
    from atlas.bench.machine import bench_model_cfg
    from atlas.bench.sampler import _requests
    from atlas.evolution.explorer import STOP
    from atlas.schema import ModelConfig

    torch.set_num_threads(args.threads)
    agent = ResearchAgent(ModelConfig.from_cfg(bench_model_cfg("smollm2", dtype=args.dtype)),
                          device="cpu", seed=0)
    requests = _requests(agent, 1, args.rows, 0)
    kw = {"top_p": 0.95, "max_new_tokens": args.tokens, "stop": STOP}
    sample_requests(agent.model, agent.tokenizer, requests, pack=True, **kw)
    _, stats = sample_requests(agent.model, agent.tokenizer, requests, pack=True, **kw)
    print(f"{agent.precision.dtype}, {args.rows} rows, {args.threads} threads: "
          f"{stats.decode_seconds / stats.steps * 1e3:.1f} ms a decode step "
          f"({stats.steps} steps, {stats.new_tokens} tokens)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sample_requests(agent.model, agent.tokenizer, requests, pack=True, **kw)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    print(f"SmolLM2's linear shapes at {args.rows} rows ({agent.precision.dtype}):")
    linears(args.rows, getattr(torch, str(agent.precision.dtype)))


if __name__ == "__main__":
    main()
