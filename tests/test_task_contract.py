"""One contract test over every registered task: what the loop, the sandbox and the
inspector rely on is declared, consistent and usable."""

from __future__ import annotations

import math

import pytest

from atlas.tasks import TASKS, make_task
from atlas.tasks.base import QualityMetric, Task


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_declares_its_contract(name: str) -> None:
    task = make_task(name)
    assert isinstance(task, Task) and task.name == name
    assert task.timeout_s > 0
    assert task.quality_metrics, "a task must declare the metrics the inspector compares"
    names = [m.name for m in task.quality_metrics]
    assert len(names) == len(set(names))
    assert all(isinstance(m, QualityMetric) for m in task.quality_metrics)
    lo, hi = task.score_range
    assert lo < hi and not math.isnan(lo) and not math.isnan(hi)
    assert isinstance(task.fork_safe, bool)
    assert task.score_label
    spec = task.prompt_spec()
    assert spec.entry_point in spec.signature
    assert spec.entry_point in task.seed_program()


def test_score_range_rejects_impossible_scores() -> None:
    bandit = make_task("bandit")
    assert bandit.score_in_range(-0.375) and bandit.score_in_range(0.0)
    assert not bandit.score_in_range(0.5)  # better than the oracle
    assert not bandit.score_in_range(math.inf) and not bandit.score_in_range(math.nan)


def test_quality_metric_direction_is_checked_and_used() -> None:
    with pytest.raises(ValueError, match="direction"):
        QualityMetric("x", "up")  # type: ignore[arg-type]
    assert QualityMetric("rel_l2", "min").better(0.1, 0.2)
    assert QualityMetric("optimal_rate", "max").better(0.5, 0.22)
