"""A bandit task whose runner reads a file outside its package (atlas's conf/task/bandit.yaml)
at start, for the checker's test: the sandbox does not let a runner read it, and
``atlas.tasks check`` must name it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atlas.tasks.bandit import BanditTask
from atlas.tasks.bandit.evaluator import make_runner as bandit_runner

OUTSIDE = str(Path(__file__).resolve().parents[1] / "conf" / "task" / "bandit.yaml")


def make_runner(config: dict[str, Any]) -> Any:
    """The bandit runner, after reading ``OUTSIDE`` (as a task reading its data might)."""
    try:
        with open(OUTSIDE) as fh:
            fh.read()
    except OSError:
        pass
    return bandit_runner(config)


class ReadingTask(BanditTask):
    """Bandit, with ``make_runner`` above as its runner."""

    runner_factory = "tests.reading_task:make_runner"
