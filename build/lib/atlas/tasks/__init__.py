"""Task registry and builder: ``task=<name>`` in the config resolves here.

A task is a ``Task`` subclass in any importable package plus a YAML config. Its YAML names the
class with Hydra's ``_target_`` (``_target_: mypkg.MyTask``); the built-in tasks may omit it,
their name is looked up in ``TASKS`` (so run folders recorded before ``_target_`` existed
resume unchanged). Either way the task is built with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from atlas.tasks.base import PromptSpec, QualityMetric, Task

#: built-in task name -> its class (``_target_``); other tasks name their class in their YAML
TASKS: dict[str, str] = {
    "bandit": "atlas.tasks.bandit.BanditTask",
    "pinn": "atlas.tasks.pinn.PinnTask",
    "binpacking": "atlas.tasks.binpacking.BinPackingTask",
}

_FIX = ("set task=<a known task>, or give your task's YAML `_target_: <package.module.Class>` "
        "(README: \"Add your own task\")")


def task_target(config: Mapping[str, Any]) -> str:
    """The class path a task config builds: its ``_target_``, else the built-in of its name."""
    target = config.get("_target_")
    if target is not None:
        if not isinstance(target, str) or "." not in target:
            raise ValueError(f"task._target_={target!r} is invalid: use the import path of a "
                             f"Task subclass, e.g. mypkg.tasks.MyTask")
        return target
    name = config.get("name")
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is unknown and the task config has no _target_; "
                         f"known tasks: {sorted(TASKS)}; {_FIX}")
    return TASKS[name]


def task_class(config: Mapping[str, Any]) -> type[Task]:
    """Import the task's class, with errors that name ``task._target_`` and the fix."""
    target = task_target(config)
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task._target_={target!r} cannot be imported ({exc}); install or "
                         f"path-add its package (e.g. PYTHONPATH=/path/to/parent) or fix the "
                         f"name") from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"task._target_={target!r} is not a subclass of atlas.tasks.base.Task")
    return cls


def make_task(name: str | None = None, **config: Any) -> Task:
    """Build a task from its config (``make_task(**cfg.task)`` or ``make_task("bandit")``)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    config = {k: v for k, v in config.items()}
    if name is not None:
        config["name"] = name
    cls = task_class(config)
    target = f"{cls.__module__}.{cls.__qualname__}"
    config.pop("_target_", None)
    task_name = config.pop("name", None)
    if task_name is not None and task_name != getattr(cls, "name", task_name):
        raise ValueError(f"task.name={task_name!r} but {target} is the task "
                         f"{cls.name!r}; set task.name={cls.name} in its YAML")
    # _convert_=all: the task receives plain dicts/lists, never OmegaConf nodes
    try:
        return instantiate({"_target_": target, "_convert_": "all", **config})
    except InstantiationException as exc:
        # Hydra wraps the task's own error; its message already names the field and the fix
        if isinstance(exc.__cause__, (TypeError, ValueError)):
            raise exc.__cause__ from None
        raise


__all__ = ["PromptSpec", "QualityMetric", "Task", "TASKS", "make_task", "task_class",
           "task_target"]
