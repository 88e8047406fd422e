"""Online 1-D bin packing (FunSearch, Nature 2023): the agent writes ``priority(item, bins)``.

Host half: validates the config. An OR-Library file is read here and shipped to the scorer
inside the evaluator config (the sandboxed scorer never reads the user's file); generated
Weibull sets are drawn by the scorer from the run secret, so that no candidate can regenerate
the scored set from the public config and carry an offline packing of it. Scoring: ``evaluator.py``; baselines (first fit,
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
        #: an OR-Library file's instances (public by nature); None for generated Weibull sets,
        #: which the scorer draws from the run secret (``scored_instances``)
        self.instances: list[Instance] | None = (
            None if source == "weibull" else read_orlib(source))

    def weibull_params(self) -> dict[str, Any]:
        """The generated sets' parameters (``weibull_instances`` keywords)."""
        c = self.config
        return {"count": c["weibull_count"], "n_items": c["weibull_items"],
                "shape": c["weibull_shape"], "scale": c["weibull_scale"],
                "capacity": c["weibull_capacity"], "seed": c["weibull_seed"]}

    def scored_instances(self, secret: str | None, program: str | None = None
                         ) -> list[Instance]:
        """The instances a run with ``secret`` scores: the file's, or the Weibull sets drawn
        from the secret (None: the public draw of the baselines command) and, for a program's
        own, its key (``atlas.sandbox.inputs.program_key``: what the scorer draws)."""
        if self.instances is not None:
            return self.instances
        return weibull_instances(**self.weibull_params(), secret=secret,
                                 program=program if secret else None)

    def instance_set_label(self) -> str:
        """How reports name the instance set (e.g. 'Weibull 5 x 5000')."""
        if self.instances is None:
            return f"Weibull {self.config['weibull_count']} x {self.config['weibull_items']}"
        return f"{self.config['instances']} ({len(self.instances)} instances)"

    def evaluator_config(self) -> dict[str, Any]:
        if self.instances is None:  # the scorer draws them from the run secret
            return {"weibull": self.weibull_params(), "audit_steps": self.config["audit_steps"]}
        return {"instances": [i.to_json() for i in self.instances],
                "audit_steps": self.config["audit_steps"]}

    def prompt_spec(self) -> PromptSpec:
        cap = (float(self.config["weibull_capacity"]) if self.instances is None
               else self.instances[0].capacity)
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
