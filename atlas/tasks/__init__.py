"""Task registry: ``task=<name>`` in the config resolves here."""

from __future__ import annotations

import importlib
from typing import Any

from atlas.tasks.base import PromptSpec, Task

#: name -> "module:Class"; add a line to register a new task
TASKS: dict[str, str] = {
    "bandit": "atlas.tasks.bandit:BanditTask",
    "pinn": "atlas.tasks.pinn:PinnTask",
}


def make_task(name: str, **config: Any) -> Task:
    """Build a task by name, with an error that lists the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (config field task.name); known tasks: "
                         f"{sorted(TASKS)}. Register a new one in atlas/tasks/__init__.py:TASKS.")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**config)


__all__ = ["PromptSpec", "Task", "TASKS", "make_task"]
