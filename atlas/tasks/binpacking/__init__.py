"""Online 1-D bin packing (FunSearch, Nature 2023): the agent writes ``priority(item, bins)``.

Host half: validates the config, builds the instance set once (generated Weibull sets, or an
OR-Library file) and ships it to the scorer inside the evaluator config, so the sandboxed
scorer never needs to read the user's file. Scoring: ``evaluator.py``; baselines (first fit,
best fit, FunSearch's published heuristic): ``python -m atlas.tasks.binpacking.baselines``.
"""

from __future__ import annotations

import copy
from typing import Any

from atlas.fields import check_known_fields, number
from atlas.tasks.base import PromptSpec, QualityMetric, Task
from atlas.tasks.binpacking.instances import Instance, read_orlib, weibull_instances

#: every config field with its default (conf/task/binpacking.yaml documents each one)
DEFAULTS: dict[str, Any] = {
    "instances": "weibull", "weibull_count": 5, "weibull_items": 5000, "weibull_shape": 3.0,
    "weibull_scale": 45.0, "weibull_capacity": 100, "weibull_seed": 0, "audit_steps": 32,
    "timeout_s": 60.0,
}

SEED_PROGRAM = '''import numpy as np


def priority(item, bins):
    """Best fit: the bin with the least space left after adding the item wins."""
    return -(bins - item)
'''


class BinPackingTask(Task):
    """Online bin packing scored by the excess of bins used over the L1 lower bound."""

    name = "binpacking"
    evaluator_factory = "atlas.tasks.binpacking.evaluator:make_scorer"  # trusted: replay, count
    runner_factory = "atlas.tasks.binpacking.evaluator:make_runner"  # untrusted: priority calls
    # excess_pct_<k> (per instance), l1_bound (fixed) and audited_steps are not quality
    quality_metrics = (
        QualityMetric("excess_pct", "min", "% bins used above the L1 bound (minus the score)"),
        QualityMetric("bins_used", "min", "mean bins used per instance"),
    )
    score_range = (-float("inf"), 0.0)  # no packing beats the L1 bound: excess >= 0
    fork_safe = True  # numpy only, no threads
    score_label = "-excess %"

    def __init__(self, **config: Any) -> None:
        check_known_fields(DEFAULTS, config, "task", label="binpacking task",
                           hint=" (see conf/task/binpacking.yaml)")
        merged = {**copy.deepcopy(DEFAULTS), **config}
        g = "task"
        for key in ("weibull_count", "weibull_items", "weibull_capacity", "weibull_seed",
                    "audit_steps"):
            merged[key] = number(g, key, merged[key], integer=True,
                                 low=0 if key in ("weibull_seed", "audit_steps") else 1)
        for key in ("weibull_shape", "weibull_scale"):
            merged[key] = number(g, key, merged[key], low=0, low_open=True)
        source = merged["instances"]
        if not isinstance(source, str) or not source:
            raise ValueError(f"task.instances={source!r} is invalid: use 'weibull' (generated "
                             f"sets) or the path of an OR-Library file, e.g. "
                             f"task.instances=/data/binpack3.txt")
        super().__init__(**merged)
        self.instances: list[Instance] = (
            weibull_instances(merged["weibull_count"], merged["weibull_items"],
                              shape=merged["weibull_shape"], scale=merged["weibull_scale"],
                              capacity=merged["weibull_capacity"], seed=merged["weibull_seed"])
            if source == "weibull" else read_orlib(source))

    def instance_set_label(self) -> str:
        """How reports name the instance set (e.g. 'Weibull 5 x 5000')."""
        if self.config["instances"] == "weibull":
            return f"Weibull {self.config['weibull_count']} x {self.config['weibull_items']}"
        return f"{self.config['instances']} ({len(self.instances)} instances)"

    def evaluator_config(self) -> dict[str, Any]:
        return {"instances": [i.to_json() for i in self.instances],
                "audit_steps": self.config["audit_steps"]}

    def prompt_spec(self) -> PromptSpec:
        cap = self.instances[0].capacity
        return PromptSpec(
            system="You are a research agent in combinatorial optimisation and online "
                   "bin packing.",
            problem=(
                f"Write priority(item, bins) for online 1-D bin packing. Items arrive one at "
                f"a time and are packed at once into bins of capacity {cap:g}. item: the "
                f"item's size (float). bins: numpy float array of the remaining capacity of "
                f"every bin the item fits in (empty bins have {cap:g} left). Return a numpy "
                f"array of the same shape: the item goes to the bin of highest priority. "
                f"Score: minus the % of bins used above the lower bound sum(items)/capacity "
                f"(higher is better; 0 is perfect)."),
            signature="def priority(item, bins):",
            entry_point="priority",
            hints=(
                "Best fit (-(bins - item)) is a strong start: prefer bins the item nearly fills.",
                "Avoid leaving gaps too small for any later item; open a new bin only if needed.",
                "Use numpy on the whole array, no Python loops; no random numbers.",
            ),
        )

    def seed_program(self) -> str:
        return SEED_PROGRAM


__all__ = ["DEFAULTS", "SEED_PROGRAM", "BinPackingTask"]
