"""`python -m atlas.bench parity`: the DPO loss in bf16 against fp32 on one device.

The gate's thresholds and the DPO settings were tuned in fp32 on a CPU; on CUDA the agent
runs in bf16. This loads the model in each precision on ``--device``, gives the policy adapter
the same seeded weights (a policy that moved away from the reference), and evaluates the DPO
loss, margin and accuracy on recorded preference pairs (``atlas.bench.dpo``'s, phase 2 of the
main command) with the run's default beta and reference (``atlas.dpo.evaluate_pairs``).
Printed: each precision's numbers and the absolute differences.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atlas.bench.dpo import DATA, recorded_pairs
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench parity", description=__doc__)
    add_model_args(p, default="llama3_1b_shape")
    p.add_argument("--programs", default=str(DATA), help="a run's programs.jsonl")
    p.add_argument("--pairs", type=int, default=16)
    p.add_argument("--max-length", type=int, default=768)
    p.add_argument("--scale", type=float, default=0.02,
                   help="std of the seeded policy adapter weights (LoRA starts at the reference)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default="", help="also write the results to this file")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    # deferred: load torch, transformers, peft and lightning; --help stays fast
    from atlas.agent.adapters import POLICY, adapter, adapter_params
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo import DPOConfig, evaluate_pairs
    from atlas.schema import ModelConfig

    device = resolve_bench_device(args.device)
    info = device_info(device)
    print(device_line(info), flush=True)
    pairs = recorded_pairs(Path(args.programs), 2, args.pairs, 4, 0)
    beta = DPOConfig().beta
    rows: dict[str, dict[str, float]] = {}
    for dtype in ("float32", "bfloat16"):
        cfg = bench_model_cfg(args.model, args.hidden or None, args.layers or None, dtype)
        agent = ResearchAgent(ModelConfig.from_cfg(cfg), device=device, seed=0)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _, p in sorted(adapter_params(agent.model, POLICY).items()):
                p.copy_(torch.randn(p.shape, generator=gen) * args.scale)
        with adapter(agent.model, POLICY):
            rows[dtype] = evaluate_pairs(agent.model, agent.tokenizer, pairs, beta, "adaptive",
                                         max_length=args.max_length)
        print(f"  {dtype}: loss {rows[dtype]['loss']:.5f}, margin {rows[dtype]['margin']:+.5f}, "
              f"accuracy {rows[dtype]['accuracy']:.3f} ({len(pairs)} pairs)", flush=True)
        del agent
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    diff = {k: abs(rows["bfloat16"][k] - rows["float32"][k])
            for k in ("loss", "margin", "accuracy")}
    print(f"  |bf16 - fp32|: loss {diff['loss']:.5f}, margin {diff['margin']:.5f}, "
          f"accuracy {diff['accuracy']:.3f}", flush=True)
    result = {"device": info, "model": model_label(args.model, bench_model_cfg(args.model)),
              "beta": beta, "pairs": len(pairs), "rows": rows, "difference": diff}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
