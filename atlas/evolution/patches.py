"""Programs from outside the agent: an exploration supporter's patches, scored and filed.

A patch is paid out of the next round's agent samples (one budget for every method), and is
written as a completion of the prompt the supporter reviewed, so D_k can take it as chosen
(``supporter_vs_agent``, ``atlas.evolution.preferences``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import Sandbox, outcome, regime_key
from atlas.evolution.extract import as_completion, extract_program
from atlas.evolution.prompts import prefill_of
from atlas.schema import ExploreConfig
from atlas.tasks.base import PromptSpec, Task
from atlas.types import Program, ProgramSource


@dataclasses.dataclass
class PatchFiling:
    """One island's supporter patches after the budget: filed, dropped, not writable."""

    programs: list[Program]
    dropped_for_budget: int = 0
    not_writable_as_completion: int = 0
    #: patches that repeat a program the run already has (``atlas.novelty``), with the id
    #: each repeats: not evaluated, filed or charged (``explore.copies=skip``)
    copies: list[int] = dataclasses.field(default_factory=list)


class Filer(Protocol):
    """What filing patches reads of the explorer: its task, sandbox, database, budget and
    its way to the sandbox (``Explorer.submit_code``: a copy may reuse an evaluation)."""

    task: Task
    sandbox: Sandbox
    db: ProgramDatabase
    settings: ExploreConfig
    spec: PromptSpec
    supporter_debt: int

    def round_budget(self) -> int: ...

    def submit_code(self, code: str | None, context: dict) -> Future: ...


def add_external(explorer: Filer, code: str, island: int, round_index: int, phase: int,
                 source: ProgramSource, parents: list[int], *, prompt: str = "",
                 completion: str = "") -> Program:
    """Evaluate and file a program from outside the agent (e.g. a supporter's patch).

    Without ``prompt``/``completion`` it cannot enter preference pairs (DPO needs the
    agent-side prompt); with them it can, e.g. as a supporter's proposed completion, and
    then the program evaluated is the one the completion yields after the prompt's
    prefill (exactly what the agent would have produced with those tokens).
    """
    return _submit(explorer, code, island, round_index, phase, source, parents,
                   prompt=prompt, completion=completion).file(explorer)


@dataclasses.dataclass
class _External:
    """A program from outside the agent on its way through the sandbox, filed once scored."""

    code: str | None
    context: dict
    future: Future
    island: int
    round: int
    phase: int
    source: ProgramSource
    parents: list[int]
    prompt: str
    completion: str

    def file(self, explorer: Filer) -> Program:
        """Wait for the score and add the program to the database (its id taken now)."""
        prog = Program(id=explorer.db.next_id(), island=self.island, round=self.round,
                       code=self.code or "", evaluation=outcome(self.future),
                       prompt=self.prompt, completion=self.completion,
                       parents=list(self.parents), source=self.source, phase=self.phase,
                       regime=regime_key(self.context))
        explorer.db.add(prog)
        return prog


def _submit(explorer: Filer, code: str, island: int, round_index: int, phase: int,
            source: ProgramSource, parents: list[int], *, prompt: str = "",
            completion: str = "") -> _External:
    islands, entry = explorer.settings.islands, explorer.spec.entry_point
    if not 0 <= island < islands:
        raise ValueError(f"add_external: island={island} is outside [0, {islands}) "
                         f"(explore.islands)")
    if bool(prompt) != bool(completion):
        raise ValueError("add_external: give both prompt and completion, or neither")
    if prompt:
        extracted = extract_program(prefill_of(prompt), completion, entry)
    else:
        extracted = extract_program("", code, entry)
    context = explorer.task.context(round_index)
    return _External(extracted, context, explorer.submit_code(extracted, context), island,
                     round_index, phase, source, parents, prompt, completion)


@dataclasses.dataclass
class PendingPatches:
    """One island's patches submitted to the sandbox (``submit_patches``); ``file`` waits
    for their scores and files them. Submitting every island's patches before filing any
    scores them in parallel on the sandbox's workers."""

    filing: PatchFiling
    pending: list[_External]

    def file(self, explorer: Filer) -> PatchFiling:
        self.filing.programs = [p.file(explorer) for p in self.pending]
        return self.filing


def submit_patches(explorer: Filer, patches: Sequence[str], island: int, round_index: int,
                   phase: int, prompt: str, *, as_preferences: bool,
                   last: bool) -> PendingPatches:
    """Send an exploration supporter's patches for ``island`` to the sandbox, within the
    budget; ``PendingPatches.file`` files them as ``supporter`` programs.

    Copies: with ``explore.copies=skip`` a patch within the budget that repeats a filed
    program is counted (``PatchFiling.copies``) and dropped uncharged, as the agent's are.
    Budget: each patch filed is taken from the next round's agent samples
    (``supporter_debt``), at most ``round_budget - islands_per_round`` of them so each
    island served next round keeps one sample; the last round has no next round, so its
    patches are dropped (counted). Supervision: a patch is written as a completion of
    ``prompt``, the prompt the island was served with this round (whose completions the
    supporter reviewed), and with ``as_preferences`` filed with it so D_k takes it as
    chosen (``supporter_vs_agent``); the program scored is the one that completion
    yields, with or without the switch, so the ablation scores the same code.
    """
    cap = explorer.round_budget() - explorer.settings.islands_per_round
    supporter = ProgramSource.SUPPORTER
    entry = explorer.spec.entry_point
    parents = [p.id for p in explorer.db.top_k(island, 1)]
    out = PendingPatches(filing=PatchFiling(programs=[]), pending=[])
    skip = explorer.settings.copies == "skip"
    for code in patches:
        if last or explorer.supporter_debt >= cap:
            out.filing.dropped_for_budget += 1
            continue
        of = explorer.db.copy_of(extract_program("", code, entry)) if skip else None
        if of is not None:
            out.filing.copies.append(of)
            continue
        completion = as_completion(prefill_of(prompt), code, entry) if prompt else None
        if completion is None:
            out.filing.not_writable_as_completion += 1
            job = _submit(explorer, code, island, round_index, phase, supporter, parents)
        elif as_preferences:
            job = _submit(explorer, code, island, round_index, phase, supporter, parents,
                          prompt=prompt, completion=completion)
        else:  # the ablation scores the very program the completion would have
            written = extract_program(prefill_of(prompt), completion, entry) or code
            job = _submit(explorer, written, island, round_index, phase, supporter, parents)
        out.pending.append(job)
        explorer.supporter_debt += 1
    return out
