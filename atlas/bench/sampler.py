"""`python -m atlas.bench sampler`: one exploration round's decode, ways side by side.

A round of the CPU experiment serves 2 islands x 4 samples (``--islands``, ``--samples``)
from the bandit's seed prompt at each island's temperature. Rows, measured in one run on one
machine (printed first) with the same prompts and seeds:

- ``islands one by one, peft layers``: one token a step (the ``compact`` path), LoRA through
  peft;
- ``islands one by one, merged copy``: the same, LoRA folded into a weight copy
  (``merged_lora``);
- ``islands in one batch, merged copy``: the islands as one batch (``explore.batch_islands``),
  the ``compact`` path (finished rows leave the batch);
- ``islands in one batch, lookup``: the run's default on the CPU, the ``lookup`` path
  (prompt-lookup guesses verified in one pass; ``atlas.agent.lookup``);
- ``islands in one batch, graph step``: the ``graph`` decode path (``atlas.agent.graph_step``:
  fixed batch shape, the host looks every 8 steps), the default on CUDA (a CUDA graph there);
- ``islands in one batch, in-place merge``: peft's ``merge_adapter`` before decoding and
  ``unmerge_adapter`` after, the alternative to a copy; its merge/unmerge seconds and the
  largest change it leaves in the base weights are printed.

Each row gives decode seconds (the best of ``--repeats``), generated tokens/s and the ratio to
the first row. Only real tokens count (EOS included, padding never).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch

from atlas.agent.fastlinear import _is_lora_linear, _merged_weight, drop_packed
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)
from atlas.tasks import make_task
from atlas.types import Evaluation, Program


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench sampler", description=__doc__)
    add_model_args(p)
    p.add_argument("--islands", type=int, default=2, help="islands served per round")
    p.add_argument("--samples", type=int, default=4, help="samples per island")
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--repeats", type=int, default=2, help="runs per row; the fastest counts")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(list(argv))


def _requests(agent: Any, islands: int, samples: int, seed: int) -> list:
    # deferred: load transformers, pydantic and omegaconf; --help stays fast
    from atlas.agent.sampling import Request
    from atlas.evolution.prompts import build_prompt

    task = make_task("bandit")
    seed_prog = Program(id=0, island=0, round=0, code=task.seed_program(),
                        evaluation=Evaluation(score=-0.38, passed=True))
    temps = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    out = []
    for i in range(islands):
        system, user, prefill = build_prompt(task.prompt_spec(), [seed_prog],
                                             "try a sliding window" if i % 2 else None)
        out.append(Request(agent.chat_prompt(system, user, prefill), samples,
                           temps[i % len(temps)], seed * 1009 + i))
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    # deferred: load transformers, peft, pydantic and omegaconf; --help stays fast
    from atlas.agent.adapters import POLICY, adapter_params
    from atlas.agent.research_agent import ResearchAgent
    from atlas.agent.sampling import sample_requests
    from atlas.evolution.explorer import STOP
    from atlas.schema import ModelConfig

    device = resolve_bench_device(args.device)
    cfg = bench_model_cfg(args.model, args.hidden or None, args.layers or None, args.dtype)
    agent = ResearchAgent(ModelConfig.from_cfg(cfg), device=device, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # a trained-looking policy adapter
    with torch.no_grad():
        for p in adapter_params(agent.model, POLICY).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model, tok = agent.model, agent.tokenizer
    requests = _requests(agent, args.islands, args.samples, args.seed)
    kw = {"top_p": 0.95, "max_new_tokens": args.max_new_tokens, "stop": STOP}
    info = device_info(device)
    print(device_line(info))
    print(f"model: {model_label(args.model, cfg)} ({agent.precision.dtype}), round: {args.islands} islands x "
          f"{args.samples} samples x <= {args.max_new_tokens} tokens")

    def one_by_one(merge: bool) -> tuple[int, float]:
        tokens = seconds = 0.0
        for r in requests:
            _, st = sample_requests(model, tok, [r], pack=merge, path="compact", **kw)
            tokens, seconds = tokens + st.new_tokens, seconds + st.seconds
        return int(tokens), seconds

    def batched(pack: bool, path: str = "compact") -> tuple[int, float]:
        _, st = sample_requests(model, tok, requests, pack=pack, path=path, **kw)
        return st.new_tokens, st.seconds

    inplace: dict[str, float] = {}

    def base_weights() -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters()
                if "base_layer.weight" in n}

    def drift(before: dict[str, torch.Tensor]) -> float:
        return max(float((p.detach().float() - before[n].float()).abs().max())
                   for n, p in model.named_parameters() if n in before)

    def batched_inplace() -> tuple[int, float]:
        before = base_weights()
        t0 = time.perf_counter()
        model.merge_adapter()
        merge_s = time.perf_counter() - t0
        try:
            result = batched(pack=False)
        finally:
            t0 = time.perf_counter()
            model.unmerge_adapter()
            inplace["merge_unmerge_s"] = merge_s + time.perf_counter() - t0
        inplace["drift"] = drift(before)
        return result

    rows = [("islands one by one, peft layers", lambda: one_by_one(False)),
            ("islands one by one, merged copy", lambda: one_by_one(True)),
            ("islands in one batch, merged copy", lambda: batched(True)),
            ("islands in one batch, lookup", lambda: batched(True, "lookup")),
            ("islands in one batch, graph step", lambda: batched(True, "graph")),
            ("islands in one batch, in-place merge", batched_inplace)]
    out: dict[str, Any] = {"machine": device_line(info), "rows": {}}
    first = None
    torch.manual_seed(args.seed)
    untouched = base_weights()
    for name, run in rows:
        best = None
        for _ in range(max(1, args.repeats)):
            tokens, seconds = run()
            best = (tokens, seconds) if best is None or seconds < best[1] else best
        tokens, seconds = best
        first = first or seconds
        if name == "islands in one batch, merged copy":
            out["copy_drift"] = drift(untouched)  # the default path: must stay 0 in any dtype
        out["rows"][name] = {"tokens": tokens, "seconds": seconds,
                             "tok_s": tokens / seconds, "speedup": first / seconds}
        print(f"  {name:<40} {seconds:8.2f} s  {tokens:5d} tok  {tokens / seconds:8.1f} "
              f"tok/s  x{first / seconds:.2f}")
    drop_packed(model)
    t0 = time.perf_counter()
    with torch.no_grad():
        for m in model.modules():
            if _is_lora_linear(m):
                _merged_weight(m, (POLICY,), pack=False)
    out["copy_build_s"] = time.perf_counter() - t0
    out["inplace"] = inplace
    print(f"  merged copy: built in {out['copy_build_s']:.3f} s a phase; in-place merge + "
          f"unmerge: {inplace['merge_unmerge_s']:.3f} s a phase, largest change it leaves in a "
          f"base weight: {inplace['drift']:.3g} (merged copy: {out['copy_drift']:.3g})")
    return out


if __name__ == "__main__":
    main()
