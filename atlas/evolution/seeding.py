"""The task's seed program: scored once before the model loads, then filed in every island."""

from __future__ import annotations

import dataclasses

from atlas.evolution.database import ProgramDatabase
from atlas.evolution.evaluation import Sandbox, outcome, regime_key
from atlas.messages import cause
from atlas.tasks.base import Task
from atlas.tasks.errors import TaskError
from atlas.types import Evaluation, FailureKind, Program, ProgramSource


def score_seed(task: Task, sandbox: Sandbox, round_index: int = 0) -> Evaluation:
    """The task's seed program scored in ``sandbox``; a ``TaskError`` (one line: the cause
    and the fix) when it fails, since then the task or its scorer is broken, not the agent."""
    ev = outcome(sandbox.submit(task.seed_program(), task.context(round_index)))
    if not ev.passed:
        blame = ("its scorer raised" if ev.failure_kind == FailureKind.TASK_ERROR.value
                 else "fix its seed_program, scorer or runner")
        raise TaskError(f"the seed program of task {task.name!r} fails ({ev.failure_kind}: "
                        f"{cause(ev.message)}); {blame}; `python -m atlas.tasks check "
                        f"task={task.name}` shows the whole message")
    return ev


def seed_islands(task: Task, sandbox: Sandbox, db: ProgramDatabase, round_index: int = 0,
                 evaluation: Evaluation | None = None) -> list[Program]:
    """File the task's seed program in every island of ``db`` (evaluated once, one copy per
    island).

    ``evaluation``: the seed's, when it was scored already (``score_seed``, before the
    model loaded). Raises when the seed fails: every prompt would then start from
    nothing, which means the task or the sandbox is broken, not the agent.
    """
    code = task.seed_program()
    context = task.context(round_index)
    ev = evaluation if evaluation is not None else score_seed(task, sandbox, round_index)
    out = []
    for island in range(db.num_islands):
        prog = Program(id=db.next_id(), island=island, round=round_index, code=code,
                       evaluation=dataclasses.replace(ev, metrics=dict(ev.metrics)),
                       source=ProgramSource.SEED, phase=0, regime=regime_key(context))
        db.add(prog)
        out.append(prog)
    return out
