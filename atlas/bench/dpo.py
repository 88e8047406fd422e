"""``python -m atlas.bench dpo``: one DPO phase on preference pairs recorded in a real run,
the per-row path against the shared-prompt path, side by side in one run.

Pairs: D_k rebuilt exactly as the loop builds it (``build_pairs``, the run's settings) from a
real run's ``programs.jsonl`` (default: phase 1 of the README's main command, seed 0, under
the novelty rules (copies are never chosen), shipped in ``atlas/bench/data``; ``--programs``
takes any run's file), so prompts are shared only as often as a real phase shares them.

Settings (each in a fresh child process, since peak resident memory is per process; on
SDPA attention unless named otherwise):
- ``per-row``: what a phase did before: every (prompt, completion) row in full, the
  reference forward repeated every step, transformers' activation checkpointing on;
- ``shared``: each prompt once per step, the reference once per phase, recomputation only
  when a step's estimate exceeds ``dpo.memory_budget_gb`` (``gradient_checkpointing=auto``),
  each completion one unpadded row after its prompt (``dpo.padded=false``);
- ``padded``: the same, with a prompt's completions in one right-padded batch
  (``dpo.padded=true``);
- ``unshared``: the per-row path as a run gets it with ``dpo.shared_prompt=false`` (one
  padded batch of rows a step, recomputation by ``dpo.gradient_checkpointing=auto``): fewer,
  wider forward calls, the lead where a small model's phase is bound by kernel launches;
- ``eager``: ``shared`` on transformers' eager attention (``dpo.attention=eager``); the
  gate's pass runs on the model's own kernel, as in a phase (``atlas.dpo.attention``);
- ``blocked``: ``shared`` on causal attention in blocks of queries (``dpo.attention=blocked``,
  ``atlas.dpo.blocked_attention``).
A setting that fails (out of device memory, say) is named and left out; the others stand.
The shared and padded settings also time the gate's forward pass (``gate.padded`` false and
true) over the phase's prompts as gate items, with two candidates of C_k and the reference:
what ``dpo.padded`` and ``gate.padded`` default to per device is chosen from these rows.
Printed per setting and precision: phase seconds, seconds per pair, tokens/s, the phase
against the profiler's floor (``atlas.bench.floor``, a second profiled phase), peak RSS (peak
GPU memory on CUDA) and the per-step losses (equal across paths within float32 rounding).
``--model``: a ``conf/model`` option (``llama3_1b_shape``: speed only) or a local folder;
``--device cuda`` runs it on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from atlas.bench.floor import linear_rate, model_dims, profile_busy, ratio_text
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)
from atlas.bench.parts import dpo_parts, gate_part, head_seconds, print_parts
from atlas.types import Program

#: the main command, seed 0 (docs/runs/novelty/bandit_atlas_s0): phase 1 gives 24 pairs on 2
#: prompts, phase 2 gives 3 pairs on 2 prompts
DATA = Path(__file__).with_name("data") / "bandit_main_s0_programs.jsonl"
SETTINGS = {"per-row": {"shared_prompt": False, "gradient_checkpointing": True,
                        "attention": "sdpa"},
            "shared": {"shared_prompt": True, "gradient_checkpointing": "auto", "padded": False,
                       "attention": "sdpa"},
            "padded": {"shared_prompt": True, "gradient_checkpointing": "auto", "padded": True,
                       "attention": "sdpa"},
            "unshared": {"shared_prompt": False, "gradient_checkpointing": "auto",
                         "attention": "sdpa"},
            "eager": {"shared_prompt": True, "gradient_checkpointing": "auto", "padded": False,
                      "attention": "eager"},
            "blocked": {"shared_prompt": True, "gradient_checkpointing": "auto", "padded": False,
                        "attention": "blocked"}}


def recorded_pairs(path: Path, phase: int, max_pairs: int, top_k: int, seed: int) -> list:
    """D_k of ``phase`` rebuilt from a run's ``programs.jsonl`` with the loop's own builder."""
    from omegaconf import OmegaConf

    # deferred: load pydantic and omegaconf; python -m atlas.bench dpo --help stays fast
    from atlas.evolution.database import ProgramDatabase
    from atlas.evolution.preferences import build_pairs
    from atlas.schema import ExploreConfig

    conf = Path(__file__).resolve().parents[2] / "conf" / "explore" / "default.yaml"
    programs = [Program.from_dict(json.loads(line)) for line in path.read_text().splitlines()
                if line.strip()]
    db = ProgramDatabase(ExploreConfig.from_cfg(OmegaConf.load(conf)), seed=seed)
    for p in programs:
        db.add(p)
    mine = [p for p in programs if p.phase == phase and p.source == "agent"]
    if not mine:
        raise SystemExit(f"{path} holds no agent programs of phase {phase}")
    return build_pairs(db, mine, top_k=top_k, max_pairs=max_pairs, score_threshold=None,
                       seed=seed * 1000 + phase)


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    # deferred: load torch, transformers, peft and lightning; --help stays fast
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo import DPOConfig, train_phase
    from atlas.schema import ModelConfig

    torch.set_num_threads(args.threads)
    model_cfg = bench_model_cfg(args.model, args.hidden, args.layers, dtype=args.dtype)
    agent = ResearchAgent(ModelConfig.from_cfg(model_cfg), device=args.device, seed=0)
    pairs = recorded_pairs(Path(args.programs), args.phase, args.pairs, 4, 0)
    cfg = DPOConfig(batch_size=args.batch_size, max_length=args.max_length, checkpoints=0,
                    **SETTINGS[args.setting])

    def gate_seconds() -> float | None:
        """The gate's pass over the phase's prompts (C_k of two and the reference)."""
        if not cfg.shared_prompt:  # the gate's pass has the two shared-prompt forms only
            return None
        # deferred: loads torch and transformers; the parent process never runs it
        from atlas.dpo.scoring import POLICY_NOW, REFERENCE, gate_pass
        from atlas.types import GateItem

        texts: dict[str, list[str]] = {}
        for p in pairs:
            comps = texts.setdefault(p.prompt, [])
            comps += [c for c in (p.chosen, p.rejected) if c not in comps]
        items = [GateItem(prompt, comps, [float(i) for i in range(len(comps))], comps[0])
                 for prompt, comps in texts.items()]
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        gate_pass(agent.model, agent.tokenizer, items, [POLICY_NOW, POLICY_NOW],
                  kl_reference=REFERENCE, max_length=args.max_length, padded=cfg.padded)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def phase() -> Any:
        agent.model.to(agent.device)  # a phase's teardown may leave it elsewhere
        return train_phase(agent.model, agent.tokenizer, pairs, cfg, "adaptive", seed=0)

    cuda = agent.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = phase()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    after = str(next(agent.model.parameters()).device)
    gate_s = gate_seconds()  # on the model's own kernel, as a phase's gate runs
    parts = _parts(args, agent, pairs, cfg, res.metrics, gate_s) if args.parts else None
    floor: dict[str, Any] = {}
    if args.floor:
        t1 = time.perf_counter()
        _, busy = profile_busy(phase, agent.device)
        floor = {"floor_s": busy.seconds, "floor_kind": busy.kind,
                 "profiled_s": time.perf_counter() - t1}
    return {"setting": args.setting, "dtype": args.dtype, "isa": _isa(), "seconds": seconds,
            "pairs": len(pairs), "per_pair_s": seconds / len(pairs),
            "prompts": len({p.prompt for p in pairs}),
            "tokens": res.metrics["tokens"], "tokens_per_s": res.metrics["tokens"] / seconds,
            "recompute": res.metrics["recompute"],
            "step_gb_estimate": res.metrics["step_gb_estimate"],
            "reference_table_s": res.metrics["reference_table_seconds"],
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
            "device_after_phase": after, "gate_pass_s": gate_s, **floor, "parts": parts,
            "losses": [h["loss"] for h in res.history]}


def _parts(args: argparse.Namespace, agent: Any, pairs: list, cfg: Any,
           metrics: dict[str, float], gate_s: float | None) -> dict[str, Any]:
    """The phase's parts against their arithmetic floors (``atlas.bench.parts``), at the
    rate this process measures for the model's shapes and dtype."""
    # deferred: atlas.dpo loads torch, transformers and lightning; --help stays fast
    from atlas.dpo.batching import SharedPromptCollator
    from atlas.dpo.phase import select_pairs
    from atlas.dpo.prefix import encode_group

    dims = model_dims(agent.model.get_base_model().config)
    rate = linear_rate(args.dtype, dims, agent.device)
    chosen = select_pairs(pairs, cfg.max_pairs)
    encoded = [encode_group(agent.tokenizer, p.prompt, [p.chosen, p.rejected], cfg.max_length)
               for p in chosen]
    table = SharedPromptCollator(encoded)(range(len(encoded)))["groups"]
    lengths = [len(c) for g in table for c in g.completions]
    # the forward's LM head and log-probs, timed on the phase's distinct completions and
    # scaled to the completion tokens its steps scored
    head_s = head_seconds(agent.model, lengths) * metrics["scored_tokens"] / sum(lengths)
    parts = dpo_parts(metrics, table, dims, head_s)
    if gate_s is not None:  # the bench's gate: the phase's prompts, two candidates + reference
        parts.append(gate_part(gate_s, table, 3, dims))
    total = metrics["seconds"] + (gate_s or 0.0)
    return {"rate_macs_per_s": rate, "rows": [p.row(rate, total) for p in parts]}


def _isa() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()


#: environment that caps torch's, oneDNN's and MKL's kernels at AVX2 (a CPU without AVX-512)
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run each (precision, path) in a child process; print and return their rows."""

    ap = argparse.ArgumentParser(prog="python -m atlas.bench dpo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip the profiled second phase that measures the floor")
    ap.add_argument("--programs", default=str(DATA), help="a run's programs.jsonl")
    ap.add_argument("--phase", type=int, default=1,
                    help="which phase's D_k to rebuild (shipped run: phase 1 has 24 pairs on "
                         "2 prompts, phase 2 has 3 pairs on 2 prompts)")
    ap.add_argument("--pairs", type=int, default=24, help="cap on |D_k| (dpo.max_pairs)")
    ap.add_argument("--batch-size", type=int, default=2, help="pairs per optimiser step")
    ap.add_argument("--max-length", type=int, default=768, help="tokens per sequence")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--dtypes", default="auto",
                    help="precisions to measure; auto: float32,bfloat16 on the CPU, bfloat16 "
                         "on CUDA")
    ap.add_argument("--settings", default="per-row,shared,padded", help="paths to measure")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--parts", action="store_true",
                    help="print each part of the phase (forward, LM head and log-probs, "
                         "backward, optimiser, reference table, the gate's pass) against its "
                         "arithmetic floor, at the rate measured in the same process")
    ap.add_argument("--avx2", action="store_true",
                    help="also run float32 with the kernels capped at AVX2 (on a CPU with "
                         "AVX-512: what an AVX2-only machine runs)")
    ap.add_argument("--setting", choices=tuple(SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    unknown = [x for x in args.settings.split(",") if x and x not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {', '.join(unknown)}; use "
                         f"{', '.join(SETTINGS)}")
    args.device = resolve_bench_device(args.device)
    if args.setting:  # the child: one setting, one JSON line on stdout
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return []
    try:
        label = model_label(args.model, bench_model_cfg(args.model, args.hidden, args.layers))
    except ValueError as err:
        raise SystemExit(str(err)) from None
    import torch

    torch.set_num_threads(args.threads)
    info = device_info(args.device)
    print(device_line(info), flush=True)
    print(f"model={label}", flush=True)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.dtypes == "auto":
        dtypes = ["float32", "bfloat16"] if args.device == "cpu" else ["bfloat16"]
    rows: list[dict] = []
    failed: list[str] = []
    runs = [(dtype, {}) for dtype in dtypes]
    if args.avx2 and args.device == "cpu":
        runs.append(("float32", AVX2_ENV))
    for dtype, cap in runs:
        for setting in [s for s in args.settings.split(",") if s]:
            cmd = [sys.executable, "-m", "atlas.bench", "dpo", "--setting", setting, "--dtype",
                   dtype, "--model", args.model, "--programs", args.programs, "--phase",
                   str(args.phase), "--pairs", str(args.pairs), "--batch-size",
                   str(args.batch_size), "--max-length", str(args.max_length),
                   "--threads", str(args.threads), "--device", args.device,
                   "--hidden", str(args.hidden), "--layers", str(args.layers)]
            cmd += ([] if args.floor else ["--no-floor"]) + (["--parts"] if args.parts else [])
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, **cap, "OMP_NUM_THREADS": str(args.threads)})
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode != 0 or not line:  # the others still count (a path that runs
                # out of device memory must not take the measured ones with it)
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
                failed.append(f"{dtype} {setting}: {tail}")
                print(f"  {dtype} {setting}: failed ({tail})", file=sys.stderr, flush=True)
                continue
            rows.append(json.loads(line[0][len("RESULT "):]))
            r = rows[-1]
            r["precision"] = dtype + (" (AVX2 cap)" if cap else "")
            print(f"  {dtype} {setting}: {r['seconds']:.1f} s ({r['per_pair_s']:.2f} s/pair, "
                  f"{r['tokens_per_s']:.0f} tok/s; model on {r['device_after_phase']} after the "
                  f"phase)", flush=True)
            if "floor_s" in r:
                print(f"    phase {ratio_text(r['seconds'], r['floor_s'], r['floor_kind'])}",
                      flush=True)
            if r.get("parts"):
                p = r["parts"]
                print_parts(p["rows"], f"{dtype} {setting}, {r['isa']} kernels: arithmetic "
                            f"floor at {2 * p['rate_macs_per_s'] / 1e9:.0f} GFLOP/s (linear "
                            f"layers at the model's shapes, measured in the same process)")
    if not rows:
        sys.exit("every DPO run failed:\n" + "\n".join(failed))
    r0 = rows[0]
    print(f"\nDPO phase: {label}, {r0['pairs']} recorded pairs over {r0['prompts']} prompts "
          f"(phase {args.phase} of {args.programs}), batch {args.batch_size} pairs, "
          f"max_length {args.max_length}")
    mem = "peak GPU GB" if args.device.startswith("cuda") else "peak RSS GB"
    print(f"| precision | path | phase s | s / pair | tokens run | tokens/s | x floor | "
          f"recompute | {mem} | losses per step |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---|")
    for r in rows:
        losses = ", ".join(f"{v:.4f}" for v in r["losses"])
        gb = r["step_gb_estimate"]
        recompute = ("yes" if r["recompute"] else "no") + ("" if math.isnan(gb) else
                                                           f" (step estimate {gb:.1f} GB)")
        ratio = (f"{r['seconds'] / r['floor_s']:.2f}x" if r.get("floor_s") else "n/a")
        peak = r["peak_gpu_gb"] if r.get("peak_gpu_gb") is not None else r["peak_rss_gb"]
        print(f"| {r['precision']} | {r['setting']} | {r['seconds']:.1f} | {r['per_pair_s']:.2f} | "
              f"{r['tokens']:.0f} | {r['tokens_per_s']:.0f} | {ratio} | {recompute} | "
              f"{peak:.2f} | {losses} |")
    by = {(r["precision"], r["setting"]): r for r in rows}
    for dtype in {r["precision"] for r in rows}:
        old, new = by.get((dtype, "per-row")), by.get((dtype, "shared"))
        if old and new:
            worst = max(abs(a - b) for a, b in zip(old["losses"], new["losses"]))
            print(f"{dtype}: shared / per-row time per pair {new['per_pair_s'] / old['per_pair_s']:.2f}x"
                  f" (target <= 0.33x), tokens {new['tokens'] / old['tokens']:.2f}x, peak RSS "
                  f"{new['peak_rss_gb'] / old['peak_rss_gb']:.2f}x, max |loss difference| {worst:.2e}")
        unpadded, pad = by.get((dtype, "shared")), by.get((dtype, "padded"))
        if unpadded and pad:
            worst = max(abs(a - b) for a, b in zip(unpadded["losses"], pad["losses"]))
            print(f"{dtype}: padded / shared time per pair {pad['per_pair_s'] / unpadded['per_pair_s']:.2f}x, "
                  f"gate pass {pad['gate_pass_s']:.1f} s / {unpadded['gate_pass_s']:.1f} s = "
                  f"{pad['gate_pass_s'] / unpadded['gate_pass_s']:.2f}x, max |loss difference| "
                  f"{worst:.2e} (dpo.padded / gate.padded auto: padded on CUDA, rows on the CPU)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if failed:
        print("failed (not in the table): " + "; ".join(failed), flush=True)
    return rows
