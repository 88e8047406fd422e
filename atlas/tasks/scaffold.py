"""A new task package to start from: ``python -m atlas.tasks new <name>`` writes the files of
``template/`` with the task's name in them (task class, scorer and runner, YAML, a test that runs
the checker), so a task author edits a package that already passes the contract."""

from __future__ import annotations

import importlib.util
import keyword
import re
from pathlib import Path

from atlas.tasks import TASKS

TEMPLATE = Path(__file__).with_name("template")
#: template file -> path in the new package ({name}: the task's name)
FILES = {
    "init.py.txt": "{name}/__init__.py",
    "scoring.py.txt": "{name}/scoring.py",
    "conf_init.py.txt": "{name}/conf/__init__.py",
    "task.yaml.txt": "{name}/conf/task/{name}.yaml",
    "test_task.py.txt": "{name}/test_task.py",
}


def class_name(name: str) -> str:
    """``my_task`` -> ``MyTaskTask``: the scaffold's Task subclass."""
    return "".join(part.capitalize() for part in name.split("_") if part) + "Task"


def scaffold(name: str, where: Path) -> list[Path]:
    """Write the package ``where/<name>/``; the files written. ValueError: a one-line cause."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ValueError(f"task name {name!r} is invalid: use a Python package name "
                         f"(lowercase letters, digits, _), e.g. my_task")
    if name in TASKS:
        raise ValueError(f"task name {name!r} is a built-in task's; choose another name")
    target = where / name
    if target.exists():
        raise ValueError(f"{target} exists; choose another name or --dir")
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        raise ValueError(f"a module named {name!r} is importable already ({found.origin}); "
                         f"choose another name, or the new package would be shadowed")
    written = []
    for template, path in FILES.items():
        text = (TEMPLATE / template).read_text()
        out = where / path.format(name=name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text.replace("__NAME__", name).replace("__CLASS__", class_name(name)))
        written.append(out)
    return written
