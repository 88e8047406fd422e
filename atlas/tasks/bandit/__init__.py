"""Host half of the non-stationary contextual bandit task (paper 3.1, App. B.2.1, B.3.1).

``BanditTask(**cfg.task)`` validates the config eagerly (a typo fails at start-up, not inside a
sandbox worker), tells the agent about the task in a few lines, and hands out the seed policy.
The environment and the scoring live in ``env.py`` / ``evaluator.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from atlas.fields import check_known_fields
from atlas.tasks.bandit.env import BanditConfig
from atlas.tasks.bandit.evaluator import check_env_seeds
from atlas.tasks.base import PromptSpec, QualityMetric, Task

#: every config field with its default (conf/task/bandit.yaml documents each one)
DEFAULTS: dict[str, Any] = {**BanditConfig().to_dict(), "env_seeds": [0, 1, 2, 3],
                            "timeout_s": 20.0}


def _plain(value: Any) -> Any:
    """Hydra hands over ListConfig; the worker needs plain JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


class BanditTask(Task):
    """Drifting linear contextual bandit; candidates implement ``policy(contexts, history, t,
    state) -> int`` and are scored by negative mean regret over fixed environment seeds."""

    name = "bandit"
    evaluator_factory = "atlas.tasks.bandit.evaluator:make_scorer"  # trusted: hidden envs
    runner_factory = "atlas.tasks.bandit.evaluator:make_runner"  # untrusted: the policy
    # nmr_std (spread over environments) and seconds are not quality: never compared
    quality_metrics = (
        QualityMetric("nmr", "max", "negative mean regret over the environments (the score)"),
        QualityMetric("regret_first_half", "min", "mean regret over the first half"),
        QualityMetric("regret_second_half", "min", "mean regret over the second half"),
        QualityMetric("mean_reward", "max", "mean reward collected"),
        QualityMetric("optimal_rate", "max", "fraction of steps the best arm was played"),
    )
    score_range = (-float("inf"), 0.0)  # regret >= 0 at every step: the oracle scores 0
    fork_safe = True
    score_label = "NMR"

    def __init__(self, **config: Any) -> None:
        name = config.pop("name", self.name)
        if name != self.name:
            raise ValueError(f"task.name={name!r} but BanditTask is {self.name!r}; use "
                             f"task=bandit or the task class registered for {name!r}")
        check_known_fields(DEFAULTS, config, "task", label="bandit task",
                           hint=" (see conf/task/bandit.yaml)")
        merged = {**copy.deepcopy(DEFAULTS), **{k: _plain(v) for k, v in config.items()}}
        self.env_config = BanditConfig(**{f.name: merged[f.name] for f in fields(BanditConfig)})
        check_env_seeds(merged["env_seeds"])
        super().__init__(**merged)  # checks and sets timeout_s, as for every task

    def prompt_spec(self) -> PromptSpec:
        k, d, horizon = self.env_config.K, self.env_config.d, self.env_config.T
        return PromptSpec(
            system="You are a research agent in online learning and contextual bandits.",
            problem=(
                f"Write policy(contexts, history, t, state) for a {k}-armed linear bandit "
                f"whose hidden theta drifts over {horizon} steps. contexts: numpy array "
                f"({k}, {d}), one unit vector per arm. reward = x . theta + noise. history: "
                f"list of (arm, x, reward) of past steps. state: dict kept between calls. "
                f"Return an int arm in [0, {k}). Score: minus the mean regret (higher is "
                f"better)."),
            signature="def policy(contexts, history, t, state):",
            entry_point="policy",
            hints=(
                "Old data is stale: tune window, alpha and reg (or use a discount).",
                "Rewards are noisy: too short a window gives a noisy theta.",
                "Keep running sums in state to stay fast; use numpy only.",
            ),
        )

    def seed_program(self) -> str:
        return Path(__file__).with_name("seed_policy.py").read_text()


__all__ = ["BanditTask", "DEFAULTS"]
