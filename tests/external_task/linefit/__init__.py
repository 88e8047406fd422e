"""Host half of the linefit example task (docs/tasks.md).

A task outside atlas: this class, a scoring module (``scoring.py``: trusted scorer and
untrusted runner) and a YAML config in ``conf/task/``. Run it with
``PYTHONPATH=<parent of linefit> python -m atlas.train task=linefit
hydra.searchpath=[pkg://linefit.conf]``.
"""

from __future__ import annotations

from typing import Any

from atlas.fields import check_known_fields, number
from atlas.tasks.base import PromptSpec, QualityMetric, Task

#: every config field with its default (conf/task/linefit.yaml documents each one)
DEFAULTS: dict[str, Any] = {"problems": 4, "points": 64, "noise": 0.5, "timeout_s": 20.0}

SEED_PROGRAM = '''import numpy as np


def fit(xs, ys):
    """A flat line through the mean: a first guess to improve on."""
    return 0.0, float(np.mean(ys))
'''


class LineFitTask(Task):
    """Fit a hidden line from noisy points; the score is minus the parameter error."""

    name = "linefit"
    evaluator_factory = "linefit.scoring:make_scorer"  # trusted: holds the hidden lines
    runner_factory = "linefit.scoring:make_runner"  # untrusted: calls fit()
    quality_metrics = (QualityMetric("mse", "min", "squared error of (a, b), mean over lines"),)
    score_range = (-float("inf"), 0.0)  # minus a squared error
    fork_safe = True  # numpy only
    score_label = "-MSE"

    def __init__(self, **config: Any) -> None:
        check_known_fields(DEFAULTS, config, "task", label="linefit task",
                           hint=" (see linefit/conf/task/linefit.yaml)")
        merged = {**DEFAULTS, **config}
        merged["problems"] = number("task", "problems", merged["problems"], integer=True, low=1)
        merged["points"] = number("task", "points", merged["points"], integer=True, low=2)
        merged["noise"] = number("task", "noise", merged["noise"], low=0)
        super().__init__(**merged)  # the base class reads timeout_s

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(
            system="You are a research agent in statistics.",
            problem=(f"Write fit(xs, ys) that estimates a and b of the line y = a*x + b from "
                     f"{self.config['points']} noisy points (numpy arrays). Return a tuple of "
                     f"two floats (a, b). Score: minus the squared error of (a, b)."),
            signature="def fit(xs, ys):",
            entry_point="fit",
            hints=("Least squares: np.polyfit(xs, ys, 1) returns (a, b).",),
        )

    def seed_program(self) -> str:
        return SEED_PROGRAM
