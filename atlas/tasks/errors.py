"""What a run raises when the task itself is broken, not the agent.

A module of its own, not ``atlas.tasks.base``: the contract is imported by every sandbox
worker and runner, which must not load Hydra for an exception only the main process raises.
"""

from __future__ import annotations

from hydra.errors import CompactHydraException


class TaskError(RuntimeError, CompactHydraException):
    """The task itself is broken (its seed program fails, its scorer raised): the message
    names the cause and the fix; on the command line it is one line, not a traceback."""
