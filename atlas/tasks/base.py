"""The contract a task implements. Adding a task = one subpackage with one ``Task`` subclass.

A task has two halves that live in different processes:
- the *host* half (this class, in the main process): the prompt spec, the seed program,
  the round-dependent context (e.g. the PINN viscosity schedule);
- the *worker* half (``make_evaluator``, called inside a sandbox worker process): a
  callable that receives the candidate's source code and the round context and returns an
  ``Evaluation``. Candidate code is only ever executed by that callable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atlas.types import Evaluation

Evaluator = Callable[[str, dict[str, Any]], Evaluation]


@dataclass(frozen=True)
class PromptSpec:
    """What the research agent is told about the task (kept short: the agent is small)."""

    system: str  # role line, e.g. "You are a research agent in online learning..."
    problem: str  # the problem statement and what the function must return
    signature: str  # e.g. "def policy(context, history, t, state):"
    entry_point: str  # the function name the evaluator calls
    hints: tuple[str, ...] = ()  # short strategy hints


class Task(ABC):
    """Host-side description of a task."""

    name: str
    #: import path "module:function" of a zero-argument-plus-config factory returning an
    #: ``Evaluator``; the sandbox worker imports and calls it once per worker process, so
    #: expensive set-up (JAX compilation) is paid once per worker, not per candidate.
    evaluator_factory: str
    #: seconds one candidate may run before it is killed
    timeout_s: float = 30.0

    def __init__(self, **config: Any) -> None:
        self.config = dict(config)

    @abstractmethod
    def prompt_spec(self) -> PromptSpec: ...

    @abstractmethod
    def seed_program(self) -> str: ...

    def context(self, round_index: int) -> dict[str, Any]:
        """Per-round evaluation context (plain JSON types). Default: the round index only."""
        return {"round": round_index}

    def evaluator_config(self) -> dict[str, Any]:
        """JSON config handed to the evaluator factory inside the worker."""
        return dict(self.config)
