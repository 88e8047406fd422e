"""The command lines of packages that sit low in the house: ``python -m atlas.sandbox``
(``sandbox.py``) and ``python -m atlas.tasks`` (``tasks.py``). A command composes a config
and builds a task, so it stands above the sandbox and the tasks it serves; each package's
``__main__`` only runs its command here by name.
"""

from __future__ import annotations

from typing import Any

from atlas.tasks import Task, build_task


def composed_task(command: str, overrides: list[str]) -> tuple[Any, Task]:
    """The config and the task that ``python -m atlas.<command> task=<name> [overrides]``
    names, composed as ``atlas.train`` would. ValueError or TypeError: a one-line cause."""
    from atlas.compose import compose  # deferred: Hydra, which only these commands need

    if not any(o.startswith("task=") for o in overrides):
        raise ValueError(f"name the task: python -m atlas.{command} task=<name> "
                         f"[hydra.searchpath=[pkg://<package>.conf]]")
    cfg = compose(overrides)
    return cfg, build_task(cfg)
