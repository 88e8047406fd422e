"""Programs from outside the agent: an exploration supporter's patches, scored and filed.

A patch is paid out of the next round's agent samples (one budget for every method), and is
written as a completion of the prompt the supporter reviewed, so D_k can take it as chosen
(``supporter_vs_agent``, ``atlas.evolution.preferences``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import Sandbox, outcome, regime_key, submit
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


class Filer(Protocol):
    """What filing patches reads of the explorer: its task, sandbox, database and budget."""

    task: Task
    sandbox: Sandbox
    db: ProgramDatabase
    settings: ExploreConfig
    spec: PromptSpec
    supporter_debt: int

    def round_budget(self) -> int: ...


def add_external(explorer: Filer, code: str, island: int, round_index: int, phase: int,
                 source: ProgramSource, parents: list[int], *, prompt: str = "",
                 completion: str = "") -> Program:
    """Evaluate and file a program from outside the agent (e.g. a supporter's patch).

    Without ``prompt``/``completion`` it cannot enter preference pairs (DPO needs the
    agent-side prompt); with them it can, e.g. as a supporter's proposed completion, and
    then the program evaluated is the one the completion yields after the prompt's
    prefill (exactly what the agent would have produced with those tokens).
    """
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
    ev = outcome(submit(explorer.sandbox, extracted, context))
    prog = Program(id=explorer.db.next_id(), island=island, round=round_index,
                   code=extracted or "", evaluation=ev, prompt=prompt,
                   completion=completion, parents=list(parents), source=source, phase=phase,
                   regime=regime_key(context))
    explorer.db.add(prog)
    return prog


def file_patches(explorer: Filer, patches: Sequence[str], island: int, round_index: int,
                 phase: int, prompt: str, *, as_preferences: bool, last: bool) -> PatchFiling:
    """Score and file an exploration supporter's patches for ``island`` as ``supporter``
    programs, within the budget.

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
    out = PatchFiling(programs=[])
    for code in patches:
        if last or explorer.supporter_debt >= cap:
            out.dropped_for_budget += 1
            continue
        completion = as_completion(prefill_of(prompt), code, entry) if prompt else None
        if completion is None:
            out.not_writable_as_completion += 1
            prog = add_external(explorer, code, island, round_index, phase, supporter, parents)
        elif as_preferences:
            prog = add_external(explorer, code, island, round_index, phase, supporter, parents,
                                prompt=prompt, completion=completion)
        else:  # the ablation scores the very program the completion would have
            written = extract_program(prefill_of(prompt), completion, entry) or code
            prog = add_external(explorer, written, island, round_index, phase, supporter,
                                parents)
        out.programs.append(prog)
        explorer.supporter_debt += 1
    return out
