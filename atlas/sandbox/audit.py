"""What a task's runner does that the sandbox would refuse: its system calls and the files it
opens outside what a runner may read (``python -m atlas.sandbox audit``, ``atlas.tasks
check``).

Why: the filter is an allow-list of calls and the runner's view of the host an allow-list of
code (``view.py``); a task whose runner needs more fails with ``blocked`` or a missing file
that names neither cause. The audit runs the seed program in the sandbox a run uses, with a
filter that lets every call through and reports it, and an audit hook in the runner that
reports every path it opens outside its view.
"""

from __future__ import annotations

import os
from typing import Any

from atlas.sandbox.pool import Sandbox
from atlas.sandbox.seccomp import ALLOWED, CMD_CHECKED, CMD_REFUSED, PID_CHECKED
from atlas.sandbox.settings import Confinement, Resources
from atlas.types import Evaluation


def audit_seed(task: Any, isolation: str = "auto") -> Evaluation:
    """The seed program's evaluation under the auditing sandbox: its metrics hold
    ``syscall:<name>`` (count) and ``path:<path>`` (opened outside the view)."""
    with Sandbox.for_task(task, resources=Resources(workers=1),
                          confinement=Confinement(isolation=isolation, audit=True)) as sb:
        return sb.evaluate(task.seed_program(), task.context(1))


def calls(ev: Evaluation) -> dict[str, int]:
    """The system calls an audited runner made, with their counts."""
    return {k.split(":", 1)[1]: int(v) for k, v in ev.metrics.items()
            if k.startswith("syscall:")}


def unallowed_calls(ev: Evaluation, task: Any) -> list[str]:
    """The calls of ``calls(ev)`` the sandbox refuses unless the task lists them."""
    allowed = {*ALLOWED, *PID_CHECKED, *CMD_CHECKED, *CMD_REFUSED, *task.syscalls, "clone",
               "sendmsg", "close"}
    return sorted(set(calls(ev)) - allowed)


def unreadable_paths(ev: Evaluation) -> list[str]:
    """Files an audited runner opened that exist on the host but lie outside what a runner
    may read (the task needs them; its runner cannot read them)."""
    return sorted(p for k in ev.metrics if k.startswith("path:")
                  if os.path.exists(p := k.split(":", 1)[1]))
