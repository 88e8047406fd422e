"""`python -m atlas.bench agent`: research-agent generation throughput, side by side.

Rows (same run, same prompt, same device, whose name and torch/CUDA versions are printed
first): a naive fp32 batch-1 baseline (plain HF ``generate``), HF ``generate`` in each
precision, the agent's sampler (``ResearchAgent.generate``) at batch 1, 8 and 16 (batch =
samples of one prompt), the sampler's decode step against the floor (``atlas.bench.floor``:
kernel time on CUDA, aten self time on the CPU), and on the CPU a reference row: llama.cpp on
the same GGUF at batch 1 with the same threads. Only real generated tokens count (a row's
tokens up to and including its EOS; padding never). ``--model`` is a ``conf/model`` option
(``llama3_1b_shape``: Llama-3.2-1B's shape with random weights, speed only) or a local
folder. ``--valid`` adds the valid-program study: which temperature / top_p / prefill make
SmolLM2 write Python that parses.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from atlas.agent.precision import choose_precision
from atlas.bench.floor import profile_busy, ratio_text
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)
from atlas.types import parse_program

SYSTEM = "You are a research agent in online learning and contextual bandits."
USER = ("Write policy(contexts, history, t, state) for a 5-armed linear bandit whose hidden theta "
        "drifts over 2000 steps. contexts: numpy array (5, 5), one unit vector per arm. history: "
        "list of (arm, x, reward). state: dict kept between calls. Return an int arm in [0, 5). "
        "Reply with code only.")
HEADER = "def policy(contexts, history, t, state):"
PREFILLS = {  # name -> prefill after the assistant header
    "fence+def": f"```python\n{HEADER}\n",
    "fence+def+indent": f"```python\n{HEADER}\n    ",
    "fence+import+def+indent": f"```python\nimport numpy as np\n\n{HEADER}\n    ",
}


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench agent", description=__doc__)
    add_model_args(p)
    p.add_argument("--batches", default="1,8,16", help="sampler batch sizes (samples per prompt)")
    p.add_argument("--hf-batches", default="8", help="HF generate batch sizes ('' = none)")
    p.add_argument("--dtypes", default="auto",
                   help="precisions measured side by side; auto: float32,bfloat16 on the CPU, "
                        "what model.dtype=auto picks on CUDA")
    p.add_argument("--floor-tokens", type=int, default=16,
                   help="decode steps profiled for the floor, at the largest batch (0 = skip)")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp reference row")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--baseline-tokens", type=int, default=32,
                   help="tokens for the (slow) naive fp32 batch-1 baseline (0 = skip)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--ablate", action="store_true", help="also run the sampler without packing")
    p.add_argument("--step-attention", default="",
                   help="also time the graph step with these attention kinds (grouped, layer: "
                        "graph_step.STEP_ATTENTION), rows named after them; '' = the default")
    p.add_argument("--no-sandbox", action="store_true", help="skip the bandit candidates/s row")
    p.add_argument("--valid", action="store_true", help="run the valid-program study")
    p.add_argument("--valid-samples", type=int, default=8)
    p.add_argument("--valid-tokens", type=int, default=192)
    p.add_argument("--skip-speed", action="store_true", help="skip the tokens/s rows")
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(list(argv))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def real_tokens(new_ids: torch.Tensor, eos_ids: Sequence[int]) -> int:
    """Generated tokens that are not padding: each row up to and including its first EOS."""
    total = 0
    for row in new_ids.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        total += n
    return total


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_generate(model, tokenizer, prompt: str, batch: int, max_new_tokens: int,
                temperature: float, top_p: float, seed: int) -> dict[str, float]:
    """Plain ``model.generate`` on ``batch`` copies of ``prompt``: the baseline path."""
    device = str(model.device)
    enc = tokenizer([prompt] * batch, return_tensors="pt", padding=True,
                    add_special_tokens=False).to(device)
    eos = [tokenizer.eos_token_id]
    torch.manual_seed(seed)
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                         max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    _sync(device)
    seconds = time.perf_counter() - t0
    n = real_tokens(out[:, enc["input_ids"].shape[1]:], eos)
    return {"tokens": n, "seconds": seconds, "tokens_per_s": n / seconds}


def sampler_row(agent, prompt: str, batch: int, args: argparse.Namespace,
                pack: bool = True) -> dict[str, float]:
    """The agent's sampler (policy adapter) on one prompt, ``batch`` samples, through
    ``ResearchAgent.generate`` (``pack=False``: the unpacked ablation, through ``sample``)."""
    if pack:
        agent.generate([prompt], batch, temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=args.max_new_tokens, seed=args.seed)
        st = agent.last_stats
    else:
        # deferred: loads transformers; only this row samples
        from atlas.agent.sampling import sample

        with torch.inference_mode():
            _, st = sample(agent.model, agent.tokenizer, [prompt], batch,
                           temperature=args.temperature, top_p=args.top_p,
                           max_new_tokens=args.max_new_tokens, seed=args.seed, pack=pack)
    return {"tokens": st.new_tokens, "seconds": st.seconds, "tokens_per_s": st.tokens_per_second,
            "prefill_s": st.prefill_seconds, "decode_s": st.decode_seconds, "steps": st.steps,
            "packed": st.packed, "decode_path": st.path, "fallback": st.fallback,
            "setup_s": st.setup_seconds, "step_attention": st.step_attention}


def decode_floor(agent, prompt: str, batch: int, tokens: int, args: argparse.Namespace
                 ) -> dict[str, Any]:
    """Busy time per decode step of the sampler at ``batch``: two profiled calls, one that
    only prefills (1 token) and one of ``tokens`` steps; their difference over the extra steps
    is the decode steps' floor, compared with the unprofiled step time."""

    def run(n: int) -> Any:
        agent.generate([prompt], batch, temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=n, seed=args.seed)
        return agent.last_stats

    device = agent.device
    run(tokens)  # warm: allocations, kernels chosen
    one, busy_one = profile_busy(lambda: run(1), device)
    many, busy_many = profile_busy(lambda: run(tokens), device)
    steps = max(1, many.steps - one.steps)
    floor_step = max(0.0, busy_many.seconds - busy_one.seconds) / steps
    timed = run(tokens)
    step = timed.decode_seconds / max(1, timed.steps)
    return {"batch": batch, "steps": timed.steps, "step_s": step, "floor_step_s": floor_step,
            "ratio": step / floor_step if floor_step > 0 else float("nan"),
            "floor_kind": busy_many.kind,
            "floor_tokens_per_s": batch / floor_step if floor_step > 0 else float("nan"),
            "top_kernels": [{"name": k[:120], "seconds": s} for k, s in busy_many.top]}


def sandbox_row(samples: int = 8) -> dict[str, float] | str:
    """Bandit candidates evaluated per second (the seed program, 2 workers), or why skipped."""
    try:
        # imported here: a sandbox that cannot import is a skipped row (the except below),
        # not a failed bench
        from atlas.sandbox import Confinement, Resources, Sandbox
        from atlas.tasks import make_task
    except ImportError as err:
        return f"skipped: {err}"
    try:
        task = make_task("bandit")
        code = task.seed_program()
        # timed: the same program runs again on purpose (a Sandbox scores a program once)
        with_sb = Sandbox.for_task(task, resources=Resources(workers=2),
                                   confinement=Confinement(score_once=False))
        try:
            context = task.context(0)
            with_sb.evaluate(code, context)  # warm the workers
            t0 = time.perf_counter()
            evals = with_sb.evaluate_many([code] * samples, context)
            seconds = time.perf_counter() - t0
        finally:
            with_sb.close()
    except Exception as err:  # noqa: BLE001 - a bench row must not kill the bench
        return f"skipped: {type(err).__name__}: {err}"
    passed = sum(e.passed for e in evals)
    return {"candidates": samples, "passed": passed, "seconds": seconds,
            "candidates_per_s": samples / seconds}


def is_valid_program(prefill: str, completion: str) -> bool:
    """Parses as Python and defines ``policy`` with a ``return`` (prefill's code + completion)."""
    code = prefill.split("```python\n", 1)[-1] + completion
    code = code.split("```", 1)[0]
    try:
        tree = parse_program(code)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "policy":
            return any(isinstance(n, ast.Return) for n in ast.walk(node))
    return False


def _study_prompts() -> list[tuple[str, str, str, str]]:
    """(name, system, user, prefill): the hand-written prompt, and the loop's own prompt builder."""
    out = [(f"hand:{name}", SYSTEM, USER, prefill) for name, prefill in PREFILLS.items()]
    try:
        # deferred: loads the schema (pydantic, omegaconf); only the prompt study reads it
        from atlas.evolution.prompts import build_prompt
        from atlas.tasks import make_task
    except ImportError:
        return out
    system, user, prefill = build_prompt(make_task("bandit").prompt_spec(), [])
    out += [("builder", system, user, prefill), ("builder+indent", system, user, prefill + "    ")]
    return out


def valid_study(agent, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Valid-program rate: every prompt at T=0.7/top_p=0.95, then a T x top_p grid on builders."""
    rows = []
    for name, system, user, prefill in _study_prompts():
        grid = [(0.7, 0.95)]
        if name.startswith("builder"):
            grid = [(t, p) for t in (0.4, 0.7, 1.0) for p in (0.9, 1.0)]
        prompt = agent.chat_prompt(system, user, prefill)
        for temperature, top_p in grid:
            texts = agent.generate([prompt], args.valid_samples, temperature=temperature,
                                   top_p=top_p, max_new_tokens=args.valid_tokens,
                                   stop=["\n```"], seed=args.seed)[0]
            ok = sum(is_valid_program(prefill, t) for t in texts)
            rows.append({"prompt": name, "temperature": temperature, "top_p": top_p,
                         "valid": ok, "samples": len(texts)})
            print(f"  {name:30s} T={temperature:<4} top_p={top_p:<5} valid {ok}/{len(texts)}",
                  flush=True)
    return rows


def llama_cpp_row(prompt: str, tokens: int, threads: int, args: argparse.Namespace
                  ) -> dict[str, float] | str:
    """A tuned CPU inference engine on the same GGUF: llama.cpp (llama-cpp-python), batch 1,
    the same prompt and number of new tokens, the same cores. Or why it was skipped."""
    try:
        from llama_cpp import Llama

        # deferred: loads transformers; --help and the other rows stay light
        from atlas.agent.model import smollm2_gguf_path
    except ImportError as err:
        return f"skipped: {err} (pip install 'llama-cpp-python[server]')"
    llm = Llama(model_path=str(smollm2_gguf_path()), n_threads=threads, n_threads_batch=threads,
                n_ctx=1024, seed=args.seed, verbose=False)
    llm.create_completion(prompt, max_tokens=4, temperature=args.temperature)  # warm-up
    t0 = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=0)
    seconds = time.perf_counter() - t0
    n = int(out["usage"]["completion_tokens"])
    return {"tokens": n, "seconds": seconds, "tokens_per_s": n / seconds}


def speed_rows(agents: dict[str, Any], cfg: dict[str, Any], prompt: str,
               args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Naive fp32 b1, HF generate, the sampler in each precision and llama.cpp, measured back
    to back in this process; prints the table and the ratios docs/results.md quotes."""
    # deferred: loads transformers and pydantic; --help stays light
    from atlas.agent.model import load_base_model
    from atlas.schema import ModelConfig

    def add(name: str, batch: int, row: dict[str, float]) -> None:
        row = {"path": name, "batch": batch, **row}
        results["rows"].append(row)
        print(f"  {name:34s} batch {batch:3d}: {row['tokens']:5d} tok in {row['seconds']:7.2f}s "
              f"= {row['tokens_per_s']:7.1f} tok/s", flush=True)

    gen = (args.temperature, args.top_p, args.seed)
    device = next(iter(agents.values())).device
    if args.baseline_tokens > 0:
        base32, tok = load_base_model(ModelConfig.from_cfg({**cfg, "dtype": "float32"}), device)
        base32.to(device)
        hf_generate(base32, tok, prompt, 1, 4, *gen)  # warm-up
        add("naive fp32 HF generate", 1, hf_generate(base32, tok, prompt, 1,
                                                     args.baseline_tokens, *gen))
        del base32
    for dtype in agents:
        if not _ints(args.hf_batches):
            break
        base, tok = load_base_model(ModelConfig.from_cfg({**cfg, "dtype": dtype}), device)
        base.to(device)
        for b in _ints(args.hf_batches):
            hf_generate(base, tok, prompt, b, 4, *gen)
            add(f"{dtype} HF generate", b, hf_generate(base, tok, prompt, b,
                                                       args.max_new_tokens, *gen))
        del base
    for dtype, agent in agents.items():
        warm = argparse.Namespace(**{**vars(args), "max_new_tokens": 4})
        t0 = time.perf_counter()
        sampler_row(agent, prompt, 1, warm)  # one-off costs: weight packing, compilation
        results.setdefault("first_call_s", {})[dtype] = first = time.perf_counter() - t0
        print(f"  atlas sampler ({dtype}) first call (4 tokens; one-off packing/compilation "
              f"included): {first:.2f} s", flush=True)
        for b in _ints(args.batches):
            add(f"atlas sampler ({dtype})", b, sampler_row(agent, prompt, b, args))
            if args.ablate:
                add(f"atlas sampler ({dtype}, unpacked)", b,
                    sampler_row(agent, prompt, b, args, False))
        for kind in [k for k in args.step_attention.split(",") if k]:
            # deferred: the graph step's module; only these rows switch its attention
            from atlas.agent import graph_step

            default, graph_step.STEP_ATTENTION = graph_step.STEP_ATTENTION, kind
            try:
                sampler_row(agent, prompt, 1, warm)  # a new step shape: its one-off costs
                for b in _ints(args.batches):
                    add(f"atlas sampler ({dtype}, step attention {kind})", b,
                        sampler_row(agent, prompt, b, args))
            finally:
                graph_step.STEP_ATTENTION = default
    if args.json:  # the rows survive a floor profile that fails
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.floor_tokens > 0 and _ints(args.batches):
        dtype, agent = next(iter(agents.items()))
        batch = max(_ints(args.batches))
        fl = decode_floor(agent, prompt, batch, args.floor_tokens, args)
        results["floor"] = {"dtype": dtype, **fl}

        print(f"  decode step, sampler ({dtype}) batch {batch}: "
              f"{ratio_text(fl['step_s'], fl['floor_step_s'], fl['floor_kind'])}; floor "
              f"{fl['floor_tokens_per_s']:.0f} tok/s", flush=True)
        for k in fl["top_kernels"]:
            print(f"    {k['seconds'] * 1e3:8.2f} ms  {k['name']}", flush=True)
    llama = None
    if args.model == "smollm2" and not args.no_llama_cpp and device == "cpu":
        llama = llama_cpp_row(prompt, args.max_new_tokens, torch.get_num_threads(), args)
        if isinstance(llama, str):
            print(f"  llama.cpp: {llama}")
        else:
            add("llama.cpp (same GGUF)", 1, llama)
    if not results["rows"]:
        return
    naive = results["rows"][0]["tokens_per_s"]
    first = f"x {results['rows'][0]['path']} b{results['rows'][0]['batch']}"
    print(f"\n| path | batch | tokens/s | {first} |\n|---|---:|---:|---:|")
    for row in results["rows"]:
        print(f"| {row['path']} | {row['batch']} | {row['tokens_per_s']:.1f} | "
              f"{row['tokens_per_s'] / naive:.1f}x |")
    by = {(r["path"], r["batch"]): r["tokens_per_s"] for r in results["rows"]}
    for dtype in agents:
        fast = by.get((f"atlas sampler ({dtype})", 8))
        if fast and isinstance(llama, dict):
            ratio = fast / llama["tokens_per_s"]
            results[f"sampler_b8_{dtype}_over_llama_cpp_b1"] = ratio
            print(f"atlas sampler ({dtype}) batch 8 / llama.cpp batch 1: {ratio:.2f}x "
                  f"(target >= 2x)")
    if len(agents) == 2 and all(by.get((f"atlas sampler ({d})", 8)) for d in agents):
        f32, b16 = (by[(f"atlas sampler ({d})", 8)] for d in ("float32", "bfloat16"))
        print(f"atlas sampler batch 8: float32 / bfloat16 = {f32 / b16:.2f}x")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the bench: tokens/s table, the floor, bandit candidates/s, optionally the
    valid-program study; returns what it printed, as numbers."""
    args = _parse(argv or [])
    if args.threads:
        torch.set_num_threads(args.threads)
    # deferred: load transformers, peft and pydantic; --help stays light
    from atlas.agent.research_agent import ResearchAgent
    from atlas.schema import ModelConfig

    device = resolve_bench_device(args.device)
    try:
        cfg = bench_model_cfg(args.model, args.hidden, args.layers)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    info = device_info(device)
    auto = choose_precision(str(cfg.get("dtype") or "auto"), device, cfg.get("cache_dir"))
    print(device_line(info), flush=True)
    print(f"model.dtype={cfg.get('dtype')} picks {auto.dtype} ({auto.reason})", flush=True)
    if args.dtypes == "auto":
        dtypes = ["float32", "bfloat16"] if device == "cpu" else [auto.dtype]
    else:
        dtypes = [d for d in args.dtypes.split(",") if d]
    t0 = time.perf_counter()
    agents = {d: ResearchAgent(ModelConfig.from_cfg({**cfg, "dtype": d}), device=device,
                               seed=args.seed)
              for d in dtypes}
    agent = agents.get(auto.dtype) or next(iter(agents.values()))
    load_s = time.perf_counter() - t0
    prompt = agent.chat_prompt(SYSTEM, USER, PREFILLS["fence+def+indent"])
    label = model_label(args.model, cfg)
    print(f"model={label} load {load_s:.2f}s threads={torch.get_num_threads()} "
          f"prompt_tokens={len(agent.tokenizer(prompt, add_special_tokens=False)['input_ids'])}",
          flush=True)
    results: dict[str, Any] = {"load_s": load_s, "threads": torch.get_num_threads(), "rows": [],
                               "device": info, "model": label,
                               "auto_precision": auto.to_dict()}
    if not args.skip_speed:
        speed_rows(agents, cfg, prompt, args, results)
    if not args.no_sandbox:
        sb = sandbox_row()
        results["sandbox"] = sb
        if isinstance(sb, str):
            print(f"\nbandit candidates/s: {sb}")
        else:
            print(f"\nbandit candidates/s: {sb['candidates_per_s']:.2f} "
                  f"({sb['passed']}/{sb['candidates']} passed, 2 workers, seed program)")
    if args.valid:
        print("\nvalid-program study (parses + defines policy with a return):")
        results["valid"] = valid_study(agent, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return results
