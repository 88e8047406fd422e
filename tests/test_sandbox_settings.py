"""``Sandbox`` is built from one settings object per concern: what the task declares
(``TaskSpec``), what the host lends (``Resources``) and how runners are shut in
(``Confinement``). Building one starts no worker, so these checks take well under a second."""

from __future__ import annotations

import inspect
import math
import os

import pytest

from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER
from atlas.tasks import make_task


def test_the_constructor_takes_one_object_per_concern_and_the_secret() -> None:
    assert list(inspect.signature(Sandbox).parameters) == [
        "task", "resources", "confinement", "secret"]
    assert list(inspect.signature(Sandbox.for_task).parameters) == [
        "task", "resources", "confinement", "secret"]


def test_a_plain_sandbox_keeps_the_defaults_it_had() -> None:
    with Sandbox(TaskSpec(TOY_SCORER, {}, TOY_RUNNER)) as sb:
        assert (sb.workers, sb.threads_per_worker, sb.memory_mb, sb.max_output_bytes,
                sb.recycle_every) == (2, 1, 2048, 65536, 500)
        assert (sb.timeout_s, sb.score_range, sb.fork_safe, sb.quality_metrics, sb.audit) \
            == (30.0, (-math.inf, math.inf), True, (), False)
        assert len(sb.secret) == 64  # a fresh one


def test_for_task_takes_what_the_task_declares_and_the_callers_resources(tmp_path) -> None:
    task = make_task("binpacking")
    spec = TaskSpec.of(task)
    assert (spec.evaluator_factory, spec.runner_factory) == (task.evaluator_factory,
                                                             task.runner_factory)
    assert spec.evaluator_config == task.evaluator_config()
    assert spec.timeout_s == float(task.timeout_s) == 60.0
    assert spec.quality_metrics == tuple(m.name for m in task.quality_metrics) != ()
    with Sandbox.for_task(task, resources=Resources(workers=1, memory_mb=512),
                          confinement=Confinement(isolation="rlimits", hide=(str(tmp_path),)),
                          secret="ab" * 32) as sb:
        assert (sb.workers, sb.memory_mb, sb.timeout_s) == (1, 512, 60.0)
        assert sb.isolation == "rlimits+guard" and sb.secret == "ab" * 32
        real = os.path.realpath(tmp_path)  # masked, with the output tree it lies in
        assert any(real == h or real.startswith(h + "/") for h in sb.hide), sb.hide
        assert sb.score_range == tuple(float(v) for v in task.score_range)


@pytest.mark.parametrize(("settings", "message"), [
    ({"resources": Resources(workers=0)}, "sandbox workers=0 is invalid"),
    ({"resources": Resources(memory_mb=10)}, "sandbox memory_mb=10 is invalid"),
    ({"confinement": Confinement(isolation="docker")}, "isolation"),
])
def test_a_bad_setting_in_a_group_is_named(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sandbox(TaskSpec(TOY_SCORER, {}, TOY_RUNNER), **settings)


def test_a_bad_time_limit_in_the_task_spec_is_named() -> None:
    with pytest.raises(ValueError, match="timeout_s=0 is invalid"):
        Sandbox(TaskSpec(TOY_SCORER, {}, TOY_RUNNER, timeout_s=0))
