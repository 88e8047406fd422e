"""``python -m atlas.bench gate``: does the Policy Inspector's gate discriminate?

A controlled experiment on programs recorded in real runs: by default the two bandit CPU runs
of docs/results.md (``docs/runs/cpu_bandit_s0``: EvoTune and ATLAS, seed 0, 16 prompts, 134
evaluated completions, shipped in ``atlas/bench/data``); ``--programs`` takes any runs'
``programs.jsonl``. Each trial (seed t):
1. holds prompts out of D_k as a run does (``hold_out_prompts`` with the default gate
   settings: half of the prompts, informative ones first, at most ``subset_size``;
   ``--holdout-share`` changes it) and makes G_k of their completions (``gate_items``);
2. builds D_k from the other prompts with the loop's builder (``build_pairs``), phase by phase
   of each run as the loop does, shuffled (seeded) and cut to ``--pairs`` (default 24 =
   ``dpo.max_pairs``, a full phase);
3. trains the policy from the same start twice, with the real default DPO settings
   (``conf/dpo/default.yaml``, C_k with its snapshots): once on D_k ("correct"), once on
   D_k with chosen and rejected swapped ("inverted");
4. runs the gate at its default settings (``conf/gate/default.yaml``) on each.
Printed: per trial and arm c*, S gain, its lower bound, bootstrap SE and KL; then both
acceptance rates (targets: correct accepted >= 80%, inverted rejected >= 90%) and the
measured noise (bootstrap SE of the gain) that epsilon is set against. ``--lr`` trains both
arms with another learning rate (the gate's power against how far the policy moves). Each
row keeps the raw log-probs behind its decision, so ``--rows FILE`` re-decides recorded
trials under other ``--scale`` / ``--bound`` / ``--confidence`` / ``--epsilons``.
``--null 4x4,8x9`` needs no model: how often a policy with no effect clears the gate, per
bound and G_k shape (the calibration behind ``gate.bc_min_completions``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from atlas.bench.machine import resolve_bench_device
from atlas.dpo.rules import BOUNDS, SCALES, Eq5, judge
from atlas.types import GateItem, Program

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(__file__).with_name("data")
DATA = [DATA_DIR / "cpu_bandit_s0_evotune_programs.jsonl",
        DATA_DIR / "cpu_bandit_s0_atlas_programs.jsonl"]
_RUN_OFFSET = 1_000_000  # program ids and islands of run i are shifted by i * this


def load_programs(paths: Path | list[Path]) -> list:
    """The programs of one or more runs as ``Program`` objects; ids and islands of the i-th
    run are shifted by ``i * 1e6`` so that runs never share a program or an island."""

    rows = []
    for i, path in enumerate([paths] if isinstance(paths, (str, Path)) else paths):
        for line in Path(path).read_text().splitlines():
            if line.strip():
                p = Program.from_dict(json.loads(line))
                p.id += i * _RUN_OFFSET
                p.island += i * _RUN_OFFSET
                rows.append(p)
    return rows


def inverted(pairs: list) -> list:
    """The same pairs with chosen and rejected swapped (a policy taught the wrong way round)."""
    return [dataclasses.replace(p, chosen=p.rejected, rejected=p.chosen,
                                chosen_score=p.rejected_score, rejected_score=p.chosen_score,
                                chosen_id=p.rejected_id, rejected_id=p.chosen_id) for p in pairs]


def held_out_richest(agent: list) -> set[str]:
    """The prompt with the most evaluated completions (one rich gate item instead of the
    loop's several small ones)."""
    counts: dict[str, int] = {}
    for p in agent:
        if p.prompt and p.completion:
            counts[p.prompt] = counts.get(p.prompt, 0) + 1
    return {max(counts, key=lambda x: (counts[x], x))}


def trial_data(programs: list, db: Any, gate: Any, dpo: Any, seed: int, n_pairs: int,
               holdout: str = "loop", gate_completions: int = 0, evidence: str = "holdout"
               ) -> tuple[list, list, set[str]]:
    """(D_k, G_k, held-out prompts) of trial ``seed``: the held-out prompts' programs never
    reach D_k; D_k is built by the loop's builder from the rest, one (run, phase) at a time,
    shuffled and cut to ``n_pairs``; G_k (``gate_items``, one item per held-out prompt) keeps
    a seeded random ``gate_completions`` of each held-out prompt's completions (0: all).
    ``holdout``: "loop" (``hold_out_prompts`` with the gate's settings, as a run does) or
    "richest". ``evidence="buffer"`` (the paper's rule, in-sample) mirrors a run's phase
    buffer: ``gate_prompts`` picks G_k's ``subset_size`` prompts and D_k is built from their
    programs alone, nothing held out (in a run at the default scale G_k covers every prompt
    of the phase, 3-8 of them); "first-phase": the buffer of a run's first phase, whose rounds
    all serve one prompt (every island starts from the seed): D_k and G_k from the prompt with
    the most completions alone."""
    # deferred: load pydantic and omegaconf; python -m atlas.bench gate --help stays fast
    from atlas.dpo.evidence import gate_items, gate_prompts, hold_out_prompts
    from atlas.evolution.buffer import failure_floor
    from atlas.evolution.preferences import build_pairs

    pairable = [p for p in programs if p.source in ("agent", "supporter")]
    agent = [p for p in pairable if p.source == "agent"]
    if evidence == "first-phase":  # one prompt (every island starts from the seed): its buffer
        seed_prompt = held_out_richest(agent)
        pairable = [p for p in pairable if p.prompt in seed_prompt]
        agent = [p for p in pairable if p.source == "agent"]
        evidence = "buffer"
    if evidence == "buffer":
        order = gate_prompts(agent, seed, gate.subset_size)
        pairable = [p for p in pairable if p.prompt in set(order)]
        agent = [p for p in pairable if p.source == "agent"]
    elif holdout == "richest":
        order = sorted(held_out_richest(agent))
    else:
        order = hold_out_prompts(agent, gate, seed)
    held = set(order) if evidence != "buffer" else set()
    phases: dict[tuple[int, int], list] = defaultdict(list)
    for p in pairable:
        if p.prompt not in held:
            phases[(p.id // _RUN_OFFSET, p.phase)].append(p)
    pairs = [pr for key in sorted(phases)
             for pr in build_pairs(db, phases[key], top_k=dpo.top_k, max_pairs=dpo.max_pairs,
                                   score_threshold=None, seed=seed)]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    pairs = pairs[:n_pairs]
    gate_progs = [p for p in agent if p.prompt in set(order)]
    if gate_completions:
        by_prompt: dict[str, list] = {}
        for p in gate_progs:
            by_prompt.setdefault(p.prompt, []).append(p)
        gate_progs = [q for ps in by_prompt.values()
                      for q in (rng.sample(ps, gate_completions) if len(ps) > gate_completions
                                else ps)]
    items = gate_items(gate_progs, order, failure_score=failure_floor(agent))
    if evidence != "buffer":
        assert not {p.prompt for p in pairs} & {it.prompt for it in items}, "G_k leaked into D_k"
    return pairs, items, held


def raw_pass(res: Any, candidates: list, items: list) -> dict[str, Any]:
    """The gate pass of one trial arm as plain data: per candidate (in C_k's order) and per
    item, each completion's sequence log-prob; the reference's; each item's task scores and
    each candidate's per-item KL."""
    return {"names": [c.name for c in candidates], "sum_logps": res.sum_logps,
            "ref_sum_logps": res.ref_sum_logps, "kl": res.kl,
            "scores": [list(map(float, it.scores)) for it in items]}


def keep_candidates(row: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """The row with C_k cut to the candidates at positions ``keep`` (C_k's order: the
    snapshots, then the phase-final policy; -1 is the final one): the same trial with a
    smaller C_k, to weigh what each candidate adds to Eq. 4's choice."""
    raw = row["raw"]
    n = len(raw["names"])
    idx = sorted({k % n for k in keep})
    return {**row, "raw": {**raw, "names": [raw["names"][i] for i in idx],
                           "sum_logps": [raw["sum_logps"][i] for i in idx],
                           "kl": [raw["kl"][i] for i in idx]}}


def redecide(row: dict[str, Any], gate: Any) -> dict[str, Any]:
    """The row's gate decision recomputed from its raw log-probs under ``gate`` (another
    ``scale``, ``bound``, ``confidence``, ``epsilon``...): Eq. 4 and Eq. 5 exactly as
    ``select_and_gate`` computes them, without re-training or re-running the model."""
    # deferred: load torch, transformers and peft; --help stays fast
    from atlas.dpo.gate import decide, offline_estimates
    from atlas.dpo.scoring import mean_kl

    raw = row["raw"]
    items = [GateItem("", [""] * len(sc), sc, "") for sc in raw["scores"]]
    est = offline_estimates(raw["sum_logps"], raw["ref_sum_logps"], items, gate, row["seed"])
    d = decide([e.score for e in est], [mean_kl(k) for k in raw["kl"]], raw["names"],
               est[0].ref_score, gate, lowers=[e.lower for e in est], ses=[e.se for e in est],
               bound=est[0].bound)
    return {**row, "accepted": d.accepted, "reason": d.reason, "chosen": d.chosen,
            "gain": d.gain, "lower": d.lower_bound, "se": d.se, "kl": d.kl, "bound": d.bound}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf

    # deferred: load torch, transformers, peft and lightning; --help stays fast
    from atlas.agent.adapters import POLICY, REF, get_adapter_state, set_adapter_state
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo import DPOConfig, train_phase
    from atlas.dpo.reference import GateJudge, Promoter, ReferenceCallback
    from atlas.evolution.database import ProgramDatabase
    from atlas.schema import ExploreConfig, ModelConfig

    torch.set_num_threads(args.threads)
    model_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{args.model}.yaml"))
    dpo = DPOConfig.from_cfg(OmegaConf.load(ROOT / "conf" / "dpo" / "default.yaml"))
    gate = gate_config(args)
    if args.max_length:
        dpo = dataclasses.replace(dpo, max_length=args.max_length)
        gate = dataclasses.replace(gate, max_length=args.max_length)

    agent = ResearchAgent(ModelConfig.from_cfg(model_cfg),
                          device=resolve_bench_device(getattr(args, "device", "cpu")), seed=0)
    start = {POLICY: get_adapter_state(agent.model, POLICY), REF: get_adapter_state(agent.model, REF)}
    programs = load_programs([Path(p) for p in args.programs])
    # select_top_k only: the recorded programs keep the clusters their runs assigned
    db = ProgramDatabase(ExploreConfig.from_cfg(OmegaConf.load(ROOT / "conf" / "explore"
                                                               / "default.yaml")), seed=0)
    if args.lr:
        dpo = dataclasses.replace(dpo, lr=args.lr)
    rows: list[dict[str, Any]] = []
    for t in range(args.first_seed, args.first_seed + args.trials):
        pairs, items, held = trial_data(programs, db, gate, dpo, t, args.pairs, args.holdout,
                                        args.gate_completions, args.evidence)
        for arm, arm_pairs in (("correct", pairs), ("inverted", inverted(pairs))):
            set_adapter_state(agent.model, POLICY, start[POLICY])
            set_adapter_state(agent.model, REF, start[REF])
            passes: list = []
            # the run's reference owner, deciding without promoting
            owner = ReferenceCallback(Promoter(
                GateJudge(agent.tokenizer, items, gate, gated=True, seed=t, keep_pass=passes),
                promote_accepted=False))
            t0 = time.perf_counter()
            res = train_phase(agent.model, agent.tokenizer, arm_pairs, dpo, "adaptive", seed=t,
                              reference_callback=owner)
            assert res.reference is not None
            d, gate_s = res.reference.decision, res.reference.seconds
            t1 = time.perf_counter() - gate_s
            row = {"seed": t, "arm": arm, "accepted": d.accepted, "reason": d.reason,
                   "chosen": d.chosen, "gain": d.gain, "lower": d.lower_bound, "se": d.se,
                   "kl": d.kl, "score": d.score, "ref_score": d.ref_score,
                   "pairs": len(arm_pairs), "kinds": sorted({p.kind for p in arm_pairs}),
                   "gate_items": len(items), "gate_completions": sum(len(i.completions)
                                                                    for i in items),
                   "candidates": d.to_dict()["candidates"], "dpo_s": t1 - t0,
                   "gate_s": gate_s, "gate_parts": res.reference.parts,
                   "evidence": args.evidence,
                   # the raw numbers behind S and KL, so another statistic can be recomputed
                   "raw": raw_pass(passes[0], res.candidates, items) if passes else None}
            rows.append(row)
            print(f"seed {t} {arm:8s} {'ACCEPT' if d.accepted else 'reject'} c*={d.chosen:7s} "
                  f"gain {d.gain:+.4f} lower {d.lower_bound:+.4f} se {d.se:.4f} KL {d.kl:.2e} "
                  f"| {len(arm_pairs)} pairs, G_k {len(items)} prompts / "
                  f"{row['gate_completions']} completions | DPO {t1 - t0:.0f} s, gate "
                  f"{row['gate_s']:.0f} s (pass {res.reference.parts.get('pass', 0):.0f} s)",
                  flush=True)
            if args.json:  # partial results survive an interrupted bench
                Path(args.json).write_text(json.dumps({"rows": rows}, default=str))
    return {"rows": rows, "gate": dataclasses.asdict(gate), "dpo": dpo.to_dict(),
            "model": args.model, "programs": str(args.programs)}


def cut_row(row: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    """The row with its G_k cut to ``n`` of its completions (a seeded draw over all of them;
    an item left with none is dropped): the same trial on thinner evidence."""
    raw = row["raw"]
    slots = [(i, j) for i, sc in enumerate(raw["scores"]) for j in range(len(sc))]
    keep = set(random.Random(seed).sample(slots, min(n, len(slots))))
    items = [i for i, sc in enumerate(raw["scores"]) if any((i, j) in keep for j in range(len(sc)))]

    def cut(per_item: list) -> list:
        return [[v for j, v in enumerate(per_item[i]) if (i, j) in keep] for i in items]

    return {**row, "raw": {**raw, "scores": cut(raw["scores"]),
                           "ref_sum_logps": cut(raw["ref_sum_logps"]),
                           "sum_logps": [cut(c) for c in raw["sum_logps"]]}}


def power_rates(rows: list[dict[str, Any]], sizes: list[int], gate: Any, draws: int = 5
                ) -> list[tuple[int, dict[str, tuple[int, int]]]]:
    """(n, {arm: (accepted, decisions)}) when every trial's G_k is cut to n completions, over
    ``draws`` seeded cuts each: how the gate's power and false promotions depend on how much
    evidence it has (``gate.min_holdout_completions`` is read off this)."""
    out = []
    for n in sizes:
        by_arm: dict[str, list[int]] = {"correct": [0, 0], "inverted": [0, 0]}
        for row in rows:
            for k in range(draws):
                d = redecide(cut_row(row, n, 1000 * k + int(row["seed"])), gate)
                by_arm[row["arm"]][0] += bool(d["accepted"])
                by_arm[row["arm"]][1] += 1
        out.append((n, {a: (v[0], v[1]) for a, v in by_arm.items()}))
    return out


def null_rates(shapes: list[tuple[int, int]], trials: int, gate: Any, sigma: float = 0.5,
               seed: int = 0) -> list[dict[str, Any]]:
    """How often a policy with *no* effect clears the gate's bound + epsilon, per bound and
    G_k shape (items x completions), without a model: each item has one failure (score -1)
    and uniform scores, and the policy's sequence log-ratios are N(0, sigma) noise unrelated
    to them (sigma 0.5 nats: the spread of the bench's recorded log-ratios is 0.3-1). A
    calibrated 90% bound passes such a policy <= 10% of the time."""
    import torch

    # deferred: loads torch, transformers and peft; --help stays fast
    from atlas.dpo.gate import offline_estimates

    gen = torch.Generator().manual_seed(seed)
    out = []
    for n_items, n in shapes:
        passed = {b: 0 for b in BOUNDS}
        for t in range(trials):
            items, logps = [], []
            for _ in range(n_items):
                scores = [-1.0] + torch.rand(n - 1, generator=gen, dtype=torch.float64).tolist()
                items.append(GateItem("", [""] * n, scores, ""))
                logps.append((sigma * torch.randn(n, generator=gen, dtype=torch.float64)).tolist())
            ref = [[0.0] * n for _ in range(n_items)]
            for b in passed:  # each bound as such: no thin-G_k fallback
                g = dataclasses.replace(gate, bound=b, bc_min_completions=0)
                passed[b] += offline_estimates([logps], ref, items, g, t)[0].lower >= gate.epsilon
        out.append({"items": n_items, "completions": n,
                    **{b: v / trials for b, v in passed.items()}})
    return out


def gate_config(args: argparse.Namespace) -> Any:
    """conf/gate/default.yaml with the command line's --scale / --bound / --confidence /
    --holdout-share."""
    from omegaconf import OmegaConf

    # deferred: loads pydantic and omegaconf; --help stays fast
    from atlas.dpo import GateConfig

    cfg = OmegaConf.load(ROOT / "conf" / "gate" / "default.yaml")
    for key, arg in (("scale", "scale"), ("bound", "bound"), ("confidence", "confidence"),
                     ("holdout", "holdout_share")):
        if getattr(args, arg, None) is not None:
            cfg[key] = getattr(args, arg)
    return GateConfig.from_cfg(cfg)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Acceptance rates per arm and the measured noise (bootstrap SE of the gain)."""
    rows = result["rows"]
    out: dict[str, Any] = {}
    for arm in ("correct", "inverted"):
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        ses = [r["se"] for r in mine if r["se"] is not None and r["se"] == r["se"]]
        out[arm] = {"trials": len(mine), "accepted": sum(r["accepted"] for r in mine),
                    "rate": sum(r["accepted"] for r in mine) / len(mine),
                    "median_gain": statistics.median(r["gain"] for r in mine),
                    "median_se": statistics.median(ses) if ses else None}
    return out


def accepted_at(row: dict[str, Any], epsilon: float, delta: float) -> bool:
    """The Eq. 5 rule (``atlas.dpo.rules.Eq5``) on a recorded row at another epsilon: c*
    (Eq. 4) does not depend on epsilon, so the decision is the rule's verdict on the row's
    lower bound and KL (an unrecorded or NaN number fails)."""
    lower, kl = row.get("lower"), row.get("kl")
    if lower is None or kl is None:
        return False
    at = SimpleNamespace(rule=Eq5.name, epsilon=epsilon, delta=delta)
    return judge(at, gain=row.get("gain", lower), lower=lower, kl=kl).accepted


def rates_by_epsilon(rows: list[dict[str, Any]], epsilons: list[float], delta: float
                     ) -> list[tuple[float, dict[str, tuple[int, int]]]]:
    """(epsilon, {arm: (accepted, trials)}) for each epsilon: the gate's power (correct arm)
    and false-promotion rate (inverted arm) from one set of trials, without re-running."""
    out = []
    for eps in epsilons:
        by_arm = {}
        for arm in ("correct", "inverted"):
            mine = [r for r in rows if r["arm"] == arm]
            by_arm[arm] = (sum(accepted_at(r, eps, delta) for r in mine), len(mine))
        out.append((eps, by_arm))
    return out


def print_rates_by_epsilon(rows: list[dict[str, Any]], epsilons: list[float],
                           delta: float) -> None:
    print("\nacceptance by epsilon (the same trials, decisions recomputed from their lower "
          "bounds; targets: correct >= 80%, inverted <= 10%)")
    for eps, by_arm in rates_by_epsilon(rows, epsilons, delta):
        c, i = by_arm["correct"], by_arm["inverted"]
        print(f"  epsilon {eps:+.3f}: correct accepted {c[0]}/{c[1]}, inverted accepted "
              f"{i[0]}/{i[1]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m atlas.bench gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="conf/model/<name>.yaml: smollm2 or tiny")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto (CUDA when present)")
    ap.add_argument("--programs", nargs="+", default=[str(p) for p in DATA],
                    help="runs' programs.jsonl (default: the EvoTune and ATLAS bandit "
                         "runs, seed 0)")
    ap.add_argument("--trials", type=int, default=10, help="trials per arm (seeds)")
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first trial")
    ap.add_argument("--pairs", type=int, default=24,
                    help="pairs per trial (a seeded random subset of D_k; 24 = dpo.max_pairs)")
    ap.add_argument("--holdout", choices=("richest", "loop"), default="loop",
                    help="which prompts G_k holds out of D_k: loop (hold_out_prompts, as a run "
                         "does) or richest (the prompt with the most evaluated completions)")
    ap.add_argument("--evidence", choices=("holdout", "buffer", "first-phase"),
                    default="holdout",
                    help="G_k as gate.evidence takes it: holdout (prompts held out of D_k, "
                         "--holdout says which), buffer (the paper's rule: a phase buffer of "
                         "gate.subset_size prompts, D_k and G_k both from it) or first-phase (the buffer of "
                         "one prompt: a run's first phase)")
    ap.add_argument("--power", default="",
                    help="with --rows: the acceptance rates when each trial's G_k is cut to "
                         "N completions (seeded draws), for these N, e.g. 8,16,32 (how much "
                         "evidence a decision needs)")
    ap.add_argument("--gate-completions", type=int, default=0,
                    help="completions of a held-out prompt drawn (seeded) into G_k; 0: all")
    ap.add_argument("--lr", type=float, default=0.0,
                    help="DPO learning rate of both arms (0: dpo.lr of conf/dpo/default.yaml)")
    ap.add_argument("--max-length", type=int, default=0,
                    help="override dpo/gate max_length (0: the defaults; tests only)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default="", help="also write every row to this file")
    ap.add_argument("--epsilons", default="-0.02,0,0.01,0.02",
                    help="comma-separated epsilons at which the trials' decisions are "
                         "recomputed and printed after the run")
    ap.add_argument("--rows", nargs="*", default=[],
                    help="re-summarise the rows of an earlier run's --json file (no training): "
                         "its rates at the default gate settings and at --epsilons; rows with "
                         "raw log-probs are re-decided under the gate settings of this command")
    ap.add_argument("--candidates", default="",
                    help="with --rows: re-decide on these positions of C_k only, e.g. -1 (the "
                         "final policy) or 1,-1 (the second snapshot and the final one)")
    ap.add_argument("--scale", choices=SCALES, default=None,
                    help="gate.scale for this command (default: conf/gate/default.yaml)")
    ap.add_argument("--bound", choices=BOUNDS, default=None,
                    help="gate.bound for this command (default: conf/gate/default.yaml)")
    ap.add_argument("--holdout-share", type=float, default=None,
                    help="gate.holdout for this command: the share of prompts held out of D_k "
                         "for G_k (default: conf/gate/default.yaml)")
    ap.add_argument("--confidence", type=float, default=None,
                    help="gate.confidence for this command (default: conf/gate/default.yaml)")
    ap.add_argument("--null", default="",
                    help="no model: how often a no-effect policy clears the gate, per bound, for "
                         "these G_k shapes (items x completions), e.g. 4x4,4x8,8x9")
    ap.add_argument("--null-trials", type=int, default=200, help="trials per --null shape")
    args = ap.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
    if args.null:
        g = gate_config(args)
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.null.split(",") if s]
        print(f"no-effect policy, {args.null_trials} trials per shape; gate: epsilon {g.epsilon}, "
              f"confidence {g.confidence}, scale {g.scale} (a calibrated bound passes <= "
              f"{1 - g.confidence:.0%})")
        for r in null_rates(shapes, args.null_trials, g):
            print(f"  {r['items']} items x {r['completions']} completions: passed bc "
                  f"{r['bc']:.3f}, percentile {r['percentile']:.3f}, normal {r['normal']:.3f}")
        return
    if args.rows:
        g = gate_config(args)
        rows = [r for f in args.rows for r in json.loads(Path(f).read_text())["rows"]]
        raw = all(r.get("raw") for r in rows)
        if args.candidates and not raw:
            raise SystemExit("--candidates needs rows with raw log-probs (bench runs with --json)")
        if args.candidates:
            keep = [int(k) for k in args.candidates.split(",") if k.strip()]
            rows = [keep_candidates(r, keep) for r in rows]
            print(f"C_k cut to positions {keep}")
        if raw:
            rows = [redecide(r, g) for r in rows]
        print(f"{len(rows)} rows from {', '.join(args.rows)}; "
              + (f"re-decided from their raw log-probs with scale {g.scale}, bound {g.bound}, "
                 f"confidence {g.confidence}" if raw else "decisions as recorded (no raw "
                                                           "log-probs)")
              + f"; epsilon {g.epsilon}, delta {g.delta}")
        if raw:
            for r in rows:
                print(f"seed {r['seed']} {r['arm']:8s} {'ACCEPT' if r['accepted'] else 'reject'} "
                      f"c*={r['chosen']:7s} gain {r['gain']:+.4f} lower {r['lower']:+.4f} "
                      f"se {r['se']:.4f} KL {r['kl']:.2e}")
        for arm, (acc, n) in rates_by_epsilon(rows, [float(g.epsilon)], float(g.delta))[0][1].items():
            print(f"{arm}: accepted {acc}/{n} at epsilon {g.epsilon}")
        print_rates_by_epsilon(rows, epsilons, float(g.delta))
        if args.power:
            if not raw:
                raise SystemExit("--power needs rows with raw log-probs (bench runs with --json)")
            sizes = [int(x) for x in args.power.split(",") if x.strip()]
            print("\nacceptance when G_k is cut to N completions (5 seeded cuts per trial; "
                  "targets: correct >= 80%, inverted <= 10%)")
            for n, by_arm in power_rates(rows, sizes, g):
                c, i = by_arm["correct"], by_arm["inverted"]
                print(f"  N {n:4d}: correct accepted {c[0]}/{c[1]} = {c[0] / max(c[1], 1):.0%}, "
                      f"inverted accepted {i[0]}/{i[1]} = {i[0] / max(i[1], 1):.0%}")
        return
    # deferred: loads torch; --help stays fast
    from atlas.agent.precision import cpu_features, cpu_model

    feats = cpu_features()
    print(f"CPU: {cpu_model()} ({feats['capability']}, native bf16: "
          f"{'yes' if feats['avx512_bf16'] or feats['amx_tile'] else 'no'}), "
          f"{args.threads} threads; model {args.model}", flush=True)
    t0 = time.perf_counter()
    result = run(args)
    s = summary(result)
    result["summary"] = s
    result["seconds"] = time.perf_counter() - t0
    g = result["gate"]
    print(f"\ngate: epsilon {g['epsilon']}, delta {g['delta']}, lam {g['lam']}, confidence "
          f"{g['confidence']}, scale {g['scale']}, bound {g['bound']}, holdout {g['holdout']}, "
          f"evidence {args.evidence}; {args.trials} trials per arm, "
          f"{result['seconds'] / 60:.1f} min")
    for arm, target in (("correct", "accepted >= 80%"), ("inverted", "rejected >= 90%")):
        if arm in s:
            r = s[arm]
            se = "n/a" if r["median_se"] is None else f"{r['median_se']:.4f}"
            print(f"{arm}: accepted {r['accepted']}/{r['trials']} = {r['rate']:.0%} "
                  f"(target: {target}); median gain {r['median_gain']:+.4f}, median bootstrap "
                  f"SE {se}")
    print_rates_by_epsilon(result["rows"], epsilons, float(g["delta"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
