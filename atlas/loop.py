"""The self-evolution loop: rounds of exploration, a fine-tuning phase every F rounds.

Read top to bottom, this is the algorithm (paper 2.1-2.2, App. B.1):

    seed every island with the task's seed program
    for round r:
        the equation changed (PINN: a new phase's viscosity)? re-score the incumbents on it
        producer samples programs from the agent; consumers score them in the sandbox
        (atlas) exploration supporter reviews the islands just served: critique for their next
            prompt, patches scored as completions of the prompt it reviewed (they enter D_k);
            every patch is paid out of the next round's agent samples (equal budgets)
        every F rounds: phase k = FineTuner.run_phase (D_k, DPO, C_k, gate, promotion)
        checkpoint atomically (a crash loses at most the round in flight)
    write results.json
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from atlas import checkpoint
from atlas.agent.adapters import PEFT_FOLDERS, REF, export_peft, set_adapter_state
from atlas.agent.device import resolve_device
from atlas.agent.precision import run_precision
from atlas.agent.research_agent import ResearchAgent
from atlas.atomic import write_text_atomic
from atlas.config import Settings
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import regime_key
from atlas.evolution.explorer import Copy, Explorer
from atlas.evolution.literals import LiteralSearch
from atlas.evolution.seeding import score_seed
from atlas.fine_tuning import FineTuner, PhaseSettings, adapter_snapshot
from atlas.novelty import tally
from atlas.provenance import LoadMeter, provenance
from atlas.results import summarise
from atlas.runfolder import new_folder_hint
from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.secret import fingerprint, run_secret, sweep_secret_file
from atlas.supporters import make_supporters
from atlas.supporters import requests as supporter_requests
from atlas.supporters.config import ExplorationConfig
from atlas.telemetry import Telemetry, dumps
from atlas.types import Program, ProgramSource

log = logging.getLogger("atlas.loop")
ADAPTERS = "adapters"  # the run folder's take-away adapters (EvolutionLoop.export_adapters)


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


def agent_thread_budget(fixed: int | None, sandbox: Sandbox) -> Callable[[], int]:
    """Torch threads for the agent at any moment: the cores that sandbox workers are not
    scoring on right now (each busy worker holds one core; oversubscribed OpenMP threads
    spin-wait on each other and slow everything many times over), at least one.
    ``fixed`` (``explore.agent_threads``) fixes the number instead."""
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
    """Owns the run's components; ``run()`` executes (or resumes) the whole run.

    ``settings``: the validated config (``atlas.config.validate``); each component takes its
    group. ``config``: the composed config as plain data, recorded as the run's first event.
    """

    def __init__(self, settings: Settings, config: Mapping[str, Any], run_dir: Path,
                 logger: Any = None) -> None:
        self.settings = settings
        self.config = config
        self.run_dir = Path(run_dir)
        self.logger = logger
        run, seed, ex = settings.run, settings.run.seed, settings.explore
        seed_everything(seed)
        self.task = settings.task
        secret_file = settings.sandbox.secret_file or sweep_secret_file()
        create = settings.sandbox.create_secret or not settings.sandbox.secret_file
        secret = run_secret(self.run_dir, secret_file, create=create)
        self.secret_fingerprint = fingerprint(secret)  # in results: reports check pairing
        self.sandbox = Sandbox.for_task(
            self.task, secret=secret,
            resources=Resources(workers=ex.sandbox_workers(usable_cores())),
            confinement=Confinement(isolation=settings.sandbox.isolation, hide=(
                str(self.run_dir), *([str(secret_file)] if secret_file else []))))
        log.info("sandbox isolation: %s", self.sandbox.isolation)
        # a broken task stops the run here, before the model loads (a resumed run has its seed)
        resuming = run.resume and (self.run_dir / "checkpoint" / checkpoint.FILENAME).exists()
        try:
            self.seed_evaluation = None if resuming else score_seed(self.task, self.sandbox)
        except BaseException:
            self.sandbox.close()
            raise
        method = settings.method
        self.db = ProgramDatabase(ex, seed, entry_point=self.task.prompt_spec().entry_point)
        self.threads = agent_thread_budget(ex.agent_threads, self.sandbox)
        # the research agent; the control without an LLM (method.writer) never loads a model
        self.precision = self.agent = self.finetuner = None
        if method.uses_llm:
            device = resolve_device(run.device)
            self.precision = run_precision(self.run_dir, settings.model.dtype, device,
                                           settings.model.cache_dir, resume=run.resume)
            log.info("precision: %s (%s)", self.precision.dtype, self.precision.reason)
            self.agent = ResearchAgent(settings.model, device=device, seed=seed,
                                       precision=self.precision)
            self.agent.thread_budget = self.threads
        self.explorer = Explorer(self.task, self.agent, self.sandbox, self.db, ex, seed,
                                 writer=None if method.uses_llm else LiteralSearch())
        self.supporters = (make_supporters(settings.supporters, seed=seed)
                           if settings.supporters else None)
        if method.fine_tune:
            phase = PhaseSettings(method, settings.dpo, settings.gate, settings.probe)
            self.finetuner = FineTuner(self.agent, phase, seed, supporters=self.supporters,
                                       explorer=self.explorer,
                                       quality_metrics=self.task.quality_metrics)
        self.entry_point = self.task.prompt_spec().entry_point
        self.telemetry = Telemetry(self.run_dir, logger, entry_point=self.entry_point)
        self.critiques: dict[int, str] = {}
        self._patch_copies: list[int] = []  # this round's supporter patches that were copies
        self.temperatures: dict[int, float] = {}
        self.next_round = 0
        self.regime = regime_key(self.task.context(0))  # the equation scores are compared on
        self.started = time.time()
        self.load = LoadMeter()
        self.wall_before = 0.0  # wall seconds spent before a resume
        self.resumed_at: list[int] = []  # the rounds this run was resumed at (a marked run)

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"next_round": self.next_round, "db": self.db.state_dict(),
                "finetuner": self.finetuner.state_dict() if self.finetuner else None,
                "adapters": adapter_snapshot(self.agent) if self.agent else {},
                "critiques": self.critiques, "temperatures": self.temperatures,
                "copies": [dataclasses.asdict(c) for c in self.explorer.copies],
                "regime": self.regime, "supporter_debt": self.explorer.supporter_debt,
                "telemetry": self.telemetry.offsets(), "rng": checkpoint.rng_state(),
                "wall_seconds": self.wall_before + time.time() - self.started,
                "resumed_at": self.resumed_at,
                "supporter_stats": self.supporters.stats() if self.supporters else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.db.load_state_dict(state["db"])
        for name, tensors in (state["adapters"] if self.agent else {}).items():
            set_adapter_state(self.agent.model, name, tensors)
        if self.finetuner is not None:  # after the adapters: it may promote
            self.finetuner.load_state_dict(state["finetuner"])
        self.critiques = {int(k): v for k, v in state["critiques"].items()}
        self.explorer.copies = [Copy(**c) for c in state.get("copies", [])]
        self.temperatures = {int(k): float(v) for k, v in state["temperatures"].items()}
        self.regime = str(state.get("regime", self.regime))
        self.explorer.supporter_debt = int(state.get("supporter_debt", 0))
        self.telemetry.truncate_to(state["telemetry"])
        checkpoint.set_rng_state(state["rng"])
        self.wall_before = float(state["wall_seconds"])
        self.resumed_at = [int(r) for r in state.get("resumed_at", [])]
        if self.supporters is not None and state.get("supporter_stats"):
            self.supporters.load_stats(state["supporter_stats"])

    def save(self) -> None:
        checkpoint.save(self.run_dir, self.state_dict())

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ex, resume = self.settings.explore, self.settings.run.resume
        rounds, every = ex.rounds, ex.phase_every
        state = checkpoint.load(self.run_dir) if resume else None
        if state is not None and state.get("finished") and (self.run_dir / "results.json").exists():
            log.info("%s already holds a finished run; set %s for a new one", self.run_dir,
                     new_folder_hint())
            return json.loads((self.run_dir / "results.json").read_text())
        if state is None and not resume and (self.run_dir / "results.json").exists():
            log.warning("resume=false: overwriting the run in %s", self.run_dir)
        if state is not None:
            self.load_state_dict(state)
            self.resumed_at.append(self.next_round)
            log.info("resumed from round %d", self.next_round)
        else:
            self.telemetry.truncate_to({})
            self.telemetry.event("config", config=self.config, entry_point=self.entry_point,
                                 isolation=self.sandbox.isolation,
                                 precision=self.precision.to_dict() if self.precision else None)
            seeds = self.explorer.seed_islands(0, evaluation=self.seed_evaluation)
            self.telemetry.programs(seeds)
            self.telemetry.event("seed", round=0, score=max(p.score for p in seeds),
                                 passed=all(p.passed for p in seeds))
            if not any(p.passed for p in seeds):
                raise RuntimeError(f"the seed program of task {self.task.name!r} fails: "
                                   f"{seeds[0].evaluation.failure_kind}: {seeds[0].evaluation.message}")
            self.next_round = 1
            self.save()
        progress = (_progress(f"{self.task.name}/{self.settings.method.name}", rounds,
                              self.next_round - 1) if self.settings.run.progress else None)
        try:
            for r in range(self.next_round, rounds + 1):
                self._round(r, every)
                self.next_round = r + 1
                self.save()
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(best=f"{self._best_now():.4g}")
        finally:
            if progress is not None:
                progress.close()
        return self.finish()

    def _round(self, r: int, every: int) -> None:
        """Round ``r`` as the module docstring reads: re-score on a new equation, explore,
        let the exploration supporter review the islands served (ATLAS), log, every F rounds
        a fine-tuning phase."""
        t0 = time.time()
        phase = (r - 1) // every + 1
        self._enter_regime(r, phase)
        if self.agent is not None:
            self.agent.check_device(f"round {r}")
        with torch_threads(self.threads()):
            programs = self.explorer.run_round(r, phase, critiques=self.critiques or None,
                                               temperature_overrides=self.temperatures or None,
                                               agent_samples=self.explorer.agent_samples())
        t_explore = time.time() - t0
        served = sorted({p.island for p in programs})
        self._patch_copies: list[int] = []
        if self.supporters is not None:
            programs += self._explore_support(served, r, phase, programs,
                                              last=r == self.settings.explore.rounds)
        self.telemetry.programs(programs)
        self.telemetry.event("round", **self._round_event(r, phase, served, programs, t0,
                                                          t_explore))
        if r % every == 0 and self.finetuner is not None:  # a control never fine-tunes
            self._phase(phase, r, every)

    def _round_event(self, r: int, phase: int, served: list[int], programs: list[Program],
                     t0: float, t_explore: float) -> dict[str, Any]:
        """The ``round`` event's fields (keys and their order are part of the file format)."""
        agent_programs = [p for p in programs if p.source == ProgramSource.AGENT]
        failures: dict[str, int] = {}
        for p in agent_programs:
            failures[p.evaluation.failure_kind] = failures.get(p.evaluation.failure_kind, 0) + 1
        stats = self.explorer.last_stats
        assert stats is not None  # run_round just ran
        return {
            "round": r, "phase": phase, "islands_served": served,
            "candidates": len(agent_programs), "budget": self.explorer.round_budget(),
            "supporter_candidates": sum(1 for p in programs
                                        if p.source == ProgramSource.SUPPORTER),
            "next_round_agent_samples": self.explorer.next_agent_samples(),
            "valid_rate": (sum(p.passed for p in agent_programs) / len(agent_programs))
            if agent_programs else None,
            "best": self._best_now(),
            "round_best": max((p.score for p in programs if p.passed), default=None),
            "failures": failures,
            "islands": island_summary(self.db, self.settings.explore.islands,
                                      self.settings.dpo.top_k),
            "seconds": {"explore": t_explore, "total": time.time() - t0,
                        "generate": stats.generation_s, "evaluate_wait": stats.evaluate_wait_s},
            "agent_threads": stats.agent_threads, "device": stats.device,
            "attention": self.agent.attention if self.agent else None,
            "batched_islands": stats.batched_islands,
            "scored_while_generating": stats.scored_while_generating,
            "sampler": stats.sampler,
            "evaluations_reused": self.explorer.evaluations_reused,
            # novelty (atlas.novelty): every agent proposal, the copies that were not evaluated
            # among them, and the re-asks that replaced them
            "proposals": len(agent_programs) + len(stats.copies),
            "novelty": {
                "agent": tally([p.to_dict() for p in agent_programs],
                               [c.to_event() for c in stats.copies]),
                "supporter": tally([p.to_dict() for p in programs
                                    if p.source == ProgramSource.SUPPORTER],
                                   self._patch_copies)},
            "retries": stats.retries, "retry_samples": stats.retry_samples,
            "copies": [c.to_event() for c in stats.copies]}

    def _explore_support(self, islands: list[int], r: int, phase: int,
                         round_programs: list[Program], last: bool) -> list[Program]:
        """ATLAS: the exploration supporter reviews each island served: a critique for its
        next prompt, a temperature, and patches the explorer files within the budget
        (``atlas.evolution.patches``) as completions of the prompt the island was served.
        Every island's patches go to the sandbox before any is waited for, so they are
        scored side by side; they are filed in island order, as one after another would."""
        exploration = self.settings.supporters["exploration"]
        assert isinstance(exploration, ExplorationConfig)  # role_configs builds it so
        reviews = []
        for island in islands:
            request = supporter_requests.exploration_request(
                self.task, island, self.db.island(island),
                self.temperatures.get(island, self.explorer.temperature(island)),
                self.settings.explore.temperature_bounds)
            advice = self.supporters.exploration.advise(request)
            if advice.critique:
                self.critiques[island] = advice.critique
            if advice.temperature is not None:
                self.temperatures[island] = float(advice.temperature)
            prompt = next((p.prompt for p in round_programs if p.island == island and p.prompt),
                          "")
            reviews.append((island, advice, self.explorer.submit_patches(
                advice.patches, island, r, phase, prompt,
                as_preferences=exploration.as_preferences, last=last)))
        added: list[Program] = []
        for island, advice, pending in reviews:
            filed = pending.file(self.explorer)
            added += filed.programs
            self._patch_copies += filed.copies
            self.telemetry.event("exploration", round=r, island=island, backend=advice.backend,
                                 fallback_cause=advice.fallback_cause, critique=advice.critique,
                                 patches=len(filed.programs),
                                 patches_dropped_for_budget=filed.dropped_for_budget,
                                 as_preferences=sum(1 for p in filed.programs if p.prompt),
                                 not_writable_as_completion=filed.not_writable_as_completion,
                                 copies=filed.copies,
                                 temperature=advice.temperature,
                                 patch_scores=[p.score for p in filed.programs])
        return added

    # -- like-for-like scores under a drifting equation -------------------------------------
    def _best_now(self) -> float:
        """Best passed score on the equation in force (scores on others do not compare)."""
        return self.db.best_score(self.regime)

    def _enter_regime(self, r: int, phase: int) -> None:
        """When round ``r`` scores on a new equation, re-score the incumbents on it
        (``ProgramDatabase.incumbents``), so initial, final, the skip test and Figure 2
        compare programs on one equation."""
        new = regime_key(self.task.context(r))
        if new == self.regime:
            return
        picks = self.db.incumbents(self.regime)  # (the original program, its score before)
        rescored = self.explorer.rescore([p for p, _ in picks], r, phase)
        self.telemetry.programs(rescored)
        self.telemetry.event("regime", round=r, phase=phase, previous=json.loads(self.regime),
                             regime=json.loads(new),
                             rescored=[{"id": q.id, "of": p.id, "source": p.source,
                                        "score_before": before,
                                        "score": q.score if q.passed else None}
                                       for (p, before), q in zip(picks, rescored)])
        self.regime = new

    def _phase(self, phase: int, r: int, every: int) -> None:
        """Fine-tune on this phase's candidates; the skip test (App. B.4) compares their best
        with the best before the phase *on the same equation* (incl. re-scored incumbents)."""
        everything = self.db.all_programs()
        programs = [p for p in everything
                    if (r - every) < p.round <= r and p.source != ProgramSource.RESCORE]
        before = [p.score for p in everything if p.passed and p.regime == self.regime
                  and (p.round <= r - every or p.source == ProgramSource.RESCORE)]
        assert self.finetuner is not None and self.agent is not None  # _round checked
        with torch_threads(self.threads()):  # DPO and the gate: every core workers leave free
            copies = [c for c in self.explorer.copies if (r - every) < c.round <= r]
            record = self.finetuner.run_phase(phase, programs, max(before, default=-math.inf),
                                              db=self.db, logger=self.logger, copies=copies)
        self.agent.check_device(f"phase {phase}")
        self.telemetry.event("phase", round=r, **record.to_event())

    def finish(self) -> dict[str, Any]:
        wall = self.wall_before + time.time() - self.started
        meta = {"task": self.task.name, "method": self.settings.method.name,
                "seed": self.settings.run.seed, "model": self.settings.model.source if self.agent else None,
                "isolation": self.sandbox.isolation,
                "isolation_reason": self.sandbox.isolation_reason,
                "isolation_gaps": self.sandbox.isolation_gaps,
                "sandbox_workers": self.sandbox.workers,
                "dtype": self.precision.dtype if self.precision else None,
                "dtype_reason": self.precision.reason if self.precision else
                "no model: method.writer=" + self.settings.method.writer,
                "wall_seconds": wall, "resumed_at": self.resumed_at, "score_label": self.task.score_label,
                "secret_fingerprint": self.secret_fingerprint,
                "supporters": self.supporters.stats() if self.supporters else None,
                "provenance": self.provenance(),
                "load": self.load.record()}
        if self.finetuner is not None:  # a control's adapters were never trained
            self.export_adapters()
        results = summarise(self.run_dir, meta)
        self.telemetry.event("end", results=results)
        write_text_atomic(self.run_dir / "results.json", dumps(results) + "\n")
        checkpoint.save(self.run_dir, {**self.state_dict(), "finished": True})
        return results

    def export_adapters(self) -> None:
        """The run's trained policy and its last promoted reference, to take away:
        ``adapters/policy`` and ``adapters/reference`` (PEFT folders over the base model that
        ``adapters/base_model.json`` names; EvoTune's reference is the base model itself, and
        its ``reference`` folder is the untrained adapter, which changes nothing)."""
        folder = self.run_dir / ADAPTERS
        export_peft(self.agent.model, folder)
        m = self.settings.model
        base = {k: getattr(m, k) for k in ("source", "name_or_path", "hidden_size", "num_layers",
                                           "num_heads")}
        reference = (self.finetuner.reference_state.current
                     if self.settings.method.reference == "adaptive" else "base")
        write_text_atomic(folder / "base_model.json", dumps(
            {"base_model": {**base, "dtype": self.precision.dtype},
             "folders": {PEFT_FOLDERS[REF]: f"the reference: {reference}",
                         "policy": "the policy after the last phase"}}) + "\n")

    def provenance(self) -> dict[str, Any]:
        """This process's record (``atlas.provenance``) with the device and dtype the agent
        used; a method without an LLM (``method.writer``) ran on the CPU with no model."""
        return provenance(self.agent.device if self.agent else "cpu",
                          self.precision.dtype if self.precision else "none")

    def close(self) -> None:
        self.sandbox.close()
        self.telemetry.close()


def _progress(desc: str, total: int, done: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=desc, unit="round")

