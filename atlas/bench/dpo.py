"""``python -m atlas.bench dpo``: wall time and peak memory of one DPO phase, with and
without gradient checkpointing, side by side in one run.

Each setting runs in a fresh child process (peak resident memory is per process), on the
same pairs: a bandit prompt with three earlier versions (~850 tokens, truncated to
``dpo.max_length``) and seed-program completions, trained against the adaptive reference.
Printed per setting: phase seconds, peak RSS (the model's own ~0.55 GB included), the
per-step DPO losses (equal across settings: checkpointing recomputes, it does not change
the maths).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo import DPOConfig, train_phase
    from atlas.evolution.prompts import build_prompt
    from atlas.tasks import make_task
    from atlas.types import Evaluation, PreferencePair, Program

    torch.set_num_threads(args.threads)
    model_cfg = {"source": args.model, "dtype": "bfloat16", "cache_dir": "~/.cache/atlas",
                 "lora_r": 16, "lora_alpha": 32,
                 "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    agent = ResearchAgent(model_cfg, seed=0)
    task = make_task("bandit")
    seed = task.seed_program()
    parents = [Program(id=i, island=0, round=0, code=seed,
                       evaluation=Evaluation(score=-0.3 - i / 10, passed=True)) for i in range(3)]
    system, user, prefill = build_prompt(task.prompt_spec(), parents)
    prompt = agent.chat_prompt(system, user, prefill)
    body = seed.split(":", 1)[1]
    pairs = [PreferencePair(prompt=prompt, chosen=f"{body}\n# v{i}",
                            rejected=body.replace("np.", "numpy.") + f"\n# r{i}",
                            chosen_score=0.0, rejected_score=-1.0) for i in range(args.pairs)]
    cfg = DPOConfig(batch_size=args.batch_size, max_length=args.max_length,
                    gradient_checkpointing=args.checkpointing == "on")
    t0 = time.perf_counter()
    res = train_phase(agent.model, agent.tokenizer, pairs, cfg, "adaptive", seed=0)
    return {"checkpointing": args.checkpointing, "seconds": time.perf_counter() - t0,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "losses": [h["loss"] for h in res.history],
            "prompt_tokens": len(agent.tokenizer(prompt).input_ids)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m atlas.bench dpo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="model source: smollm2 or tiny")
    ap.add_argument("--pairs", type=int, default=8, help="preference pairs in the phase")
    ap.add_argument("--batch-size", type=int, default=2, help="pairs per optimiser step")
    ap.add_argument("--max-length", type=int, default=768, help="tokens per sequence")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--checkpointing", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.checkpointing:  # the child: one setting, one JSON line on stdout
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return
    rows = []
    for setting in ("off", "on"):
        cmd = [sys.executable, "-m", "atlas.bench", "dpo", "--checkpointing", setting,
               "--model", args.model, "--pairs", str(args.pairs), "--batch-size",
               str(args.batch_size), "--max-length", str(args.max_length),
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.exit(f"the '{setting}' run failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[0][len("RESULT "):]))
    print(f"DPO phase: {args.model}, {args.pairs} pairs, batch {args.batch_size} pairs, "
          f"max_length {args.max_length} (prompt {rows[0]['prompt_tokens']} tokens), "
          f"{args.threads} threads")
    print("| dpo.gradient_checkpointing | phase s | peak RSS GB | losses per step |")
    print("|---|---:|---:|---|")
    for r in rows:
        losses = ", ".join(f"{v:.4f}" for v in r["losses"])
        print(f"| {r['checkpointing']} | {r['seconds']:.1f} | {r['peak_rss_gb']:.2f} | {losses} |")
    off, on = rows
    print(f"on / off: time {on['seconds'] / off['seconds']:.2f}x, "
          f"peak RSS {on['peak_rss_gb'] / off['peak_rss_gb']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
