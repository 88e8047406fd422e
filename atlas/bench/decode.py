"""`python -m atlas.bench decode`: do the decode paths sample the same tokens?

One round's shape (``--islands`` x ``--samples``, each island with its own temperature, one
greedy island), one uniform table for all paths, decoded by the ``compact`` loop and by the
``graph`` step (a CUDA graph on CUDA, and the same step run eagerly there too). Printed per
pair of paths: the share of rows (completions) that are identical and the share of character
positions that agree (a row that differs once usually differs from then on). On the tiny fp32 model the
paths agree exactly (the tests assert it); in bf16 a near-tie can go either way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from atlas.agent import graph_step
from atlas.bench.agent import PREFILLS, SYSTEM, USER
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench decode", description=__doc__)
    add_model_args(p)
    p.add_argument("--islands", type=int, default=3)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--json", default="", help="also write the results to this file")
    return p.parse_args(list(argv))


def agreement(a: Sequence[Sequence], b: Sequence[Sequence]) -> dict[str, float]:
    """Identical rows and agreeing positions (over the longer row of each pair)."""
    same = sum(x == y for x, y in zip(a, b))
    pos = sum(max(len(x), len(y)) for x, y in zip(a, b))
    eq = sum(sum(u == v for u, v in zip(x, y)) for x, y in zip(a, b))
    return {"rows_identical": same / len(a), "positions_agree": eq / pos if pos else 1.0}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    # deferred: loads transformers, peft and pydantic; --help stays light
    from atlas.agent.research_agent import ResearchAgent
    from atlas.agent.sampling import Request, sample_requests
    from atlas.schema import ModelConfig

    device = resolve_bench_device(args.device)
    cfg = bench_model_cfg(args.model, args.hidden or None, args.layers or None, args.dtype)
    agent = ResearchAgent(ModelConfig.from_cfg(cfg), device=device, seed=0)
    info = device_info(device)
    print(device_line(info), flush=True)
    temps = [0.0, 0.7, 1.0, 0.5, 0.9, 0.3]
    users = [USER, USER + " Keep it short.", USER + " Use a sliding window."]
    requests = [Request(agent.chat_prompt(SYSTEM, users[i % len(users)],
                                          PREFILLS["fence+def+indent"]),
                        args.samples, temps[i % len(temps)], i) for i in range(args.islands)]
    rows = args.islands * args.samples
    uniforms = torch.rand((rows, args.max_new_tokens), generator=torch.Generator().manual_seed(0))
    kw = {"top_p": 0.95, "max_new_tokens": args.max_new_tokens, "uniforms": uniforms}
    texts: dict[str, list[str]] = {}
    paths: dict[str, dict[str, Any]] = {}

    def run(name: str, path: str) -> None:
        out, st = sample_requests(agent.model, agent.tokenizer, requests, path=path, **kw)
        texts[name] = [t for group in out for t in group]
        paths[name] = {"path": st.path, "fallback": st.fallback, "tok_s": st.tokens_per_second,
                       "setup_s": st.setup_seconds}
        print(f"  {name}: ran {st.path}{' (' + st.fallback + ')' if st.fallback else ''}, "
              f"{st.new_tokens} tokens", flush=True)

    run("compact", "compact")
    run("lookup", "lookup")
    run("graph", "graph")
    if device.startswith("cuda"):
        agent.model.__dict__.pop("_atlas_decode_steps", None)  # the captured graph: dropped
        graph_step.CUDA_GRAPH = False  # the same step, eagerly, on the GPU
        try:
            run("graph eager", "graph")
        finally:
            graph_step.CUDA_GRAPH = True
    result: dict[str, Any] = {"device": info, "model": model_label(args.model, cfg),
                              "dtype": agent.precision.dtype, "paths": paths, "agreement": {}}
    names = list(texts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ag = agreement(texts[a], texts[b])
            result["agreement"][f"{a} vs {b}"] = ag
            print(f"  {a} vs {b}: rows identical {ag['rows_identical']:.0%}, character positions "
                  f"agreeing {ag['positions_agree']:.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
