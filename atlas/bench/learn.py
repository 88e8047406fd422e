"""``python -m atlas.bench learn``: which DPO settings make a phase move the agent, and does
what it learns hold on prompts it never trained on?

One phase is trained again from an archived run (default: the README's main command, seed 0,
``docs/bench/learn/main_bandit_atlas_s0``: its programs, config and task secret), once per
setting of a grid, each from the base model (fresh LoRA adapters of the setting's rank).
Everything but the setting is the run's: D_k is rebuilt with the loop's own builder from the
phase's programs, and the learning probe (``atlas.probe``) chooses its prompts from the
database as the run had it at the phase's end, so none is in D_k. The probe's "before"
programs are written once by the base model (every setting starts from it) and scored in
the sandbox with the run's secret; each setting's trained policy writes them again with the
same seeds. Printed per setting, side by side:

- held-out preference accuracy and margin (every pair the "before" programs support);
- KL(policy || base) per token on those programs;
- the probe's valid slots that went fail -> pass and pass -> fail (exact sign-test p), and
  its change in score (failures at the phase's floor) with a paired 95 % t interval;
- the probe's copies of earlier programs and new valid programs, before -> after
  (``atlas.novelty``);
- the seconds of DPO and of the probe's second half;
- DPO's own training loss and accuracy, first and last step, for contrast.

A setting is ``key=value,...`` over ``lr``, ``epochs``, ``beta``, ``max_pairs``,
``batch_size``, ``lora_r``, ``lora_alpha``; ``--grid`` gives the cartesian product of
``key=v1,v2`` lists, ``--setting`` one setting (repeatable). A setting that fails is named
and left out; the others stand. ``--out`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RUN = ROOT / "docs" / "bench" / "learn" / "main_bandit_atlas_s0"
DPO_KEYS = ("lr", "epochs", "beta", "max_pairs", "batch_size")
MODEL_KEYS = ("lora_r", "lora_alpha")
KEYS = DPO_KEYS + MODEL_KEYS


def parse_setting(text: str) -> dict[str, float | int]:
    """``"lr=2e-4,epochs=2"`` -> {"lr": 2e-4, "epochs": 2}; an unknown key is one line."""
    out: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in KEYS:
            raise SystemExit(f"setting {part!r}: use key=value with a key of {list(KEYS)}")
        try:
            num = float(value)
        except ValueError:
            raise SystemExit(f"setting {part!r}: {value!r} is not a number") from None
        out[key] = int(num) if key not in ("lr", "beta", "lora_alpha") else num
    return out


def grid_settings(grid: list[str]) -> list[dict[str, float | int]]:
    """The cartesian product of ``key=v1,v2`` lists."""
    axes = []
    for item in grid:
        key, eq, values = item.partition("=")
        if not eq or key not in KEYS:
            raise SystemExit(f"--grid {item!r}: use key=v1,v2 with a key of {list(KEYS)}")
        axes.append([parse_setting(f"{key}={v}") for v in values.split(",") if v])
    return [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*axes)]


def setting_name(setting: dict[str, Any]) -> str:
    return ",".join(f"{k}={setting[k]:g}" for k in KEYS if k in setting) or "run's"


@dataclasses.dataclass
class Phase:
    """What one archived phase gives a setting to train and be probed on."""

    config: dict[str, Any]
    programs: list  # the phase's programs (no re-scores)
    db: Any  # the database as the run had it at the phase's end
    secret: str
    phase: int
    secret_file: Path


def load_phase(run: Path, phase: int, secret: Path | None = None) -> Phase:
    """The run folder's phase ``phase`` (``events.jsonl`` for the config, ``programs.jsonl``,
    and the task secret: ``secret``, by default the folder's ``task_secret``). Explore fields
    an older run's config lacks take today's defaults (they do not change its programs)."""
    from omegaconf import OmegaConf

    # deferred: the archive's records pull pydantic; a bad setting is refused before them
    from atlas.evolution.database import ProgramDatabase
    from atlas.schema import ExploreConfig
    from atlas.types import Program, ProgramSource

    files = {"events.jsonl": run / "events.jsonl", "programs.jsonl": run / "programs.jsonl",
             "task_secret": secret or run / "task_secret"}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise SystemExit(f"--run {run}: missing {', '.join(missing)} (an archived run folder; "
                         f"--secret names its task secret when the folder holds none)")
    first = json.loads(files["events.jsonl"].read_text().splitlines()[0])
    config = first["config"]
    defaults = OmegaConf.load(ROOT / "conf" / "explore" / "default.yaml")
    config["explore"] = {**OmegaConf.to_container(defaults), **config["explore"]}
    ex = ExploreConfig.from_cfg(OmegaConf.create(config["explore"]))
    every = ex.phase_every
    last = phase * every
    programs = [Program.from_dict(json.loads(line))
                for line in files["programs.jsonl"].read_text().splitlines() if line.strip()]
    db = ProgramDatabase(ex, seed=int(config["seed"]))
    for p in sorted(programs, key=lambda q: q.id):
        if p.round <= last:
            db.add(p)
    mine = [p for p in programs if last - every < p.round <= last
            and p.source != ProgramSource.RESCORE]
    if not mine:
        raise SystemExit(f"{run} has no programs in phase {phase}")
    return Phase(config, mine, db, files["task_secret"].read_text().strip(), phase,
                 files["task_secret"])


def _agent(config: dict[str, Any], lora: dict[str, Any], cache: dict, device: str) -> Any:
    """A research agent with fresh adapters of the setting's LoRA shape (one per shape)."""
    # deferred: torch, transformers and peft
    from atlas.agent.research_agent import ResearchAgent
    from atlas.schema import ModelConfig

    key = (lora.get("lora_r"), lora.get("lora_alpha"))
    if key not in cache:
        fields = {**config["model"], **{k: v for k, v in lora.items() if v is not None}}
        cache[key] = ResearchAgent(ModelConfig.from_cfg(fields), device=device,
                                   seed=int(config["seed"]))
    return cache[key]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting trained and probed on the archived phase; returns the rows."""
    from omegaconf import OmegaConf

    # deferred: torch, the sandbox and the task load after the settings are checked
    from atlas.bench.machine import bench_model_cfg, resolve_bench_device
    from atlas.evolution.explorer import Explorer
    from atlas.fine_tuning import phase_seed
    from atlas.loop import agent_thread_budget, torch_threads, usable_cores
    from atlas.probe import LearningProbe
    from atlas.sandbox import Confinement, Resources, Sandbox
    from atlas.schema import ExploreConfig, ProbeConfig
    from atlas.tasks import build_task

    ph = load_phase(Path(args.run), args.phase, Path(args.secret) if args.secret else None)
    cfg = ph.config
    if args.model:  # another model than the run's (tests: the tiny one)
        cfg = {**cfg, "model": bench_model_cfg(args.model)}
    device = resolve_bench_device(args.device)
    seed = phase_seed(int(cfg["seed"]), ph.phase)
    task = build_task(OmegaConf.create({"task": cfg["task"]}))
    ex = ExploreConfig.from_cfg(OmegaConf.create(cfg["explore"]))
    probe_cfg = ProbeConfig(enabled=True, prompts=args.probe_prompts,
                            samples=args.probe_samples, temperature=args.probe_temperature)
    settings = args.settings
    agents: dict = {}
    sandbox = Sandbox.for_task(task, secret=ph.secret, resources=Resources(workers=args.workers),
                               confinement=Confinement(hide=(
                                   str(Path(args.run).resolve()),
                                   str(ph.secret_file.resolve().parent))))
    rows, failed = [], []
    try:
        base_agent = _agent(cfg, {}, agents, device)
        threads = agent_thread_budget(args.threads or None, sandbox)
        cores = args.threads or usable_cores()
        base_agent.thread_budget = threads
        explorer = Explorer(task, base_agent, sandbox, ph.db, ex, int(cfg["seed"]))
        probe = LearningProbe.for_phase(probe_cfg, explorer, ph.programs, seed)
        t0 = time.perf_counter()
        with torch_threads(cores):
            probe.before()
        before_s = time.perf_counter() - t0
        print(f"probe: {len(probe.prompts)} prompts x {probe_cfg.samples} samples "
              f"({', '.join(p.where for p in probe.prompts)}); before: {before_s:.0f} s",
              flush=True)
        for setting in settings:
            name = setting_name(setting)
            try:
                row = _one(setting, ph, cfg, probe, explorer, agents, threads, seed, cores,
                           device)
            except Exception as exc:  # noqa: BLE001 - a failing setting is named, not fatal
                failed.append({"setting": name, "error": repr(exc)[:300]})
                print(f"{name}: failed ({exc!r})", flush=True)
                continue
            rows.append(row)
            print(row_line(row), flush=True)
    finally:
        sandbox.close()
    return {"run": str(args.run), "phase": ph.phase, "seed": seed,
            "probe": {"prompts": len(probe.prompts), "samples": probe_cfg.samples,
                      "temperature": probe_cfg.temperature,
                      "sources": [p.where for p in probe.prompts],
                      "before_seconds": before_s},
            "machine": {**_machine(), "threads": cores}, "rows": rows, "failed": failed}


def _one(setting: dict[str, Any], ph: Phase, cfg: dict[str, Any], probe: Any, explorer: Any,
         agents: dict, threads: Any, seed: int, cores: int, device: str) -> dict[str, Any]:
    """Train one setting from the base model and probe it."""
    # deferred: torch and peft
    from atlas.agent.adapters import POLICY, get_adapter_state, set_adapter_state
    from atlas.dpo import DPOConfig
    from atlas.dpo.phase import train_phase
    from atlas.evolution.preferences import build_pairs
    from atlas.loop import torch_threads

    agent = _agent(cfg, {k: setting.get(k) for k in MODEL_KEYS}, agents, device)
    agent.thread_budget = threads
    fresh = agents.setdefault(("fresh", id(agent)), get_adapter_state(agent.model, POLICY))
    set_adapter_state(agent.model, POLICY, fresh)
    fields = {k: v for k, v in cfg["dpo"].items() if k in {f.name for f in
                                                           dataclasses.fields(DPOConfig)}}
    dpo = DPOConfig(**{**fields, **{k: setting[k] for k in DPO_KEYS if k in setting},
                       "bounds": {}})
    pairs = build_pairs(ph.db, ph.programs, top_k=dpo.top_k, max_pairs=dpo.max_pairs,
                        score_threshold=None, seed=seed)
    explorer.agent = agent
    with torch_threads(cores):
        t0 = time.perf_counter()
        result = train_phase(agent.model, agent.tokenizer, pairs, dpo, "fixed", seed=seed)
        dpo_s = time.perf_counter() - t0
        probe.after()
        record = probe.record(agent.model, agent.tokenizer, reference_state=None,
                              beta=dpo.beta, max_length=dpo.max_length)
    m = result.metrics
    held = record["heldout"]
    return {"setting": setting, "name": setting_name(setting), "pairs": len(pairs),
            "steps": int(m["steps"]), "dpo_seconds": dpo_s,
            "probe_after_seconds": record["seconds"]["after"],
            "measure_seconds": record["seconds"]["measure"],
            "train_loss_first": m["loss_first"], "train_loss_last": m["loss_last"],
            "train_accuracy": m["accuracy"], "heldout_pairs": held["pairs"],
            "heldout_accuracy": held["accuracy"], "heldout_margin": held["margin"],
            "kl_base": record["kl_base"], "valid_before": record["before"]["valid_rate"],
            "valid_after": record["after"]["valid_rate"],
            "valid_change": record["change"]["valid_rate"],
            "novelty_before": record["before"]["novelty"],
            "novelty_after": record["after"]["novelty"],
            "score_change": record["change"]["score"],
            "mean_before": record["before"]["mean_score"],
            "mean_after": record["after"]["mean_score"],
            "best_before": record["before"]["best_score"],
            "best_after": record["after"]["best_score"]}


def _num(v: Any, form: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) \
        else format(v, form)


def row_line(row: dict[str, Any]) -> str:
    """One setting's printed line."""
    vc, sc = row["valid_change"], row["score_change"]
    nb, na = row.get("novelty_before") or {}, row.get("novelty_after") or {}
    return (f"{row['name']:<46} acc {_num(row['heldout_accuracy'], '.2f')} "
            f"({row['heldout_pairs']} pairs, margin {_num(row['heldout_margin'], '+.3f')})  "
            f"KL {_num(row['kl_base'], '.2e')}  valid {_num(row['valid_before'], '.2f')}->"
            f"{_num(row['valid_after'], '.2f')} (+{vc.get('fail_to_pass')}/-"
            f"{vc.get('pass_to_fail')}, p {_num(vc.get('p'), '.2f')})  copies "
            f"{nb.get('copies')}->{na.get('copies')}, new & valid {nb.get('new_valid')}->"
            f"{na.get('new_valid')}  score "
            f"{_num(sc['mean'], '+.4f')} [{_num(sc['t_lo'], '+.4f')}, {_num(sc['t_hi'], '+.4f')}]"
            f"  train loss {row['train_loss_first']:.3f}->{row['train_loss_last']:.3f}  "
            f"{row['steps']} steps {row['dpo_seconds']:.0f} s + probe "
            f"{row['probe_after_seconds']:.0f} s")


def _machine() -> dict[str, Any]:
    import torch

    # deferred: torch
    from atlas.agent.precision import native_bf16
    from atlas.provenance import cpu_model, git_state

    commit, dirty = git_state()
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "native_bf16": native_bf16(), "git_commit": commit, "git_dirty": dirty}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m atlas.bench learn",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=str(DEFAULT_RUN),
                        help="an archived run folder (events.jsonl, programs.jsonl, task_secret)")
    parser.add_argument("--phase", type=int, default=1, help="the phase to train again")
    parser.add_argument("--secret", default="",
                        help="the run's task secret file (default: <run>/task_secret)")
    parser.add_argument("--model", default="",
                        help="a conf/model option or local folder instead of the run's model")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--setting", action="append", default=[],
                        help="key=value,... (repeatable): one setting")
    parser.add_argument("--grid", nargs="*", default=[],
                        help="key=v1,v2 ...: the cartesian product of these lists")
    parser.add_argument("--probe-prompts", type=int, default=4)
    parser.add_argument("--probe-samples", type=int, default=8)
    parser.add_argument("--probe-temperature", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: every usable core; 1 keeps a busy machine's "
                             "other processes from stalling the OpenMP threads)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    # a bad setting is one line before anything heavy loads
    args.settings = ([parse_setting(s) for s in args.setting]
                     + (grid_settings(args.grid) if args.grid else [])) or [{}]
    result = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if not result["rows"]:
        sys.exit("no setting ran: see the lines above")


if __name__ == "__main__":
    main()
