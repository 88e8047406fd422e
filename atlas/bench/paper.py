"""``python -m atlas.bench paper``: projected hours a seed of ``experiment=paper`` on this
device, from a few timed rounds and one timed DPO phase.

The settings come from composing ``experiment=paper`` (500 rounds, 6 islands x 8 samples x
1,024 tokens, DPO every 20 rounds, its DPO batch and lengths); ``--set key=value`` changes any
of them and ``--max-new-tokens`` the completion budget, so that a CPU test runs in seconds.
Rounds run through the loop's own ``Explorer.run_round`` (the agent's sampler, extraction
and the sandbox); the phase runs ``train_phase`` on pairs built from the timed rounds'
completions (at the paper's lengths), as many as ``dpo.max_pairs`` allows. Projection::

    hours = (round 1 + (rounds - 1) x mean of rounds 2.. + phases x phase) / 3600

with the first round apart because it holds one-off costs (allocation, compilation). Not
timed, and so not in the projection: the gate and supporters (method=atlas), checkpoints.
``--model llama3_1b_shape`` (default) has random weights: speed only, its programs fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atlas.bench.floor import profile_busy, ratio_text
from atlas.bench.machine import (
    add_model_args,
    bench_model_cfg,
    device_info,
    device_line,
    model_label,
    resolve_bench_device,
)
from atlas.sandbox import Resources, Sandbox
from atlas.tasks import make_task
from atlas.types import PreferencePair

CONF = Path(__file__).resolve().parents[2] / "conf"


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench paper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, default="llama3_1b_shape")
    p.add_argument("--task", default="bandit", help="the task whose rounds are timed")
    p.add_argument("--rounds-timed", type=int, default=3,
                   help="rounds timed (the first counts once, the mean of the others 499 times)")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="completion budget (0: experiment=paper's explore.max_new_tokens)")
    p.add_argument("--phase-pairs", type=int, default=0,
                   help="pairs in the timed phase (0: dpo.max_pairs); a projection scales a "
                        "phase of fewer pairs up to dpo.max_pairs")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="a Hydra override on top of experiment=paper, e.g. "
                                             "--set explore.workers=2 (repeatable)")
    p.add_argument("--floor-tokens", type=int, default=32,
                   help="completion budget of the two extra rounds (one timed, one profiled) "
                        "that measure the floor; short, since a profile of a full round would "
                        "hold millions of events (0 = skip)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    return p.parse_args(list(argv))


def compose_paper(overrides: Sequence[str] = ()) -> Any:
    """``experiment=paper`` as ``python -m atlas.train experiment=paper <overrides>`` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=["experiment=paper", *overrides])


def projection(rounds: int, phase_every: int, round_s: Sequence[float], phase_s: float,
               phase_pairs: int, target_pairs: int) -> dict[str, Any]:
    """Seconds and hours a seed takes: the first timed round once, the mean of the later ones
    for every other round, and ``rounds // phase_every`` phases of ``target_pairs`` pairs (a
    phase timed on fewer pairs is scaled up in proportion)."""
    if not round_s:
        raise ValueError("projection needs at least one timed round")
    first = float(round_s[0])
    steady = (sum(round_s[1:]) / (len(round_s) - 1)) if len(round_s) > 1 else first
    rounds_total = first + (rounds - 1) * steady
    phases = rounds // phase_every
    per_phase = phase_s * (max(target_pairs, phase_pairs) / phase_pairs) if phase_pairs else 0.0
    total = rounds_total + phases * per_phase
    return {"rounds": rounds, "first_round_s": first, "steady_round_s": steady,
            "rounds_s": rounds_total, "phases": phases, "phase_s_measured": phase_s,
            "phase_pairs_measured": phase_pairs, "phase_pairs": max(target_pairs, phase_pairs),
            "phase_s": per_phase, "phases_s": phases * per_phase, "total_s": total,
            "hours": total / 3600.0}


def pairs_from(programs: Sequence[Any], limit: int) -> list:
    """Preference pairs over the rounds' own completions (same prompt, two completions), so a
    phase trains on the lengths the rounds produce; which is "chosen" does not change speed."""

    by_prompt: dict[str, list[str]] = {}
    for p in programs:
        if p.completion.strip():
            by_prompt.setdefault(p.prompt, []).append(p.completion)
    per_prompt = [[PreferencePair(prompt=prompt, chosen=a, rejected=b, chosen_score=1.0,
                                  rejected_score=0.0)
                   for a, b in itertools.combinations(completions, 2)]
                  for prompt, completions in by_prompt.items()]
    # round-robin over prompts, so that a capped set still spans every prompt
    pairs = [q for group in itertools.zip_longest(*per_prompt) for q in group if q is not None]
    return pairs[:limit]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Time the rounds and the phase, print the projection with the numbers it used."""
    args = _parse(argv or [])
    import torch
    from omegaconf import OmegaConf

    # deferred: load torch, transformers, peft and lightning; --help stays fast
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo import DPOConfig, train_phase
    from atlas.evolution.database import ProgramDatabase
    from atlas.evolution.explorer import Explorer
    from atlas.loop import usable_cores
    from atlas.schema import ExploreConfig, ModelConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_bench_device(args.device)
    overrides = [f"task={args.task}", *args.overrides]
    if args.max_new_tokens:
        overrides.append(f"explore.max_new_tokens={args.max_new_tokens}")
    cfg = compose_paper(overrides)
    explore = OmegaConf.to_container(cfg.explore, resolve=True)
    workers = ExploreConfig.from_cfg(cfg.explore).sandbox_workers(usable_cores())
    try:
        model_cfg = bench_model_cfg(args.model, args.hidden, args.layers)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    info = device_info(device)
    label = model_label(args.model, model_cfg)
    print(device_line(info), flush=True)
    print(f"experiment=paper task={args.task} model={label}: {explore['rounds']} rounds, "
          f"{explore['islands_per_round']} islands x {explore['samples_per_prompt']} samples x "
          f"{explore['max_new_tokens']} tokens a round, DPO every {explore['phase_every']} "
          f"rounds (batch {cfg.dpo.batch_size}, max_length {cfg.dpo.max_length}, "
          f"max_pairs {cfg.dpo.max_pairs}); sandbox workers {workers}", flush=True)
    t0 = time.perf_counter()
    agent = ResearchAgent(ModelConfig.from_cfg(model_cfg), device=device, seed=args.seed)
    load_s = time.perf_counter() - t0
    print(f"model load {load_s:.1f} s ({agent.precision.dtype}: {agent.precision.reason})",
          flush=True)
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task = make_task(task_cfg.pop("name"), **task_cfg)
    sandbox = Sandbox.for_task(task, resources=Resources(workers=workers))
    results: dict[str, Any] = {"device": info, "model": label, "load_s": load_s,
                               "explore": explore, "rounds": []}
    try:
        settings = ExploreConfig.from_cfg(cfg.explore)
        db = ProgramDatabase(settings, seed=args.seed)
        explorer = Explorer(task, agent, sandbox, db, settings, args.seed)
        explorer.seed_islands(0)
        programs: list = []
        for r in range(1, args.rounds_timed + 1):
            t0 = time.perf_counter()
            out = explorer.run_round(r, phase=0)
            wall = time.perf_counter() - t0
            tokens = sum(len(agent.tokenizer(p.completion, add_special_tokens=False)["input_ids"])
                         for p in out)
            st = explorer.last_stats
            row = {"round": r, "wall_s": wall, "generation_s": st.generation_s,
                   "evaluate_wait_s": st.evaluate_wait_s, "samples": len(out),
                   "tokens": tokens, "tokens_per_s": tokens / max(wall, 1e-9)}
            results["rounds"].append(row)
            programs += out
            print(f"  round {r}: {wall:.2f} s ({row['generation_s']:.2f} s generating, "
                  f"{row['evaluate_wait_s']:.2f} s waiting for the sandbox), {len(out)} samples, "
                  f"{tokens} tokens = {row['tokens_per_s']:.1f} tok/s", flush=True)
        if args.floor_tokens > 0:
            tokens = min(int(explore["max_new_tokens"]), args.floor_tokens)
            short = Explorer(task, agent, sandbox, db,
                             dataclasses.replace(settings, max_new_tokens=tokens), args.seed)
            rnd = args.rounds_timed + 1
            t0 = time.perf_counter()
            short.run_round(rnd, phase=0)
            wall = time.perf_counter() - t0
            _, busy = profile_busy(lambda: short.run_round(rnd + 1, phase=0), device)
            results["floor"] = {"tokens": tokens, "round_s": wall, "round_busy_s": busy.seconds,
                                "kind": busy.kind,
                                "ratio": wall / busy.seconds if busy.seconds else None}
            print(f"  a round of {tokens} tokens: {ratio_text(wall, busy.seconds, busy.kind)} "
                  f"(two extra rounds, one profiled; the wall includes the sandbox)",
                  flush=True)
    finally:
        sandbox.close()
    target_pairs = int(cfg.dpo.max_pairs)
    pairs = pairs_from(programs, args.phase_pairs or target_pairs)
    dpo = DPOConfig.from_cfg(cfg.dpo)
    phase_s = 0.0
    if pairs:
        agent.model.to(agent.device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = train_phase(agent.model, agent.tokenizer, pairs, dpo, str(cfg.method.reference),
                          seed=args.seed)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        phase_s = time.perf_counter() - t0
        tokens = float(res.metrics.get("tokens", 0.0))
        results["phase"] = {"seconds": phase_s, "pairs": len(pairs), "tokens": tokens,
                            "tokens_per_s": tokens / phase_s,
                            "device_after": str(next(agent.model.parameters()).device)}
        print(f"  DPO phase: {phase_s:.2f} s on {len(pairs)} pairs ({phase_s / len(pairs):.3f} "
              f"s a pair, {tokens:.0f} tokens = {tokens / phase_s:.0f} tok/s, reference "
              f"{cfg.method.reference}; model on {results['phase']['device_after']} after it)",
              flush=True)
    else:
        print("  DPO phase: not timed (the rounds left no two non-empty completions of one "
              "prompt)", flush=True)
    pr = projection(int(explore["rounds"]), int(explore["phase_every"]),
                    [r["wall_s"] for r in results["rounds"]], phase_s, len(pairs), target_pairs)
    results["projection"] = pr
    steady_from = "mean of rounds 2.." if len(results["rounds"]) > 1 else "round 1"
    scaled = (f", scaled from {pr['phase_pairs_measured']} to {pr['phase_pairs']} pairs"
              if pr["phase_pairs"] != pr["phase_pairs_measured"] else "")
    print(f"\nprojected a seed of experiment=paper on {info['name']} ({label}):\n"
          f"  rounds: {pr['first_round_s']:.2f} s (round 1) + {pr['rounds'] - 1} x "
          f"{pr['steady_round_s']:.2f} s ({steady_from}) = {pr['rounds_s']:.0f} s\n"
          f"  phases: {pr['phases']} x {pr['phase_s']:.2f} s (measured {phase_s:.2f} s"
          f"{scaled}) = {pr['phases_s']:.0f} s\n"
          f"  total: {pr['total_s']:.0f} s = {pr['hours']:.2f} h a seed "
          f"(not timed: gate, supporters, checkpoints)", flush=True)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return results
