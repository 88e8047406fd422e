"""What the lookup decode path stands on, measured four ways (docs/results.md, "Decoding by
prompt lookup" and "The main command on AVX2 in fp32: the arithmetic floor"):

    python scripts/lookup_weigh.py replay <run dir> [--guess 4,8,12,16]
    python scripts/lookup_weigh.py [--dtype float32] cost [--rows 1,4] [--width 1,5,9,13,17]
    python scripts/lookup_weigh.py gqa [--repeats 2]
    python scripts/lookup_weigh.py [--dtype float32] drafts [--guess 12,6,4,2] [--repeats 2]

``replay``: a run's agent completions replayed against ``atlas.agent.lookup.Drafts`` (the
recorded tokens, guesses from the recorded prompts): tokens a pass would yield, and, with a
round's rows in one batch (each pass as wide as its longest guess), the positions the passes
run; no model run.
``cost``: SmolLM2 (bf16 where native) forward of ``width`` tokens per row over an
800-token cache, merged and packed as the sampler runs it: what a pass costs against a
one-token step (its cache is a ``DynamicCache``, which copies the 800 tokens on every pass,
where the sampler writes into buffers: its figures compare machines and days, not pass
widths). ``gqa``: one round's shape on the lookup path with transformers' grouped-query
switch off and on, alternating: seconds, and whether the completions agree. ``drafts``: one
round's shape at each guess length (``atlas.agent.lookup.DRAFT_TOKENS``), alternating.
Timings belong to one machine: run them with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DTYPE = "auto"  # --dtype: the model's dtype (auto: what a run on this machine picks)


def _agent():
    import torch

    from atlas.agent.research_agent import ResearchAgent
    from atlas.bench.machine import bench_model_cfg
    from atlas.schema import ModelConfig

    torch.set_num_threads(2)
    return ResearchAgent(ModelConfig.from_cfg(bench_model_cfg("smollm2", dtype=DTYPE)),
                         device="cpu", seed=0)


def replay(run: Path, guesses: list[int]) -> None:
    from atlas.agent.lookup import Drafts

    tok = _agent().tokenizer
    rows = [json.loads(line) for line in (run / "programs.jsonl").read_text().splitlines()]
    rounds: dict[int, list] = {}
    for r in rows:
        if r["source"] != "agent":
            continue
        prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        comp = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rounds.setdefault(r["round"], []).append((prompt, comp[:320]))
    n = sum(len(b) for b in rounds.values())
    for k in guesses:
        tokens = passes = batch_passes = positions = 0
        for batch in rounds.values():  # a round's rows decode as one batch, in lockstep
            state = [[Drafts(prompt), 0, comp] for prompt, comp in batch]
            while live := [s for s in state if s[1] < len(s[2])]:
                gs = [s[0].guess(k) for s in live]
                batch_passes += 1
                positions += len(live) * (1 + max(len(g) for g in gs))
                for s, g in zip(live, gs):
                    d, t, comp = s
                    m = 0
                    while m < len(g) and t + m < len(comp) and g[m] == comp[t + m]:
                        m += 1
                    kept = comp[t:t + m + 1]
                    d.extend(kept)
                    s[1], passes = t + len(kept), passes + 1
            tokens += sum(len(comp) for _, comp in batch)
        print(f"guesses of {k:2d}: {tokens} tokens in {passes} passes, "
              f"{tokens / passes:.2f} tokens a pass ({n} completions); a round's rows in one "
              f"batch: {batch_passes} passes running {positions} positions", flush=True)


def cost(rows: list[int], widths: list[int]) -> None:
    import torch
    from transformers import DynamicCache

    from atlas.agent.fastlinear import merged_lora, packed_linears

    agent = _agent()
    m = agent.model
    with torch.inference_mode(), packed_linears(m, enabled=True), merged_lora(m, enabled=True):
        for n in rows:
            cache = DynamicCache()
            m(input_ids=torch.randint(100, 1000, (n, 800)), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
            for w in widths:
                x = torch.randint(100, 1000, (n, w))

                pos = torch.arange(800, 800 + w)[None].expand(n, -1)
                for i in range(9):  # one warm-up pass, then 8 timed
                    if i == 1:
                        t = time.perf_counter()
                    for layer in cache.layers:  # back to the 800-token cache
                        layer.keys, layer.values = layer.keys[:, :, :800], layer.values[:, :, :800]
                    m(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True)
                ms = (time.perf_counter() - t) / 8 * 1000
                print(f"rows {n} width {w:2d}: {ms:6.1f} ms a pass", flush=True)


def _round():
    """The agent with the sampler bench's trained-looking adapter, and one round's requests
    (2 islands x 4 samples)."""
    import torch

    from atlas.agent.adapters import POLICY, adapter_params
    from atlas.bench.sampler import _requests

    agent = _agent()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter_params(agent.model, POLICY).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return agent, _requests(agent, 2, 4, 0)


def gqa(repeats: int) -> None:
    import atlas.agent.steps as steps
    from atlas.agent.sampling import sample_requests
    from atlas.agent.steps import _GQA_SWITCH, _grouped_query_sdpa
    from atlas.evolution.explorer import STOP

    agent, requests = _round()
    outs = {}
    for _ in range(repeats):
        for on in (False, True):
            steps._grouped_query_sdpa = (_grouped_query_sdpa if on else
                                         lambda enabled: _grouped_query_sdpa(False))
            out, st = sample_requests(agent.model, agent.tokenizer, requests, top_p=0.95,
                                      max_new_tokens=320, stop=STOP, path="lookup")
            outs[on] = out
            print(f"grouped-query switch {'on ' if on else 'off'}: {st.new_tokens} tokens in "
                  f"{st.seconds:.2f} s", flush=True)
    steps._grouped_query_sdpa = _grouped_query_sdpa
    assert _GQA_SWITCH not in os.environ
    print("the same completions:", outs[False] == outs[True])


def drafts(lengths: list[int], repeats: int) -> None:
    """One round's shape on the lookup path at each guess length, alternating."""
    import atlas.agent.sampling as sampling
    from atlas.agent.sampling import sample_requests
    from atlas.evolution.explorer import STOP

    agent, requests = _round()
    default, first = sampling.DRAFT_TOKENS, None
    try:
        for _ in range(repeats):
            for k in lengths:
                sampling.DRAFT_TOKENS = k
                out, st = sample_requests(agent.model, agent.tokenizer, requests, top_p=0.95,
                                          max_new_tokens=320, stop=STOP, path="lookup")
                first = out if first is None else first
                print(f"guesses of {k:2d}: {st.new_tokens} tokens in {st.steps} passes, "
                      f"{st.seconds:.2f} s ({st.decode_seconds:.2f} s decoding), "
                      f"{st.accepted} of {st.drafted} guessed tokens kept, "
                      f"completions as the first run's: {out == first}", flush=True)
    finally:
        sampling.DRAFT_TOKENS = default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32")
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("replay")
    r.add_argument("run", type=Path)
    r.add_argument("--guess", default="4,8,12,16")
    c = sub.add_parser("cost")
    c.add_argument("--rows", default="1,4")
    c.add_argument("--width", default="1,5,9,13,17")
    g = sub.add_parser("gqa")
    g.add_argument("--repeats", type=int, default=2)
    d = sub.add_parser("drafts")
    d.add_argument("--guess", default="12,6,4,2")
    d.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    global DTYPE
    DTYPE = args.dtype
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    if args.what == "replay":
        replay(args.run, ints(args.guess))
    elif args.what == "cost":
        cost(ints(args.rows), ints(args.width))
    elif args.what == "gqa":
        gqa(args.repeats)
    else:
        drafts(ints(args.guess), args.repeats)


if __name__ == "__main__":
    main()
