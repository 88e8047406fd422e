"""What a ``Sandbox`` is built from, one small settings object per concern.

``TaskSpec`` is what the task declares (its scorer and runner, its time limit, what a genuine
result looks like); ``Resources`` is what the host lends (workers, threads, memory, output);
``Confinement`` is how tightly runners are shut in (the isolation mode, the paths they may not
see, the syscall audit). Each has the defaults a plain ``Sandbox`` had, so a caller names only
the concern it changes. The ``Sandbox`` constructor validates every value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    """The task's side: ``evaluator_factory`` and ``runner_factory`` ("module:function") build
    the trusted scorer (called with ``evaluator_config``) and the untrusted runner; each
    candidate gets ``timeout_s`` of wall time; a passed score outside ``score_range``, or one
    without a metric named in ``quality_metrics``, is not a score; ``fork_safe``: runners fork
    from a zygote that imported the runner once; ``syscalls``: beyond ``seccomp.ALLOWED``."""

    evaluator_factory: str
    evaluator_config: dict
    runner_factory: str
    timeout_s: float = 30.0
    score_range: tuple[float, float] = (-math.inf, math.inf)
    quality_metrics: tuple[str, ...] = ()
    fork_safe: bool = True
    syscalls: tuple[str, ...] = ()

    @classmethod
    def of(cls, task: Any) -> TaskSpec:
        """What a ``Task`` declares (factories, time limit, score range, fork safety)."""
        return cls(task.evaluator_factory, task.evaluator_config(),
                   runner_factory=getattr(task, "runner_factory", None),
                   timeout_s=float(task.timeout_s), score_range=tuple(task.score_range),
                   quality_metrics=tuple(m.name for m in task.quality_metrics),
                   fork_safe=bool(task.fork_safe),
                   syscalls=tuple(getattr(task, "syscalls", ()) or ()))


@dataclass(frozen=True)
class Resources:
    """The host's side: ``workers`` scorer processes (candidates in parallel), each with
    ``threads_per_worker`` math threads and replaced after ``recycle_every`` candidates; every
    candidate may hold ``memory_mb`` resident and write ``max_output_bytes`` of output."""

    workers: int = 2
    threads_per_worker: int = 1
    memory_mb: int = 2048
    max_output_bytes: int = 65536
    recycle_every: int = 500


@dataclass(frozen=True)
class Confinement:
    """How runners are shut in: ``isolation`` (bwrap | rlimits | auto), the paths ``hide``
    masks (the run folder and the secret file, widened to whole output trees), ``audit``
    (record every syscall a runner makes instead of refusing; ``python -m atlas.sandbox
    audit``, never for scoring) and ``score_once`` (a program is run at most once per
    regime, the context without its round, its first evaluation returned again: no later run of it can receive what an
    earlier one relayed through the kernel's caches; ``atlas.sandbox.inputs``). Turn it
    off only to run the same program again on purpose (the sandbox's own tests)."""

    isolation: str = "auto"
    hide: tuple[str, ...] = ()
    audit: bool = False
    score_once: bool = True
