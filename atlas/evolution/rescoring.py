"""Incumbents scored again on a new equation (the PINN's next viscosity)."""

from __future__ import annotations

from collections.abc import Sequence

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import Sandbox, outcome, regime_key, submit
from atlas.tasks.base import Task
from atlas.types import Program, ProgramSource


def rescore(task: Task, sandbox: Sandbox, db: ProgramDatabase, programs: Sequence[Program],
            round_index: int, phase: int) -> list[Program]:
    """Score already-filed programs again under round ``round_index``'s context and
    archive the results as ``source="rescore"`` (``parents=[original id]``) without
    putting them in island buffers: they measure an incumbent on the new equation, they
    are not new candidates and cost no exploration budget."""
    context = task.context(round_index)
    futures = [(p, submit(sandbox, p.code, context)) for p in programs]
    out = []
    for p, fut in futures:
        prog = Program(id=db.next_id(), island=p.island, round=round_index, code=p.code,
                       evaluation=outcome(fut), parents=[p.id],
                       source=ProgramSource.RESCORE, phase=phase, regime=regime_key(context))
        db.add(prog, buffer=False)
        out.append(prog)
    return out
