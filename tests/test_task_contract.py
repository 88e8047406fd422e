"""One contract test over every task, the built-in registry and the external example task
(tests/external_task/linefit, a package outside atlas/): what the loop, the sandbox and the
inspector rely on is declared, consistent and usable. The sandbox half of the contract is
``atlas.tasks.checker`` (``python -m atlas.tasks check``), run here on every task."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from atlas.sandbox.secret import derive_seed
from atlas.tasks import TASKS, make_task, task_class
from atlas.tasks.base import QualityMetric, Task
from atlas.tasks.checker import check_task

EXTERNAL = Path(__file__).with_name("external_task")
EXTERNAL_YAML = EXTERNAL / "linefit" / "conf" / "task" / "linefit.yaml"


@pytest.fixture(scope="module", autouse=True)
def _external_on_path():
    """Path-add the external task's package, as PYTHONPATH would (here and for the
    sandbox's processes)."""
    sys.path.insert(0, str(EXTERNAL))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(EXTERNAL), *filter(None, [before])])
    yield
    sys.path.remove(str(EXTERNAL))
    if before is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = before


def _config(name: str) -> dict:
    """The task's YAML as the loop receives it (interpolations into other groups dropped)."""
    path = EXTERNAL_YAML if name == "linefit" else Path(__file__).parents[1] / "conf" / "task" / f"{name}.yaml"
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {k: v for k, v in cfg.items() if not (isinstance(v, str) and "${" in v)}


ALL_TASKS = [*sorted(TASKS), "linefit"]


@pytest.mark.parametrize("name", ALL_TASKS)
def test_task_declares_its_contract(name: str) -> None:
    cfg = _config(name)
    task = make_task(**cfg)
    assert isinstance(task, Task) and task.name == name
    assert task.timeout_s == pytest.approx(float(cfg["timeout_s"]))  # the YAML's, not 30 s
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


@pytest.mark.parametrize("name", ["bandit", "binpacking", "linefit",
                                  pytest.param("pinn", marks=pytest.mark.slow)])
def test_task_passes_the_checker(name: str) -> None:
    """The sandbox half of the contract: the seed passes inside score_range with every
    declared metric, a wrong return type fails cleanly, the hidden set is large enough."""
    report = check_task(make_task(**_config(name)), secrets=3)
    by_name = {c.name: c for c in report.checks}
    assert by_name["seed program passes"].status == "ok", report.text()
    assert by_name["declared quality metrics reported"].status == "ok"
    assert by_name["wrong return type fails cleanly"].status == "ok", report.text()
    assert all(c.status == "ok" for c in report.checks
               if c.name != "hidden set large enough"), report.text()
    hidden = by_name["hidden set large enough"]
    if name == "linefit":  # 4 hidden lines: the minimal example (docs/tasks.md, section 5) is too small
        assert hidden.status == "fail" and "spread" in hidden.detail, report.text()
    else:
        assert hidden.status == "ok", report.text()


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


@pytest.mark.parametrize("name", ALL_TASKS)
def test_task_rejects_an_unknown_field_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=r"task\.bogus_field"):
        make_task(**_config(name), bogus_field=1)


class _NoTimeoutTask(Task):
    """A task that never touches ``timeout_s``: the base class must still read it."""

    name = "no_timeout"
    evaluator_factory = "atlas.tasks.bandit.evaluator:make_scorer"
    runner_factory = "atlas.tasks.bandit.evaluator:make_runner"

    def prompt_spec(self):  # pragma: no cover - not called
        raise NotImplementedError

    def seed_program(self) -> str:  # pragma: no cover - not called
        return ""


def test_base_class_reads_timeout_s_from_config() -> None:
    assert _NoTimeoutTask(timeout_s=123).timeout_s == 123.0
    assert _NoTimeoutTask().timeout_s == 30.0  # the class default when the YAML has none
    with pytest.raises(ValueError, match=r"task\.timeout_s"):
        _NoTimeoutTask(timeout_s=-1)
    target = f"{__name__}._NoTimeoutTask"
    task = make_task(_target_=target, name="no_timeout", timeout_s=7)
    assert type(task).__name__ == "_NoTimeoutTask" and task.timeout_s == 7.0


def test_target_errors_name_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"task\._target_='nopkg\.Nothing' cannot be imported"):
        task_class({"_target_": "nopkg.Nothing"})
    with pytest.raises(ValueError, match="not a subclass"):
        task_class({"_target_": "pathlib.Path"})
    with pytest.raises(ValueError, match="known tasks.*_target_"):
        task_class({"name": "chemistry"})
    with pytest.raises(ValueError, match="task.name='bandit' but linefit.LineFitTask"):
        make_task(_target_="linefit.LineFitTask", name="bandit")
    # built-ins resolve by name with or without _target_ (old run folders have none)
    assert type(make_task("bandit")) is task_class({"_target_": TASKS["bandit"]})


def test_supporter_hints_replace_name_matching() -> None:
    assert "robust_loss" in make_task("pinn").supporter_hints
    assert not make_task("bandit").supporter_hints and not make_task("binpacking").supporter_hints


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python -m atlas.train task=linefit`` with the external package path-added and its
    config folder on Hydra's search path, exactly as docs/tasks.md tells a user to run it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(EXTERNAL), *filter(None, [os.environ.get("PYTHONPATH")])]), WANDB_MODE="disabled")
    cmd = [sys.executable, "-m", "atlas.train", "task=linefit",
           "hydra.searchpath=[pkg://linefit.conf]", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)


def _seed_score(secret: str, problems: int, points: int, noise: float) -> float:
    """What linefit's seed program (a flat line through the mean) scores, computed here."""
    errors = []
    for k in range(problems):
        rng = np.random.default_rng(derive_seed(secret, "linefit", k))
        a, b = rng.normal(0, 2, 2)
        xs = rng.uniform(-1, 1, points)
        ys = a * xs + b + rng.normal(0, noise, xs.shape)
        errors.append(a ** 2 + (float(np.mean(ys)) - b) ** 2)
    return -float(np.mean(errors))


def test_external_task_trains_end_to_end(tmp_path: Path) -> None:
    secret = "ab" * 32
    (tmp_path / "secret").write_text(secret + "\n")
    run_dir = tmp_path / "run"
    proc = _train(tmp_path, "experiment=test", "method=atlas", "progress=false",
                  "explore.rounds=1", "explore.phase_every=1", "explore.samples_per_prompt=2",
                  "task.noise=0.25", "task.problems=3", f"hydra.run.dir={run_dir}",
                  f"sandbox.secret_file={tmp_path / 'secret'}",
                  "logger=csv")  # the package's own logger (linefit/conf/logger/csv.yaml)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the logger came from the package's config folder, built by _target_: its CSV has rounds
    metrics = (run_dir / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert "round/best" in metrics[0].split(",") and len(metrics) >= 3
    results = json.loads((run_dir / "results.json").read_text())
    assert results["task"] == "linefit" and results["score_label"] == "-MSE"
    expected = _seed_score(secret, problems=3, points=64, noise=0.25)
    assert results["initial_score"] == pytest.approx(expected, rel=1e-9)
    assert results["best_by_round"][0] == pytest.approx(expected, rel=1e-9)
    assert results["final_score"] >= results["initial_score"]
    assert results["candidates"] == results["candidate_budget"] > 0
    assert "ATLAS run: task=linefit" in proc.stdout


def test_external_task_field_errors_are_one_line(tmp_path: Path) -> None:
    proc = _train(tmp_path, "+task.nosie=0.1", "experiment=test", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "task.nosie is not a known field" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_pinn_scores_report_every_declared_quality_metric() -> None:
    """PINN's scorer computes its validation metrics from the trained network alone and
    fails a program whose metric is not finite: a declared metric is never dropped."""
    from atlas.tasks.pinn.evaluator import VALIDATION_METRICS

    assert set(VALIDATION_METRICS) == {m.name for m in make_task("pinn").quality_metrics}
