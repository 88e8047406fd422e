"""Where one DPO phase's CPU time goes, and whether another attention kernel shortens it.

    python scripts/profile_dpo_phase.py <run>/programs.jsonl 2 --attention sdpa,eager

Rebuilds phase ``PHASE``'s D_k from a run's ``programs.jsonl`` as ``atlas.bench dpo`` does
(the agent's own pairs), trains it on SmolLM2 in ``--dtype`` (bf16 unless told) on the shared-prompt path
once per attention kernel (twice each, alternating, every time from the same adapter
state, so the losses compare), then profiles one more phase with the first kernel and prints
the ops that took the most self CPU time. ``math`` runs transformers' SDPA restricted to
PyTorch's math backend. Numbers belong to one machine: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", type=Path)
    ap.add_argument("phase", type=int)
    ap.add_argument("--attention", default="sdpa,eager",
                    help="comma-separated: sdpa | eager | math")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", type=int, default=25, help="profiler rows to print (0: none)")
    args = ap.parse_args()

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from atlas.agent.research_agent import ResearchAgent
    from atlas.bench.dpo import SETTINGS, recorded_pairs
    from atlas.bench.machine import bench_model_cfg
    from atlas.dpo import DPOConfig, train_phase
    from atlas.schema import ModelConfig

    torch.set_num_threads(args.threads)
    agent = ResearchAgent(ModelConfig.from_cfg(bench_model_cfg("smollm2", dtype=args.dtype)),
                          device="cpu", seed=0)
    base = agent.model.get_base_model()
    pairs = recorded_pairs(args.programs, args.phase, 24, 4, 0)
    cfg = DPOConfig(batch_size=2, max_length=2048, checkpoints=0, **SETTINGS["shared"])
    start = {k: v.clone() for k, v in agent.model.state_dict().items() if "lora" in k}
    print(f"phase {args.phase}: {len(pairs)} pairs on {len({p.prompt for p in pairs})} prompts")

    def phase(kind: str):
        base.set_attn_implementation("sdpa" if kind == "math" else kind)
        ctx = sdpa_kernel([SDPBackend.MATH]) if kind == "math" else contextlib.nullcontext()
        agent.model.load_state_dict(start, strict=False)
        with ctx:
            return train_phase(agent.model, agent.tokenizer, pairs, cfg, "adaptive", seed=0)

    kinds = args.attention.split(",")
    for _ in range(args.repeats):
        for kind in kinds:
            t = time.perf_counter()
            r = phase(kind)
            print(f"{kind:6s} phase {time.perf_counter() - t:6.2f} s  reference table "
                  f"{r.metrics['reference_table_seconds']:5.2f} s  tokens {r.metrics['tokens']:.0f}"
                  f"  losses {[round(h['loss'], 4) for h in r.history]}", flush=True)
    if args.rows:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            phase(kinds[0])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
