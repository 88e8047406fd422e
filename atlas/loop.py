"""The self-evolution loop: rounds of exploration, a fine-tuning phase every F rounds.

Read top to bottom, this is the algorithm (paper 2.1-2.2, App. B.1):

    seed every island with the task's seed program
    for round r:
        (atlas) exploration supporter critiques the islands served last round
        producer samples programs from the agent; consumers score them in the sandbox
        every F rounds: phase k = FineTuner.run_phase (D_k, DPO, C_k, gate, promotion)
        checkpoint atomically (a crash loses at most the round in flight)
    write results.json
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from atlas import checkpoint
from atlas.agent.adapters import set_adapter_state
from atlas.agent.precision import run_precision
from atlas.agent.research_agent import ResearchAgent
from atlas.dpo import DPOConfig, GateConfig
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.explorer import Explorer
from atlas.fine_tuning import FineTuner, adapter_snapshot
from atlas.results import summarise
from atlas.sandbox import Sandbox
from atlas.supporters import build_supporters
from atlas.supporters import requests as supporter_requests
from atlas.tasks import make_task
from atlas.telemetry import Telemetry, dumps
from atlas.types import Program

log = logging.getLogger("atlas.loop")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; a SLURM job's allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def agent_thread_budget(cfg: DictConfig, sandbox: Sandbox) -> Callable[[], int]:
    """Torch threads for the agent at any moment: the cores that sandbox workers are not
    scoring on right now (each busy worker holds one core; oversubscribed OpenMP threads
    spin-wait on each other and slow everything many times over), at least one.
    ``explore.agent_threads`` fixes the number instead."""
    fixed = cfg.explore.get("agent_threads")
    if fixed:
        return lambda: int(fixed)
    cores = usable_cores()
    return lambda: max(1, cores - sandbox.busy_workers)


def island_summary(db: ProgramDatabase, islands: int, k: int) -> dict[str, Any]:
    """Best / median score and cluster coverage per island (the per-round W&B charts)."""
    out: dict[str, Any] = {}
    for i in range(islands):
        scores = sorted(p.score for p in db.island(i) if p.passed)
        out[str(i)] = {"best": scores[-1] if scores else None,
                       "median": float(np.median(scores)) if scores else None,
                       "size": len(db.island(i)), "coverage": db.coverage(i, k)}
    return out


class EvolutionLoop:
    """Owns the run's components; ``run()`` executes (or resumes) the whole run."""

    def __init__(self, cfg: DictConfig, run_dir: Path, logger: Any = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.logger = logger
        seed_everything(int(cfg.seed))
        task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
        self.task = make_task(task_cfg.pop("name"), **task_cfg)
        device = resolve_device(cfg.device)
        self.precision = run_precision(self.run_dir, cfg.model.get("dtype") or "float32", device,
                                       cfg.model.get("cache_dir"), resume=bool(cfg.resume))
        log.info("precision: %s (%s)", self.precision.dtype, self.precision.reason)
        self.agent = ResearchAgent(cfg.model, device=device, seed=int(cfg.seed),
                                   precision=self.precision)
        ex = cfg.explore
        self.db = ProgramDatabase.from_config(ex, seed=int(cfg.seed))
        self.sandbox = Sandbox(self.task.evaluator_factory, self.task.evaluator_config(),
                               workers=int(ex.workers), timeout_s=float(self.task.timeout_s))
        log.info("sandbox isolation: %s", self.sandbox.isolation)
        self.threads = agent_thread_budget(cfg, self.sandbox)
        self.agent.thread_budget = self.threads
        self.explorer = Explorer(self.task, self.agent, self.sandbox, self.db, ex, int(cfg.seed))
        use_supporters = bool(cfg.method.supporters)
        self.supporters = (build_supporters(cfg.supporters, task_name=self.task.name,
                                            seed=int(cfg.seed)) if use_supporters else None)
        self.finetuner = FineTuner(self.agent, cfg.method, DPOConfig.from_cfg(cfg.dpo),
                                   GateConfig.from_cfg(cfg.gate), self.supporters,
                                   self.task.name, int(cfg.seed), explorer=self.explorer)
        self.telemetry = Telemetry(self.run_dir, logger)
        self.critiques: dict[int, str] = {}
        self.temperatures: dict[int, float] = {}
        self.next_round = 0
        self.started = time.time()
        self.wall_before = 0.0  # wall seconds spent before a resume

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"next_round": self.next_round, "db": self.db.state_dict(),
                "explorer": getattr(self.explorer, "state_dict", dict)(),
                "finetuner": self.finetuner.state_dict(), "adapters": adapter_snapshot(self.agent),
                "critiques": self.critiques, "temperatures": self.temperatures,
                "telemetry": self.telemetry.offsets(), "rng": checkpoint.rng_state(),
                "wall_seconds": self.wall_before + time.time() - self.started,
                "supporter_stats": self.supporters.stats() if self.supporters else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.db.load_state_dict(state["db"])
        if hasattr(self.explorer, "load_state_dict"):
            self.explorer.load_state_dict(state["explorer"])
        self.finetuner.load_state_dict(state["finetuner"])
        for name, tensors in state["adapters"].items():
            set_adapter_state(self.agent.model, name, tensors)
        self.critiques = {int(k): v for k, v in state["critiques"].items()}
        self.temperatures = {int(k): float(v) for k, v in state["temperatures"].items()}
        self.telemetry.truncate_to(state["telemetry"])
        checkpoint.set_rng_state(state["rng"])
        self.wall_before = float(state["wall_seconds"])
        if self.supporters is not None and state.get("supporter_stats"):
            self.supporters.load_stats(state["supporter_stats"])

    def save(self) -> None:
        checkpoint.save(self.run_dir, self.state_dict())

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ex = self.cfg.explore
        rounds, every = int(ex.rounds), int(ex.phase_every)
        state = checkpoint.load(self.run_dir) if self.cfg.resume else None
        if state is not None and state.get("finished") and (self.run_dir / "results.json").exists():
            log.info("%s already holds a finished run; set name=<new> for a new one", self.run_dir)
            return json.loads((self.run_dir / "results.json").read_text())
        if state is None and not self.cfg.resume and (self.run_dir / "results.json").exists():
            log.warning("resume=false: overwriting the run in %s", self.run_dir)
        if state is not None:
            self.load_state_dict(state)
            log.info("resumed from round %d", self.next_round)
        else:
            self.telemetry.truncate_to({})
            self.telemetry.event("config", config=OmegaConf.to_container(self.cfg, resolve=True),
                                 isolation=self.sandbox.isolation,
                                 precision=self.precision.to_dict())
            seeds = self.explorer.seed_islands(0)
            self.telemetry.programs(seeds)
            self.telemetry.event("seed", round=0, score=max(p.score for p in seeds),
                                 passed=all(p.passed for p in seeds))
            if not any(p.passed for p in seeds):
                raise RuntimeError(f"the seed program of task {self.task.name!r} fails: "
                                   f"{seeds[0].evaluation.failure_kind}: {seeds[0].evaluation.message}")
            self.next_round = 1
            self.save()
        progress = _progress(self.cfg, rounds, self.next_round - 1)
        try:
            for r in range(self.next_round, rounds + 1):
                self._round(r, every)
                self.next_round = r + 1
                self.save()
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(best=f"{_best(self.db):.4g}")
        finally:
            if progress is not None:
                progress.close()
        return self.finish()

    def _round(self, r: int, every: int) -> None:
        t0 = time.time()
        phase = (r - 1) // every + 1
        with torch_threads(self.threads()):
            programs = self.explorer.run_round(r, phase, critiques=self.critiques or None,
                                               temperature_overrides=self.temperatures or None)
        t_explore = time.time() - t0
        served = sorted({p.island for p in programs})
        if self.supporters is not None:
            programs += self._explore_support(served, r, phase)
        self.telemetry.programs(programs)
        agent_programs = [p for p in programs if p.source == "agent"]
        failures: dict[str, int] = {}
        for p in agent_programs:
            failures[p.evaluation.failure_kind] = failures.get(p.evaluation.failure_kind, 0) + 1
        self.telemetry.event(
            "round", round=r, phase=phase, islands_served=served,
            candidates=len(agent_programs),
            valid_rate=(sum(p.passed for p in agent_programs) / len(agent_programs)) if agent_programs else None,
            best=_best(self.db), round_best=max((p.score for p in programs if p.passed), default=None),
            failures=failures, islands=island_summary(self.db, int(self.cfg.explore.islands),
                                                      int(self.cfg.dpo.top_k)),
            seconds={"explore": t_explore, "total": time.time() - t0,
                     "generate": self.explorer.last_stats.get("generation_s"),
                     "evaluate_wait": self.explorer.last_stats.get("evaluate_wait_s")},
            agent_threads=self.explorer.last_stats.get("agent_threads"),
            scored_while_generating=self.explorer.last_stats.get("scored_while_generating"))
        if r % every == 0:
            self._phase(phase, r, every)

    def _explore_support(self, islands: list[int], r: int, phase: int) -> list[Program]:
        """ATLAS: critiques for the next prompt, patches evaluated as candidates, temperatures."""
        added: list[Program] = []
        for island in islands:
            request = supporter_requests.exploration_request(
                self.task, island, self.db.island(island),
                self.temperatures.get(island, self.explorer.temperature(island)))
            advice = self.supporters.exploration.advise(request)
            if advice.critique:
                self.critiques[island] = advice.critique
            if advice.temperature is not None:
                self.temperatures[island] = float(advice.temperature)
            parents = [p.id for p in self.db.top_k(island, 1)]
            for code in advice.patches:
                added.append(self.explorer.add_external(code, island, r, phase, "supporter", parents))
            self.telemetry.event("exploration", round=r, island=island, backend=advice.backend,
                                 fallback_cause=advice.fallback_cause, critique=advice.critique,
                                 patches=len(advice.patches), temperature=advice.temperature,
                                 patch_scores=[p.score for p in added[-len(advice.patches):]]
                                 if advice.patches else [])
        return added

    def _phase(self, phase: int, r: int, every: int) -> None:
        programs = [p for p in self.db.all_programs() if (r - every) < p.round <= r]
        before = [p.score for p in self.db.all_programs() if p.round <= r - every and p.passed]
        with torch_threads(self.threads()):  # DPO and the gate: every core workers leave free
            record = self.finetuner.run_phase(phase, programs, max(before, default=-math.inf),
                                              db=self.db, logger=self.logger)
        self.telemetry.event("phase", round=r, **record)

    def finish(self) -> dict[str, Any]:
        self.finetuner.flush_promotion()
        wall = self.wall_before + time.time() - self.started
        meta = {"task": self.task.name, "method": self.cfg.method.name, "seed": int(self.cfg.seed),
                "model": self.cfg.model.source, "isolation": self.sandbox.isolation,
                "dtype": self.precision.dtype, "dtype_reason": self.precision.reason,
                "wall_seconds": wall,
                "supporters": self.supporters.stats() if self.supporters else None}
        results = summarise(self.run_dir, meta)
        self.telemetry.event("end", results=results)
        tmp = self.run_dir / ".results.json.tmp"
        tmp.write_text(dumps(results) + "\n")
        os.replace(tmp, self.run_dir / "results.json")
        checkpoint.save(self.run_dir, {**self.state_dict(), "finished": True})
        return results

    def close(self) -> None:
        self.sandbox.close()
        self.telemetry.close()


def _best(db: ProgramDatabase) -> float:
    best = db.best()
    return best.score if best is not None else -math.inf


def _progress(cfg: DictConfig, total: int, done: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"{cfg.task.name}/{cfg.method.name}", unit="round")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but torch sees no GPU; use device=cpu or install CUDA torch")
    return device
