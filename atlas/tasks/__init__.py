"""Task registry and builder: ``task=<name>`` in the config resolves here.

A task is a ``Task`` subclass in any importable package plus a YAML config. Its YAML names the
class with Hydra's ``_target_`` (``_target_: mypkg.MyTask``); the built-in tasks may omit it,
their name is looked up in ``TASKS`` (so run folders whose recorded config has no ``_target_``
resume unchanged). Either way the task is built with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import math
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
        "(docs/tasks.md)")


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
    check_task_class(cls)
    return cls


def check_task_class(cls: type[Task]) -> None:
    """Check what the sandbox and the loop read from a Task subclass, before any model loads:
    the required attributes, their types, and that both factories name a function that exists.

    Why here: a typo in ``evaluator_factory`` otherwise surfaces inside a sandbox worker, after
    the model loaded, as a failure of the seed program.
    """
    where = f"{cls.__module__}.{cls.__qualname__}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} has no `name`: set the class attribute name = \"<task>\" "
                         f"(the name its YAML gives as task.name)")
    factory = getattr(cls, "evaluator_factory", None)
    if factory is None:
        raise ValueError(f"{where} has no `evaluator_factory`: set it to the import path of "
                         f"its scorer's factory, e.g. \"mypkg.scoring:make_scorer\"")
    check_factory(f"{where}.evaluator_factory", factory)
    runner = getattr(cls, "runner_factory", None)
    if runner is None:
        raise ValueError(f"{where} has no `runner_factory`: add a runner, the untrusted half "
                         f"that calls the program, e.g. runner_factory = "
                         f"\"mypkg.scoring:make_runner\" (see docs/tasks.md)")
    check_factory(f"{where}.runner_factory", runner)
    metrics = getattr(cls, "quality_metrics", ())
    if not isinstance(metrics, tuple) or not all(isinstance(m, QualityMetric) for m in metrics):
        raise ValueError(f"{where}.quality_metrics={metrics!r} is invalid: use a tuple of "
                         f"QualityMetric(name, 'max' | 'min', description)")
    score_range = getattr(cls, "score_range", None)
    try:
        lo, hi = (float(v) for v in score_range)  # type: ignore[union-attr]
        ok = not (math.isnan(lo) or math.isnan(hi)) and lo < hi
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{where}.score_range={score_range!r} is invalid: use (low, high) with "
                         f"low < high, e.g. (-float('inf'), 0.0) for minus a loss")


def check_factory(field: str, path: Any) -> None:
    """``path`` is ``"package.module:function"`` and the module defines ``function``.

    The module is found, not imported: a scorer's module may import JAX or start threads,
    which the main process must not do; its top-level names are read from its source.
    """
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(f"{field}={path!r} is invalid: use an import path "
                         f"'package.module:function'")
    module, _, attr = path.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        spec, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = f"no module named {module!r}"
    if spec is None:
        raise ValueError(f"{field}={path!r}: {why}; fix the module path, or path-add its "
                         f"package (PYTHONPATH=/path/to/parent)")
    folder = _found_only_in_cwd(module)
    if folder:
        raise ValueError(f"{field}={path!r}: {module.split('.')[0]} is importable here only "
                         f"because it is in the current folder, and the sandbox's scorer "
                         f"processes start in another one; run with PYTHONPATH={folder}")
    names = _top_level_names(spec.origin)
    if names is not None and attr not in names:
        close = difflib.get_close_matches(attr, sorted(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{field}={path!r}: {spec.origin} defines no {attr!r}{hint}; fix the "
                         f"name after the colon")


def _found_only_in_cwd(module: str) -> str | None:
    """The current folder when ``module``'s package is found there only because Python puts
    it first on ``sys.path`` (``python -m``), not through ``PYTHONPATH`` or an install: the
    sandbox's processes, started elsewhere, would not find it. None otherwise."""
    import os
    import sys

    top = module.split(".")[0]
    cwd = os.getcwd()
    if top == "atlas":  # the sandbox path-adds atlas itself (isolation.python_env)
        return None
    if not sys.path or os.path.abspath(sys.path[0] or cwd) != cwd:
        return None
    if not (os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, f"{top}.py"))):
        return None
    declared = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    if cwd in declared:
        return None
    for entry in sys.path[1:]:  # found again further on (an install): the sandbox finds it too
        base = os.path.abspath(entry or cwd)
        if base != cwd and (os.path.isdir(os.path.join(base, top))
                            or os.path.isfile(os.path.join(base, f"{top}.py"))):
            return None
    return cwd


def _top_level_names(origin: str | None) -> set[str] | None:
    """Names a Python source file binds at module level; None when that cannot be read off
    the source (not a .py file, a star import, a syntax error the import will report)."""
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), origin)
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


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
    if task_name is not None and task_name != cls.name:
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


def build_task(cfg: Any) -> Task:
    """The task a run of the composed config ``cfg`` builds (``cfg.task`` resolved, fields
    checked by the task's class): the one builder for ``atlas.config.validate``,
    ``atlas.score``, ``python -m atlas.tasks check`` and ``python -m atlas.sandbox``."""
    from omegaconf import OmegaConf  # deferred: sandbox workers import this package

    return make_task(**OmegaConf.to_container(cfg.task, resolve=True))


__all__ = ["PromptSpec", "QualityMetric", "Task", "TASKS", "build_task",
           "check_factory", "check_task_class", "make_task", "task_class", "task_target"]
