"""Producer/consumer exploration rounds (paper 2.1).

The *producer* (this process) picks islands round-robin, builds each island's prompt from its
coverage-aware top programs, and samples completions from the agent; the *consumers* are the
sandbox's worker processes, which evaluate candidates while the producer is already generating
for the next island (``sandbox.submit`` returns a future at once).

Determinism: ids are assigned when a candidate is created, and results are filed in the
database in id order (the longest completed prefix is filed after each island's generation,
the rest at the end of the round), so clustering and buffer eviction do not depend on which
worker finished first. A candidate whose exact code already passed on its regime takes that
evaluation (``explore.reuse_evaluations``), and a round reuses only what was filed before it
began, for the same reason.

The other ways a program is scored and filed live beside it, one concept a module: the seed
(``seeding``), a supporter's patches (``patches``), incumbents on a new equation
(``rescoring``), and the sandbox round trip they all share (``evaluation``); the explorer's
methods of those names hand over to them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import Sandbox, done, outcome, regime_key, reused, submit
from atlas.evolution.extract import extract_program
from atlas.evolution.patches import (
    PendingPatches,
    add_external,
    submit_patches,
)
from atlas.evolution.prompts import build_prompt, prefill_of, prompt_hash
from atlas.evolution.rescoring import rescore
from atlas.evolution.seeding import seed_islands
from atlas.schema import ExploreConfig
from atlas.tasks.base import Task
from atlas.types import Evaluation, FailureKind, Program, ProgramSource

#: generation stops at a closing fence on its own line (the prefill opened the fence)
STOP = ["\n```"]
#: a re-ask's seed is the island's round seed plus this times the attempt
RETRY_SALT = 104_729


def split_samples(total: int, islands: int) -> list[int]:
    """``total`` samples over ``islands`` prompts as evenly as possible, earlier islands first."""
    base, extra = divmod(max(0, total), islands)
    return [base + (1 if j < extra else 0) for j in range(islands)]


class Agent(Protocol):
    def chat_prompt(self, system: str, user: str, prefill: str) -> str: ...

    def generate(self, prompts: list[str], num_samples: int, *, temperature: float, top_p: float,
                 max_new_tokens: int, stop: Sequence[str] | None, adapter: str | None,
                 seed: int) -> list[list[str]]: ...
    # optional: ``streams_results = True`` and ``generate(..., on_done=callback(row, text))``


@dataclasses.dataclass
class IslandStats:
    """What one island of a round sampled and how its candidates fared."""

    temperature: float
    samples: int
    critique: bool
    valid: int = 0
    failure_kinds: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RoundStats:
    """What one exploration round measured: the ``round`` event's timing and device fields."""

    round: int
    phase: int
    islands: dict[int, IslandStats] = dataclasses.field(default_factory=dict)
    generation_s: float = 0.0
    scored_while_generating: int = 0
    evaluate_wait_s: float = 0.0  # sandbox time not hidden behind generation
    agent_threads: int | None = None
    device: str | None = None
    batched_islands: bool = False
    wall_s: float = 0.0
    sampler: dict | None = None  # ``SampleStats.add_to`` over the round's decode calls
    #: agent proposals that repeated a program (``explore.copies=skip``): recorded, not
    #: evaluated, filed or charged (``Copy``), and the extra draws that replaced them
    copies: list[Copy] = dataclasses.field(default_factory=list)
    retries: int = 0
    retry_samples: int = 0


@dataclasses.dataclass
class Copy:
    """An agent proposal that repeats program ``of`` (``atlas.novelty``): kept for the
    records (the round event) and the lazy-output pairs, never evaluated."""

    island: int
    round: int
    phase: int
    of: int
    parents: list[int]
    code: str
    completion: str
    prompt: str
    attempt: int  # 0: the round's first draw; k: its k-th re-ask

    def to_event(self) -> dict[str, Any]:
        """The round event's record (the prompt is the island's, named by its hash)."""
        d = dataclasses.asdict(self)
        d["prompt"] = prompt_hash(self.prompt) if self.prompt else ""
        return d


class Writer(Protocol):
    """Writes a round's candidates for an island from its parents, without a prompt."""

    def write(self, parents: Sequence[Program], samples: int, seed: int) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A completion written outside the rounds (``Explorer.write_unfiled``), its extracted
    program (None: no code) and the sandbox's evaluation of it."""

    completion: str
    code: str | None
    evaluation: Evaluation


@dataclasses.dataclass
class IslandPlan:
    """What a round samples for one island: its prompt, parents, temperature and seed."""

    island: int
    parents: list[Program]
    prefill: str
    text: str
    temperature: float
    samples: int
    seed: int


class Explorer:
    """Runs exploration rounds: prompts -> samples -> extraction -> sandbox -> database."""

    def __init__(self, task: Task, agent: Agent | None, sandbox: Sandbox, db: ProgramDatabase,
                 settings: ExploreConfig, seed: int, writer: Writer | None = None) -> None:
        """``writer``: writes the candidates instead of the agent (``method.writer``; the
        control without an LLM, ``atlas.evolution.literals``); then ``agent`` may be None."""
        if agent is None and writer is None:
            raise ValueError("the explorer needs an agent or a writer of candidates")
        self.writer = writer
        self.settings = settings
        if db.num_islands != self.settings.islands:
            raise ValueError(f"the database has {db.num_islands} islands but explore.islands="
                             f"{self.settings.islands}; build it with the same explore config")
        self.task, self.agent, self.sandbox, self.db, self.seed = task, agent, sandbox, db, seed
        self.spec = task.prompt_spec()
        self.last_stats: RoundStats | None = None  # the latest round's
        self.supporter_debt = 0  # supporter programs the next round's agent samples pay for
        self.evaluations_reused = 0  # this round's candidates that took an earlier evaluation
        self.copies: list[Copy] = []  # every agent proposal not evaluated as a copy, in order

    # ---- scheduling -----------------------------------------------------------------------
    def islands_for_round(self, round_index: int) -> list[int]:
        """Round-robin: round r serves islands r*m .. r*m+m-1 (mod the number of islands)."""
        n, m = self.settings.islands, self.settings.islands_per_round
        start = (round_index * m) % n
        return [(start + j) % n for j in range(m)]

    def temperature(self, island: int, overrides: Mapping[int, float] | None = None) -> float:
        """The island's sampling temperature; an override is clamped to temperature_bounds."""
        temp = self.settings.temperatures[island]
        if overrides and island in overrides:
            value = float(overrides[island])
            if math.isfinite(value):
                lo, hi = self.settings.temperature_bounds
                temp = min(max(value, lo), hi)
        return temp

    def _generation_seed(self, round_index: int, island: int) -> int:
        return (self.seed * 1_000_003 + round_index * 1_009 + island) % (2**31 - 1)

    def _file(self, pending: list[tuple[Program, Future]], out: list[Program], block: bool) -> None:
        """File the longest finished prefix of ``pending`` (all of it when ``block``), in id
        order."""
        while pending and (block or pending[0][1].done()):
            prog, fut = pending.pop(0)
            prog.evaluation = outcome(fut)
            self.db.add(prog)
            out.append(prog)

    # ---- public API -----------------------------------------------------------------------
    def seed_islands(self, round_index: int = 0, evaluation: Evaluation | None = None
                     ) -> list[Program]:
        """File the task's seed program in every island (``atlas.evolution.seeding``)."""
        return seed_islands(self.task, self.sandbox, self.db, round_index, evaluation)

    def parents_for(self, island: int) -> list[Program]:
        """The island's coverage-aware top programs; the global best if the island is empty."""
        parents = self.db.top_k(island, self.settings.programs_in_prompt)
        if not parents:
            best = self.db.best()
            parents = [best] if best is not None else []
        return parents

    def prompt_for(self, parents: Sequence[Program]) -> str:
        """The chat prompt that shows ``parents`` (no critique), as an island's is built."""
        return self.agent.chat_prompt(*build_prompt(self.spec, list(parents), None,
                                                    self.settings.prompt_form))

    def island_prompt(self, island: int) -> str:
        """The prompt ``island`` would be served next, without a critique."""
        return self.prompt_for(self.parents_for(island))

    def round_budget(self) -> int:
        """Evaluated candidates one round may spend: ``islands_per_round * samples_per_prompt``
        (supporter programs are paid out of it, so every method evaluates as many)."""
        return self.settings.islands_per_round * self.settings.samples_per_prompt

    def agent_samples(self) -> int:
        """This round's agent completions: the round budget less the supporter programs filed
        since the last round (each patch is paid out of the next round's samples, so every
        method evaluates as many candidates); settles that debt."""
        samples, self.supporter_debt = self.round_budget() - self.supporter_debt, 0
        return samples

    def next_agent_samples(self) -> int:
        """The agent completions the next round keeps after the patches filed so far."""
        return self.round_budget() - self.supporter_debt

    def submit_code(self, code: str | None, context: dict[str, Any],
                    among_first: int | None = None) -> Future:
        """``code`` on its way to the sandbox; with ``explore.reuse_evaluations`` a copy of a
        program that already passed on this regime (among the first ``among_first`` filed)
        takes that evaluation instead, and counts in ``evaluations_reused``."""
        if code is not None and self.settings.reuse_evaluations:
            prior = self.db.scored(code, regime_key(context), among_first)
            if prior is not None:
                self.evaluations_reused += 1
                return done(reused(prior.evaluation))
        return submit(self.sandbox, code, context)

    def run_round(self, round_index: int, phase: int, critiques: dict[int, str] | None = None,
                  temperature_overrides: dict[int, float] | None = None,
                  agent_samples: int | None = None) -> list[Program]:
        """One producer/consumer round; returns its new programs in id order.

        ``agent_samples``: completions this round over all served islands (default
        ``round_budget()``; the loop passes less when supporter programs already spent part
        of it), split evenly; each served island gets at least one.
        """
        s, critiques = self.settings, critiques or {}
        context = self.task.context(round_index)
        served = self.islands_for_round(round_index)
        total = self.round_budget() if agent_samples is None else int(agent_samples)
        if total < len(served):
            raise ValueError(f"agent_samples={total} leaves an island of round {round_index} "
                             f"without samples; it must be >= islands_per_round={len(served)}")
        counts = dict(zip(served, split_samples(total, len(served))))
        # reuse only what was filed before the round: what this round files meanwhile depends
        # on which worker finished first, and a run must not
        self.evaluations_reused, filed = 0, len(self.db)
        pending: list[tuple[Program, Future]] = []
        out: list[Program] = []
        stats = RoundStats(round=round_index, phase=phase)
        t_round = time.perf_counter()
        batched = s.batch_islands and len(served) > 1 and hasattr(self.agent, "generate_batch")
        skip = s.copies == "skip" and self.writer is None
        proposed: dict[str, int] = {}  # this round's proposals so far: program key -> row id
        copied: list[int] = []
        # batched: every island's prompt first, one decode for all; else one island at a time
        # (each island's prompt reads the database as the islands before it left it)
        for group in ([served] if batched else [[i] for i in served]):
            plans = [self._plan(island, counts[island], critiques, temperature_overrides,
                                round_index) for island in group]
            for attempt in range(1 + (s.copy_retries if skip else 0)):
                if attempt:  # ask again for as many programs as were copies, fresh seeds
                    plans = [dataclasses.replace(
                        plan, samples=n, seed=(plan.seed + attempt * RETRY_SALT) % (2**31 - 1))
                        for plan, n in zip(plans, copied) if n]
                    if not plans:
                        break
                    stats.retries += 1
                    stats.retry_samples += sum(p.samples for p in plans)
                copied = self._propose(plans, context, filed, stats, pending, out, phase,
                                       round_index, critiques, proposed, skip, attempt)
            self._file(pending, out, block=False)  # file what finished while we generated
        t_wait = time.perf_counter()
        self._file(pending, out, block=True)
        stats.evaluate_wait_s = time.perf_counter() - t_wait
        last = getattr(self.agent, "last_stats", None)
        stats.agent_threads = getattr(last, "threads", None)
        stats.device = getattr(last, "device", None) or None
        stats.batched_islands = batched
        for island, row in stats.islands.items():
            mine = [p for p in out if p.island == island]
            row.valid = sum(p.passed for p in mine)
            row.failure_kinds = dict(Counter(p.evaluation.failure_kind for p in mine))
        stats.wall_s = time.perf_counter() - t_round
        self.copies += stats.copies
        self.last_stats = stats
        return out

    def _propose(self, plans: list[IslandPlan], context: dict[str, Any], filed: int,
                 stats: RoundStats, pending: list[tuple[Program, Future]], out: list[Program],
                 phase: int, round_index: int, critiques: Mapping[int, str],
                 proposed: dict[str, int], skip: bool, attempt: int) -> list[int]:
        """Sample ``plans`` and send each new program to the sandbox in row order; with
        ``skip``, a copy (of a filed program, a parent or an earlier proposal of the round)
        is recorded in ``stats.copies`` instead. Returns the copies per plan."""
        regime = regime_key(context)
        t0 = time.perf_counter()
        finished = self._generate(plans, context, filed, skip=skip)
        stats.generation_s += time.perf_counter() - t0
        if hasattr(getattr(self.agent, "last_stats", None), "add_to"):
            stats.sampler = self.agent.last_stats.add_to(stats.sampler)
        copied = []
        for plan, (completions, early) in zip(plans, finished):
            stats.scored_while_generating += len(early)
            copies = 0
            for row, completion in enumerate(completions):
                fut: Future | None
                if row in early and early[row][0] == completion:
                    _, code, fut = early[row]
                elif self.writer is not None:  # the writer's text is the program
                    code, fut = completion or None, None
                else:
                    code = extract_program(plan.prefill, completion, self.spec.entry_point)
                    fut = None
                of = self._copy_of(code, plan.parents, proposed) if skip else None
                if of is not None:
                    copies += 1
                    stats.copies.append(Copy(
                        island=plan.island, round=round_index, phase=phase, of=of,
                        parents=[p.id for p in plan.parents], code=code or "",
                        completion=completion, prompt=plan.text, attempt=attempt))
                    continue  # an evaluation already under way is left unread
                if fut is None:
                    fut = self.submit_code(code, context, filed)
                prog = Program(id=self.db.next_id(), island=plan.island, round=round_index,
                               code=code or "",
                               evaluation=Evaluation.failure(FailureKind.KILLED, "pending"),
                               prompt=plan.text,
                               completion=completion if self.writer is None else "",
                               parents=[p.id for p in plan.parents],
                               source=ProgramSource.AGENT, phase=phase, regime=regime)
                if code:
                    proposed.setdefault(self.db.novelty.key(code), prog.id)
                pending.append((prog, fut))
            copied.append(copies)
            row_stats = stats.islands.get(plan.island)
            if row_stats is None:
                stats.islands[plan.island] = IslandStats(
                    temperature=plan.temperature, samples=len(completions),
                    critique=bool(critiques.get(plan.island)))
            else:
                row_stats.samples += len(completions)
        return copied

    def _copy_of(self, code: str | None, parents: Sequence[Program],
                 proposed: Mapping[str, int]) -> int | None:
        """The program ``code`` repeats: one filed or shown, or an earlier proposal of the
        round (which may still be in the sandbox)."""
        if not code:
            return None
        of = self.db.copy_of(code, parents)
        return of if of is not None else proposed.get(self.db.novelty.key(code))

    def _plan(self, island: int, samples: int, critiques: Mapping[int, str],
              overrides: Mapping[int, float] | None, round_index: int) -> IslandPlan:
        parents = self.parents_for(island)
        if self.writer is not None:  # no prompt: the writer reads the parents themselves
            prefill = text = ""
        else:
            system, user, prefill = build_prompt(self.spec, parents, critiques.get(island),
                                                 self.settings.prompt_form)
            text = self.agent.chat_prompt(system, user, prefill)
        return IslandPlan(island=island, parents=parents, prefill=prefill, text=text,
                          temperature=self.temperature(island, overrides), samples=samples,
                          seed=self._generation_seed(round_index, island))

    def _generate(self, plans: list[IslandPlan], context: dict[str, Any], filed: int,
                  skip: bool = False
                  ) -> list[tuple[list[str], dict[int, tuple[str, str | None, Future]]]]:
        """Sample every plan's completions (one batch when there are several); a sample
        that ends early goes to the sandbox while the others still decode, unless (``skip``)
        it repeats a filed program or a parent."""
        # deferred: peft and transformers are slow to import, and a scripted agent needs neither
        from atlas.agent.adapters import POLICY
        from atlas.agent.sampling import Request

        s = self.settings
        early: list[dict[int, tuple[str, str | None, Future]]] = [{} for _ in plans]
        if self.writer is not None:
            return [(self.writer.write(p.parents, p.samples, p.seed), {}) for p in plans]
        starts = [0]
        for plan in plans:
            starts.append(starts[-1] + plan.samples)

        def score_now(row: int, completion: str) -> None:
            j = next(k for k in range(len(plans)) if row < starts[k + 1])
            code = extract_program(plans[j].prefill, completion, self.spec.entry_point)
            if skip and self.db.copy_of(code, plans[j].parents) is not None:
                return  # a copy: decided, and recorded, in row order
            early[j][row - starts[j]] = (completion, code, self.submit_code(code, context, filed))

        streams = {"on_done": score_now} if getattr(self.agent, "streams_results", False) \
            else {}
        if len(plans) == 1:
            plan = plans[0]
            texts = self.agent.generate(
                [plan.text], plan.samples, temperature=plan.temperature, top_p=s.top_p,
                max_new_tokens=s.max_new_tokens, stop=STOP, adapter=POLICY, seed=plan.seed,
                **streams)
        else:
            texts = self.agent.generate_batch(
                [Request(p.text, p.samples, p.temperature, p.seed) for p in plans],
                top_p=s.top_p, max_new_tokens=s.max_new_tokens, stop=STOP, adapter=POLICY,
                **streams)
        return list(zip(texts, early))

    def write_unfiled(self, prompts: Sequence[str], samples: int, *, temperature: float,
                      seed: int, context: dict[str, Any], adapter: str | None,
                      known: Mapping[str, Evaluation] | None = None) -> list[list[Attempt]]:
        """``samples`` completions per prompt from ``adapter``, each scored in the sandbox
        under ``context`` and filed nowhere (the on-line inspector's and the learning probe's
        programs: they are not candidates, so neither the database nor the budget sees them).
        A sample that ends early is scored while the others still decode; with
        ``explore.reuse_evaluations``, a copy of a program that passed on this regime, or of
        one in ``known`` (code -> its passing evaluation under ``context``), takes that
        evaluation. Deterministic for a given ``seed``: the same seed, prompts and ``samples``
        draw the same random numbers under any policy (common random numbers)."""
        s, entry, filed = self.settings, self.spec.entry_point, len(self.db)
        prefills = [prefill_of(p) for p in prompts]
        early: dict[int, tuple[str, str | None, Future]] = {}

        def submit_one(code: str | None) -> Future:
            if s.reuse_evaluations and known and code in known:
                return done(reused(known[code]))
            return self.submit_code(code, context, filed)

        def score_now(row: int, completion: str) -> None:
            code = extract_program(prefills[row // samples], completion, entry)
            early[row] = (completion, code, submit_one(code))

        streams = {"on_done": score_now} if getattr(self.agent, "streams_results", False) \
            else {}
        texts = self.agent.generate(list(prompts), samples, temperature=temperature,
                                    top_p=s.top_p, max_new_tokens=s.max_new_tokens, stop=STOP,
                                    adapter=adapter, seed=seed, **streams)
        pending = []
        for j, completions in enumerate(texts):
            row_out = []
            for i, completion in enumerate(completions):
                hit = early.get(j * samples + i)
                if hit is not None and hit[0] == completion:
                    _, code, fut = hit
                else:
                    code = extract_program(prefills[j], completion, entry)
                    fut = submit_one(code)
                row_out.append((completion, code, fut))
            pending.append(row_out)
        return [[Attempt(completion, code, outcome(fut)) for completion, code, fut in row]
                for row in pending]

    def add_external(self, code: str, island: int, round_index: int, phase: int,
                     source: ProgramSource, parents: list[int], *, prompt: str = "",
                     completion: str = "") -> Program:
        """Evaluate and file a program from outside the agent (``atlas.evolution.patches``)."""
        return add_external(self, code, island, round_index, phase, source, parents,
                            prompt=prompt, completion=completion)

    def submit_patches(self, patches: Sequence[str], island: int, round_index: int, phase: int,
                       prompt: str, *, as_preferences: bool, last: bool) -> PendingPatches:
        """A supporter's patches sent to the sandbox; ``.file(explorer)`` files them."""
        return submit_patches(self, patches, island, round_index, phase, prompt,
                              as_preferences=as_preferences, last=last)

    def rescore(self, programs: Sequence[Program], round_index: int, phase: int
                ) -> list[Program]:
        """Score filed programs again on round ``round_index``'s equation
        (``atlas.evolution.rescoring``)."""
        return rescore(self.task, self.sandbox, self.db, programs, round_index, phase)
