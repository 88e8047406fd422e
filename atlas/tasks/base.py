"""The contract a task implements. Adding a task = one subpackage with one ``Task`` subclass.

A task has three halves that live in different processes:
- the *host* half (this class, in the main process): the prompt spec, the seed program,
  the round-dependent context (e.g. the PINN viscosity schedule);
- the *scorer* (``evaluator_factory(config, secret=...)``, once per trusted sandbox worker):
  holds everything the candidate must not see (environments, validation points, derived
  from the run's ``secret``) and computes the score. It never executes candidate code. Its
  ``score(code, context, link) -> Evaluation`` talks to the runner over ``link``
  (``atlas.sandbox.link``: ``send``/``recv`` of JSON objects; every answer is untrusted and
  must be checked); ``public_config()`` is the only config the runner receives;
- the *runner* (``runner_factory(public_config)``, once per candidate, in a fresh process
  that never held the secret, under rlimits + seccomp + guard, killed after the candidate):
  warm-up happens in the factory (before any candidate code); the callable it returns,
  ``run(code, context, link)``, loads the candidate and answers the scorer's messages.

Both factories are required: whatever computes a score must never run candidate code.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class PromptSpec:
    """What the research agent is told about the task (kept short: the agent is small)."""

    system: str  # role line, e.g. "You are a research agent in online learning..."
    problem: str  # the problem statement and what the function must return
    signature: str  # e.g. "def policy(context, history, t, state):"
    entry_point: str  # the function name the evaluator calls
    hints: tuple[str, ...] = ()  # short strategy hints


@dataclass(frozen=True)
class QualityMetric:
    """A metric the evaluator reports that measures how good the program is.

    Only declared metrics are compared when the Policy Inspector looks for regressions:
    timings, flags and candidate-relative numbers (e.g. the candidate's own loss) are not
    quality, and guessing a direction from a name is how a better policy gets vetoed.
    """

    name: str  # key in ``Evaluation.metrics``
    direction: Literal["max", "min"]  # "max": higher is better; "min": lower is better
    description: str = ""  # one line for the LLM inspector's prompt

    def __post_init__(self) -> None:
        if self.direction not in ("max", "min"):
            raise ValueError(f"QualityMetric {self.name!r}: direction={self.direction!r}; "
                             "use 'max' (higher is better) or 'min' (lower is better)")

    def better(self, a: float, b: float) -> bool:
        """Whether value ``a`` is strictly better than ``b`` on this metric."""
        return a > b if self.direction == "max" else a < b


class Task(ABC):
    """Host-side description of a task.

    The contract, in one place (class attributes a subclass overrides):
    - ``name``, ``evaluator_factory``, ``runner_factory``, ``timeout_s``: what runs where,
      and for how long (see the module docstring);
    - ``quality_metrics``: the metrics that measure quality, each with its direction;
    - ``score_range``: the closed interval a genuine score lies in; a result outside it is a
      ``tampered`` failure, never a score (bandit: NMR <= 0, the oracle's regret is 0);
    - ``fork_safe``: whether the runner's module may be imported in the zygote that forks
      every runner (False for modules that start threads on import or use, e.g. JAX/XLA);
    - ``score_label``: how reports and figures name the score (e.g. "NMR");
    - ``supporter_hints``: optional tags that switch on task-specific supporter rules
      (``"robust_loss"``: the embedded exploration rule may rewrite squared terms as a Huber
      loss; PINN sets it). Unknown tags are ignored.

    Config: ``Task(**cfg.task)`` receives the task's YAML fields (``name`` and Hydra's
    ``_target_`` removed by ``make_task``); ``timeout_s`` in it sets ``self.timeout_s``
    whether or not a subclass reads it. A subclass validates its own fields by name.
    """

    name: str
    #: import path "module:function" of the scorer's factory, ``factory(config, secret=...)``
    #: returning an object with ``score(code, context, link) -> Evaluation`` and
    #: ``public_config()``; each sandbox worker calls it once, so expensive set-up (JAX
    #: compilation) is paid once per worker, not per candidate. ``make_task`` checks that the
    #: module exists and defines the function.
    evaluator_factory: str
    #: import path of the untrusted runner's factory, ``factory(public_config)`` returning
    #: ``run(code, context, link)``; checked like ``evaluator_factory``
    runner_factory: str
    #: seconds one candidate may run before it is killed
    timeout_s: float = 30.0
    #: the quality metrics the Policy Inspector compares, with their directions
    quality_metrics: tuple[QualityMetric, ...] = ()
    #: closed interval of possible genuine scores (higher is better); declare it always: it
    #: also catches a flipped sign (a loss returned as the score) at the seed
    score_range: tuple[float, float] = (-math.inf, math.inf)
    #: whether the sandbox worker may fork after building the evaluator
    fork_safe: bool = True
    #: system calls this task's runner needs beyond the sandbox's allow-list
    #: (``atlas.sandbox.seccomp.ALLOWED``); ``python -m atlas.sandbox audit task=<name>``
    #: prints what the runner calls, ``python -m atlas.tasks check`` checks the names
    syscalls: tuple[str, ...] = ()
    #: the score's name in reports and figures
    score_label: str = "score"
    #: tags for task-specific supporter rules (see the class docstring)
    supporter_hints: frozenset[str] = frozenset()

    def __init__(self, **config: Any) -> None:
        self.config = dict(config)
        if "timeout_s" in self.config:  # the YAML's value, not the class default of 30 s
            timeout = self.config["timeout_s"]
            if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                    or not math.isfinite(timeout) or not timeout > 0):
                raise ValueError(f"task.timeout_s={timeout!r} is invalid: use seconds > 0, "
                                 f"e.g. task.timeout_s=30")
            self.timeout_s = float(timeout)

    @abstractmethod
    def prompt_spec(self) -> PromptSpec: ...

    @abstractmethod
    def seed_program(self) -> str: ...

    def context(self, round_index: int) -> dict[str, Any]:
        """Per-round evaluation context (plain JSON types). Default: the round index only."""
        return {"round": round_index}

    def metric_directions(self) -> dict[str, str]:
        """Declared quality metrics as ``{name: "max" | "min"}``."""
        return {m.name: m.direction for m in self.quality_metrics}

    def score_in_range(self, score: float) -> bool:
        """Whether a reported score could be genuine (finite and inside ``score_range``)."""
        lo, hi = self.score_range
        return math.isfinite(score) and lo <= score <= hi

    def evaluator_config(self) -> dict[str, Any]:
        """JSON config handed to the evaluator factory inside the worker."""
        return dict(self.config)
