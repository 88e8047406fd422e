"""The Task contract, checked against a built task in the sandbox a run uses.

Why one checker: what the loop, the sandbox and the Policy Inspector rely on is the same for
a built-in task and one in the author's own package, so ``python -m atlas.tasks check``, the
scaffold's test and ``tests/test_task_contract.py`` run the same checks:

- the class: ``name``, the factories (their modules exist and define them), the metrics;
- ``score_range`` is declared (a warning when it is not: it also catches a flipped sign);
- the seed program passes, scores inside ``score_range`` and reports every declared
  quality metric (the sandbox turns each of these into a failure);
- the signature and the seed program define the entry point (parsed: a seed defining
  ``estimate_centre`` does not define ``estimate``);
- a program whose entry point returns a wrong type fails cleanly: a failure of the
  program, not a crash of the scorer (``task_error``) or of the sandbox; a program without
  the entry point fails as ``missing_entry_point``, as in every built-in task;
- the hidden set is large enough: the seed's score across ``secrets`` fresh secrets varies
  by at most ``max_spread`` of its mean (otherwise the secret's draw, not the program,
  decides what a run reports).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atlas.messages import cause
from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.audit import audit_seed, unreadable_paths
from atlas.sandbox.pool import SandboxError
from atlas.sandbox.seccomp import check_extra_syscalls
from atlas.tasks import check_task_class
from atlas.tasks.base import PromptSpec, Task
from atlas.types import Evaluation, FailureKind

#: default share of its mean by which the seed's score may move across secrets
MAX_SPREAD = 0.1
#: default number of secrets the spread is measured over
SECRETS = 3
#: failure kinds that are not a clean rejection of a wrong answer
UNCLEAN = frozenset({FailureKind.TASK_ERROR.value, FailureKind.KILLED.value,
                     FailureKind.TIMEOUT.value})


@dataclass
class Check:
    """One line of the checker's report: ``status`` is ``ok``, ``warn`` or ``fail``."""

    name: str
    status: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.status.upper():4}  {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class Report:
    """Every check's outcome; ``ok`` when none failed (warnings allowed)."""

    task: str
    checks: list[Check] = field(default_factory=list)
    seed_scores: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def add(self, name: str, ok: bool | None, detail: str = "") -> Check:
        check = Check(name, "ok" if ok else "warn" if ok is None else "fail", detail)
        self.checks.append(check)
        return check

    def text(self) -> str:
        verdict = "passes" if self.ok else "FAILS"
        return "\n".join([*(c.line() for c in self.checks),
                          f"task {self.task!r} {verdict} the Task contract"])


def check_secrets(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct task secrets, reproducible from ``seed`` (a check gives the same verdict
    twice) and unrelated to any run's."""
    return [hashlib.blake2b(f"atlas.tasks.check:{seed}:{i}".encode(), digest_size=32).hexdigest()
            for i in range(n)]


def wrong_return_program(entry_point: str) -> str:
    """A program whose entry point returns an object no task accepts."""
    return (f"def {entry_point}(*args, **kwargs):\n"
            f"    return object()  # the checker's wrong return type\n")


def without_entry_point_program(entry_point: str) -> str:
    """A program that defines everything but its entry point."""
    return (f"def not_{entry_point}(*args, **kwargs):\n"
            f"    return None  # the checker's program without {entry_point!r}\n")


def _top_level_names(tree: ast.Module) -> dict[str, str]:
    """Names a module binds outside functions and classes -> how (``def``, ``class``, ``=``,
    ``import``), conditional blocks included."""
    out: dict[str, str] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = "class" if isinstance(node, ast.ClassDef) else "def"
                continue  # what its body binds is not top level
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update({(a.asname or a.name).split(".")[0]: "import" for a in node.names})
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update({n.id: "=" for t in targets for n in ast.walk(t)
                            if isinstance(n, ast.Name)})
            for block in ("body", "orelse", "finalbody"):  # if, try, with, for, while
                visit([b for b in getattr(node, block, None) or [] if isinstance(b, ast.stmt)])
            for handler in getattr(node, "handlers", None) or []:
                visit(handler.body)

    visit(tree.body)
    return out


def entry_point_problem(spec: PromptSpec, seed_code: str) -> str | None:
    """Why the prompt's signature or the seed program does not define the entry point, naming
    what they define instead; None when both do. Parsed, not searched as text."""
    name = spec.entry_point
    try:
        sig = ast.parse(spec.signature.strip() + "\n    ...\n").body[0]
    except SyntaxError:
        return (f"the signature {spec.signature!r} is not a Python `def` line; write it as "
                f"'def {name}(...):'")
    if not isinstance(sig, (ast.FunctionDef, ast.AsyncFunctionDef)) or sig.name != name:
        found = getattr(sig, "name", type(sig).__name__)
        return (f"the signature {spec.signature!r} defines {found!r}, not the entry point "
                f"{name!r}; make PromptSpec.signature and entry_point name one function")
    try:
        names = _top_level_names(ast.parse(seed_code))
    except SyntaxError as exc:
        return f"the seed program does not parse (line {exc.lineno}: {exc.msg}); fix it"
    if name not in names:
        defs = sorted(n for n, how in names.items() if how in ("def", "class"))
        close = difflib.get_close_matches(name, defs, n=1)
        return (f"the seed program defines no top-level {name!r} (it defines "
                f"{', '.join(defs) or 'no function'}); "
                + (f"rename {close[0]!r} to {name!r}, or " if close else "")
                + "set PromptSpec.entry_point to the function it defines")
    return None  # bound by a def, or another way (an alias): the sandbox checks it is callable


def spread(scores: list[float]) -> float:
    """(max - min) / |mean| of the scores; 0 when they are equal, inf around a zero mean."""
    lo, hi = min(scores), max(scores)
    if hi == lo:
        return 0.0
    mean = abs(sum(scores) / len(scores))
    return (hi - lo) / mean if mean > 0 else math.inf


def _first_line(ev: Evaluation) -> str:
    return f"{ev.failure_kind}: {cause(ev.message, 400)}"


def check_task(task: Task, *, secrets: int = SECRETS, max_spread: float = MAX_SPREAD,
               secret_seed: int = 0, isolation: str = "auto",
               sandbox: Callable[..., Any] | None = None) -> Report:
    """Run every check on ``task``; the report says which failed and why.

    ``sandbox(task, secret=...)`` builds the sandbox (default: ``Sandbox.for_task`` with one
    worker), so the checks run exactly where a run scores.
    """
    if sandbox is None:
        def sandbox(t: Task, secret: str) -> Sandbox:
            return Sandbox.for_task(t, secret=secret, resources=Resources(workers=1),
                                    confinement=Confinement(isolation=isolation))

    report = Report(task.name)
    if not _check_class(report, task):
        return report
    _check_declarations(report, task)
    _check_readable(report, task, isolation)
    spec = task.prompt_spec()
    seed_code = task.seed_program()
    problem = entry_point_problem(spec, seed_code)
    report.add("entry point", problem is None, problem or (
        f"{spec.entry_point!r}: the signature {spec.signature!r} and the seed program define it"))
    if not math.isfinite(max_spread) or max_spread <= 0 or secrets < 1:
        raise ValueError(f"max_spread={max_spread!r} and secrets={secrets!r}: use a share > 0 "
                         f"and at least one secret")
    context = task.context(0)
    for k, secret in enumerate(check_secrets(secrets, secret_seed)):
        if not _check_in_sandbox(report, task, spec, seed_code, context, k, sandbox, secret):
            return report
    if secrets > 1:
        _check_spread(report, secrets, max_spread)
    return report


def _check_class(report: Report, task: Task) -> bool:
    """The class's attributes and factories; False when they fail (nothing else can run)."""
    try:
        check_task_class(type(task))
    except ValueError as exc:
        report.add("class attributes and factories", False, str(exc))
        return False
    report.add("class attributes and factories", True,
               f"evaluator_factory={task.evaluator_factory}, "
               f"runner_factory={task.runner_factory}")
    return True


def _check_declarations(report: Report, task: Task) -> None:
    """What the task declares, read off it without a sandbox: quality metrics, syscalls,
    ``score_range``."""
    names = [m.name for m in task.quality_metrics]
    report.add("quality metrics declared", (len(names) == len(set(names))) if names else None,
               f"{names}" if names else "none: the Policy Inspector compares no metric; "
               "declare QualityMetric(name, 'max' | 'min') for each quality the scorer reports")
    try:
        extra = check_extra_syscalls(task.syscalls, f"{type(task).__name__}.syscalls")
        report.add("syscalls", True, f"{list(extra)} beyond the sandbox's allow-list"
                   if extra else "the sandbox's allow-list")
    except ValueError as exc:
        report.add("syscalls", False, str(exc))
    lo, hi = task.score_range
    declared = not (lo == -math.inf and hi == math.inf)
    report.add("score_range declared", True if declared else None,
               f"[{lo:g}, {hi:g}]" if declared else "(-inf, inf): declare the interval a "
               "genuine score lies in; it rejects forged scores and catches a flipped sign "
               "(a loss returned as the score)")


def _check_readable(report: Report, task: Task, isolation: str) -> None:
    """Every file the task's runner opens lies in what a runner may read (its package,
    atlas's runner modules, the interpreter, the libraries it imports): the seed program
    under the auditing sandbox, each other file named."""
    try:
        paths = unreadable_paths(audit_seed(task, isolation))
    except (SandboxError, ValueError) as exc:
        report.add("files the runner reads", None, f"not audited: {cause(str(exc), 300)}")
        return
    report.add("files the runner reads", not paths,
               "all in what a runner may read" if not paths else
               f"{', '.join(paths[:5])} lie outside what a runner may read (its package, "
               f"atlas's runner modules, the interpreter, the libraries it imports): keep "
               f"the task's files in its package")


def _check_in_sandbox(report: Report, task: Task, spec: PromptSpec, seed_code: str,
                      context: dict[str, Any], k: int, sandbox: Callable[..., Any],
                      secret: str) -> bool:
    """The seed program under the ``k``-th secret (its score goes to ``seed_scores``); under
    the first, also the sandbox, the seed's metrics and a wrong return type. False when the
    checks cannot go on."""
    try:
        sb = sandbox(task, secret=secret)
    except (SandboxError, ValueError) as exc:
        report.add("sandbox starts", False, str(exc).strip().splitlines()[-1][:600])
        return False
    with sb:
        try:
            ev = sb.evaluate(seed_code, context)
            if k == 0:
                report.add("sandbox starts", True, f"isolation {sb.isolation}")
        except SandboxError as exc:
            report.add("sandbox starts", False, " ".join(str(exc).split())[-600:])
            return False
        if not ev.passed:
            report.add("seed program passes" if k == 0 else f"seed passes (secret {k})",
                       False, _first_line(ev) + ("\n" + ev.message if "\n" in ev.message
                                                 else ""))
            return False
        report.seed_scores.append(ev.score)
        if k == 0:
            _check_seed_and_wrong_return(report, task, spec, sb, ev, context)
    return True


def _check_seed_and_wrong_return(report: Report, task: Task, spec: PromptSpec, sb: Sandbox,
                                 ev: Evaluation, context: dict[str, Any]) -> None:
    """The passing seed's score and metrics, then a program whose entry point returns the
    wrong type: it must fail as the program's failure, not the scorer's or the sandbox's."""
    lo, hi = task.score_range
    names = [m.name for m in task.quality_metrics]
    report.add("seed program passes", True,
               f"score {ev.score:.6g} in [{lo:g}, {hi:g}], {ev.seconds:.2f} s")
    report.add("declared quality metrics reported", True,
               ", ".join(f"{n}={ev.metrics[n]:.4g}" for n in names) or "none declared")
    _check_missing_entry_point(report, spec, sb, context)
    wrong = sb.evaluate(wrong_return_program(spec.entry_point), context)
    if wrong.passed:
        report.add("wrong return type fails cleanly", False,
                   f"a program returning object() passed with score {wrong.score:g}: "
                   f"the scorer or the runner does not check the answer")
    elif wrong.failure_kind in UNCLEAN:
        report.add("wrong return type fails cleanly", False, _first_line(wrong))
    else:
        report.add("wrong return type fails cleanly", True, _first_line(wrong))


def _check_missing_entry_point(report: Report, spec: PromptSpec, sb: Sandbox,
                               context: dict[str, Any]) -> None:
    """A program without the entry point fails as ``missing_entry_point`` (the failure kind a
    run counts it as), not as a killed process or the scorer's error."""
    ev = sb.evaluate(without_entry_point_program(spec.entry_point), context)
    name = "a program without the entry point fails as missing_entry_point"
    if ev.passed:
        report.add(name, False, f"a program without {spec.entry_point!r} passed with score "
                   f"{ev.score:g}: the runner does not call the program's entry point")
    elif ev.failure_kind != FailureKind.MISSING_ENTRY_POINT.value:
        report.add(name, False, f"{_first_line(ev)}; let the runner load the program with "
                   f"load_candidate(code, {spec.entry_point!r}) before it reads a message")
    else:
        report.add(name, True, _first_line(ev))


def _check_spread(report: Report, secrets: int, max_spread: float) -> None:
    """The hidden set is large enough: the seed's score moves little across secrets."""
    share = spread(report.seed_scores)
    shown = ", ".join(f"{s:.4g}" for s in report.seed_scores)
    report.add("hidden set large enough", share <= max_spread,
               f"the seed scores {shown} across {secrets} secrets: spread {share:.1%} of "
               f"the mean (at most {max_spread:.0%}); "
               + ("ok" if share <= max_spread else "draw more hidden instances per "
                  "evaluation (or larger ones) until the secret moves the score less"))

__all__ = ["Check", "MAX_SPREAD", "Report", "SECRETS", "check_secrets", "check_task",
           "entry_point_problem", "spread", "without_entry_point_program", "wrong_return_program"]
