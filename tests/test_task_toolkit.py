"""A task author's toolkit: the scaffold, the checker, ``atlas.score``, and errors that blame
the right party (a task's own bug is ``task_error`` with its file:line, found before the
model loads). Each faulty task here is the scaffold with one mistake made on purpose, in a
package outside atlas, scored in the real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlas.compose import compose, searchpath_problem
from atlas.config import validate
from atlas.evolution.seeding import score_seed
from atlas.messages import cause
from atlas.sandbox import Resources, Sandbox, protocol
from atlas.tasks import build_task, make_task, task_class
from atlas.tasks.base import PromptSpec, Task
from atlas.tasks.checker import check_task, spread
from atlas.tasks.errors import TaskError
from atlas.tasks.scaffold import class_name, scaffold
from atlas.types import FailureKind

ROOT = Path(__file__).resolve().parents[1]


def _on_path(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path-add ``folder`` here and for the sandbox's processes, as PYTHONPATH would."""
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, old: str, new: str,
            file: str = "scoring.py") -> Task:
    """The scaffold ``name`` with ``old`` replaced by ``new`` in ``file``, built."""
    scaffold(name, tmp_path)
    path = tmp_path / name / file
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))
    _on_path(tmp_path, monkeypatch)
    return make_task(_target_=f"{name}.{class_name(name)}", name=name)


def _seed(task: Task):
    with Sandbox.for_task(task, resources=Resources(workers=1)) as sb:
        return sb.evaluate(task.seed_program(), task.context(0))


# -- the scaffold and the checker ------------------------------------------------------------
def test_scaffold_passes_the_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = scaffold("toolkit_demo", tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        "toolkit_demo/__init__.py", "toolkit_demo/scoring.py", "toolkit_demo/conf/__init__.py",
        "toolkit_demo/conf/task/toolkit_demo.yaml", "toolkit_demo/test_task.py"}
    _on_path(tmp_path, monkeypatch)
    task = build_task(compose(["task=toolkit_demo", "hydra.searchpath=[pkg://toolkit_demo.conf]"]))
    report = check_task(task)
    assert report.ok, report.text()
    assert [c.status for c in report.checks] == ["ok"] * len(report.checks)
    assert len(report.seed_scores) == 3 and all(s < 0 for s in report.seed_scores)
    assert spread(report.seed_scores) < 0.1
    # the same contract from the command line (exit status 0), and the scaffold's own test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "atlas.tasks", "check", "task=toolkit_demo",
                          "hydra.searchpath=[pkg://toolkit_demo.conf]", "--secrets", "1"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "task 'toolkit_demo' passes the Task contract" in out.stdout


def test_scaffold_refuses_bad_names(tmp_path: Path) -> None:
    for name, why in (("My-Task", "invalid"), ("bandit", "built-in"), ("json", "importable"),
                      ("class", "invalid")):
        with pytest.raises(ValueError, match=why):
            scaffold(name, tmp_path)
    scaffold("twice", tmp_path)
    with pytest.raises(ValueError, match="exists"):
        scaffold("twice", tmp_path)


def test_scaffold_trains_end_to_end(tmp_path: Path) -> None:
    scaffold("toolkit_run", tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               WANDB_MODE="disabled")
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", str(tmp_path / "toolkit_run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert test.returncode == 0, test.stdout[-3000:]
    run = subprocess.run([sys.executable, "-m", "atlas.train", "experiment=test",
                          "method=evotune", "task=toolkit_run", "hydra.searchpath=[pkg://toolkit_run.conf]",
                          "progress=false", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["task"] == "toolkit_run" and results["initial_score"] < 0
    assert results["candidates"] == results["candidate_budget"] > 0


# -- errors that blame the right party -------------------------------------------------------
def test_a_scorer_bug_is_a_task_error_with_its_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _faulty(tmp_path, monkeypatch, "bugged", '        link.send({"done": True})\n',
                   '        link.send({"done": True})\n        self.config_typo["x"]\n')
    ev = _seed(task)
    assert ev.failure_kind == FailureKind.TASK_ERROR.value
    line = next(i for i, text in enumerate(
        (tmp_path / "bugged" / "scoring.py").read_text().splitlines(), 1) if "config_typo" in text)
    assert f"bugged/scoring.py:{line}" in ev.message.splitlines()[0]
    assert "AttributeError" in ev.message and "not the program" in ev.message
    # the end of the traceback (the cause) survives the one-line summary the run stops with
    with Sandbox.for_task(task, resources=Resources(workers=1)) as sb, pytest.raises(TaskError) as info:
        score_seed(task, sb)
    text = str(info.value)
    assert "\n" not in text and "task_error" in text and "config_typo" in text
    assert f"scoring.py:{line}" in text and "python -m atlas.tasks check" in text


def test_a_candidate_fault_stays_the_candidates(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaffold's checks raise CandidateError: a program's wrong answer is never blamed on
    the task, and a forged answer (the runner answering garbage) is ``tampered``."""
    task = _faulty(tmp_path, monkeypatch, "forged", 'link.send({"estimates": out})',
                   'link.send({"estimates": ["x"] * len(out)})')
    ev = _seed(task)
    assert ev.failure_kind == FailureKind.TAMPERED.value, ev.message


def test_a_numpy_message_names_tolist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _faulty(tmp_path, monkeypatch, "arrays", 'link.send({"estimates": out})',
                   'link.send({"estimates": np.array(out)})')
    ev = _seed(task)
    assert not ev.passed and ".tolist()" in ev.message, ev.message
    with pytest.raises(TypeError, match=r"\.tolist\(\)"):
        protocol.encode({"x": __import__("numpy").zeros(2)})


def test_a_missing_declared_metric_is_a_task_error(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    task = _faulty(tmp_path, monkeypatch, "nometric", 'metrics={"mae": mae}',
                   'metrics={"mean_abs": mae}')
    ev = _seed(task)
    assert ev.failure_kind == FailureKind.TASK_ERROR.value
    assert "['mae']" in ev.message and "quality_metrics" in ev.message


def test_score_range_catches_a_flipped_sign(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    task = _faulty(tmp_path, monkeypatch, "flipped", "Evaluation(score=-mae,",
                   "Evaluation(score=mae,")
    ev = _seed(task)
    assert ev.failure_kind == FailureKind.TAMPERED.value
    assert "outside the task's possible range" in ev.message
    report = check_task(task, secrets=1)
    assert not report.ok and report.checks[-1].name == "seed program passes"


def test_an_unchecked_answer_fails_the_wrong_return_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _faulty(tmp_path, monkeypatch, "lenient", "value = float(value)",
                   "value = float(value) if isinstance(value, float) else 0.0")
    report = check_task(task, secrets=1)
    wrong = next(c for c in report.checks if c.name == "wrong return type fails cleanly")
    assert wrong.status == "fail" and "passed with score" in wrong.detail


def test_a_small_hidden_set_fails_the_spread_check(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    scaffold("tiny_set", tmp_path)
    _on_path(tmp_path, monkeypatch)
    task = make_task(_target_="tiny_set.TinySetTask", name="tiny_set", problems=3)
    report = check_task(task, secrets=3)
    hidden = report.checks[-1]
    assert hidden.name == "hidden set large enough" and hidden.status == "fail", report.text()
    assert spread(report.seed_scores) > 0.1
    assert check_task(task, secrets=3, max_spread=1e9).ok  # the flag decides


class _Nameless(Task):
    evaluator_factory = "atlas.tasks.bandit.evaluator:make_scorer"
    runner_factory = "atlas.tasks.bandit.evaluator:make_runner"

    def prompt_spec(self) -> PromptSpec:  # pragma: no cover - never built
        raise NotImplementedError

    def seed_program(self) -> str:  # pragma: no cover - never built
        return ""


class _NoFactory(_Nameless):
    name = "no_factory"
    evaluator_factory = None  # type: ignore[assignment]


class _Typo(_Nameless):
    name = "typo"
    evaluator_factory = "atlas.tasks.bandit.evaluator:make_scorr"


class _NoModule(_Nameless):
    name = "no_module"
    runner_factory = "atlas.tasks.bandit.evaluatr:make_runner"


class _NoRunner(_Nameless):
    name = "no_runner"
    runner_factory = None  # type: ignore[assignment]


class _FlatRange(_Typo):
    evaluator_factory = "atlas.tasks.bandit.evaluator:make_scorer"
    score_range = (0.0, 0.0)


@pytest.mark.parametrize("cls, match", [
    (_Nameless, r"has no `name`"),
    (_NoFactory, r"has no `evaluator_factory`"),
    (_Typo, r"defines no 'make_scorr' \(did you mean 'make_scorer'\?\)"),
    (_NoModule, r"runner_factory='atlas.tasks.bandit.evaluatr:make_runner': no module"),
    (_NoRunner, r"_NoRunner has no `runner_factory`: add a runner, .*see docs/tasks\.md"),
    (_FlatRange, r"score_range=\(0.0, 0.0\) is invalid"),
])
def test_the_class_is_checked_when_the_task_is_built(cls: type, match: str) -> None:
    target = f"{__name__}.{cls.__name__}"
    with pytest.raises(ValueError, match=match):
        task_class({"_target_": target})
    with pytest.raises(ValueError, match=match):
        make_task(_target_=target)


def test_a_seed_failure_stops_the_run_before_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import atlas.loop

    scaffold("early", tmp_path)
    scoring = tmp_path / "early" / "scoring.py"
    scoring.write_text(scoring.read_text().replace("mae = float(", "mae = {}['x'] + float("))
    _on_path(tmp_path, monkeypatch)

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the seed was scored")

    monkeypatch.setattr(atlas.loop, "ResearchAgent", no_model)
    cfg = compose(["experiment=test", "task=early", "hydra.searchpath=[pkg://early.conf]",
                   f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(TaskError, match=r"task_error: the task's scorer raised KeyError"):
        atlas.loop.EvolutionLoop(validate(cfg), {}, tmp_path / "run")


# -- the command lines -----------------------------------------------------------------------
def test_searchpath_problem_names_the_package_and_the_fix() -> None:
    assert searchpath_problem(["task=x", "hydra.searchpath=[pkg://atlas]"]) is None
    problem = searchpath_problem(["hydra.searchpath=[file:///tmp,pkg://nopkg_xyz.conf]"])
    assert problem is not None and "pkg://nopkg_xyz.conf" in problem
    assert "PYTHONPATH=<the folder that holds nopkg_xyz/>" in problem


def test_train_names_an_unimportable_search_path(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "atlas.train", "task=linefit",
                          "hydra.searchpath=[pkg://linefit.conf]"], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "pkg://linefit.conf cannot be imported" in out.stderr and "PYTHONPATH" in out.stderr


def test_a_task_without_a_runner_stops_train_with_one_line(tmp_path: Path) -> None:
    """Every task is a scorer plus a runner: one without ``runner_factory`` fails at
    validation, before torch is imported, with one line that names the field and the fix."""
    scaffold("norunner", tmp_path)
    init = tmp_path / "norunner" / "__init__.py"
    text = init.read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("runner_factory ="))
    init.write_text(text.replace(line + "\n", ""))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "atlas.train", "task=norunner",
                          "hydra.searchpath=[pkg://norunner.conf]", f"hydra.run.dir={tmp_path / 'r'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    named = [x for x in out.stderr.splitlines() if "runner_factory" in x]
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert len(named) == 1 and "norunner.NorunnerTask has no `runner_factory`" in named[0]
    assert "see docs/tasks.md" in named[0], out.stderr
    probe = ("import sys\nfrom atlas.compose import compose\nfrom atlas.config import ConfigError, "
             "validate\ntry:\n    validate(compose(['task=norunner', "
             "'hydra.searchpath=[pkg://norunner.conf]']), [])\nexcept ConfigError as exc:\n"
             "    print('runner_factory' in str(exc), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_cause_keeps_the_end_of_a_traceback() -> None:
    tb = ("the task's runner failed to start: Traceback (most recent call last):\n"
          + "".join(f'  File "x.py", line {i}, in f\n    g()\n' for i in range(40))
          + "AttributeError: module 'linefit.scoring' has no attribute 'make_scorr'")
    short = cause(tb, 300)
    assert len(short) <= 300 and "\n" not in short
    assert short.startswith("the task's runner failed to start")
    assert short.endswith("has no attribute 'make_scorr'")
    assert cause("short message") == "short message"


def test_sandbox_secret_must_be_hex() -> None:
    with pytest.raises(ValueError, match="not a task secret; use hex digits"):
        Sandbox.for_task(make_task("bandit"), secret="public", resources=Resources(workers=1))


def _score_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atlas.score", *args], cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=600)


def test_score_cli_reproduces_the_baselines_table(tmp_path: Path) -> None:
    """``atlas.score`` on the published heuristics, as program files through the sandbox,
    gives the numbers of the baselines command (same instances: an OR-Library file)."""
    from atlas.tasks.binpacking.baselines import HEURISTICS
    from atlas.tasks.binpacking.evaluator import score_priority
    from atlas.tasks.binpacking.instances import read_orlib, uniform_instances, write_orlib

    data = write_orlib(tmp_path / "or3like.txt", uniform_instances())
    folder = ROOT / "atlas" / "tasks" / "binpacking" / "heuristics"
    files = [str(folder / f"{n}.py") for n in ("first_fit", "best_fit", "funsearch_weibull")]
    out = _score_cli("task=binpacking", f"task.instances={data}", *files, "--json",
                     "--secret-file", str(tmp_path / "s"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    expected = [score_priority(fn, read_orlib(data))[0] for fn in HEURISTICS.values()]
    assert [r["score"] for r in rows] == pytest.approx(expected, abs=1e-9)
    # the table the README prints: first fit 5.56 %, best fit 4.96 %, FunSearch 12.94 %
    assert [round(-r["score"], 2) for r in rows] == [5.56, 4.96, 12.94]
    assert all(r["passed"] and r["failure_kind"] == "ok" for r in rows)
    assert f"secret fresh, written to {tmp_path / 's'}" in out.stderr
    assert len((tmp_path / "s").read_text().strip()) == 64


def test_score_cli_reports_failures_and_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def priority(item, bins):\n    return 'first'\n")
    out = _score_cli("task=binpacking", "task.weibull_items=200", str(bad), cwd=tmp_path)
    assert out.returncode == 1
    assert "FAILED wrong_return" in out.stdout and "priority returned 'first'" in out.stdout
    named = [line for line in out.stderr.splitlines() if "secret fresh, written to" in line]
    assert named and Path(named[0].split("written to ")[1].split(" ")[0]).is_file()
    (tmp_path / "public").write_text("public\n")
    out = _score_cli("task=binpacking", str(bad), "--secret-file", str(tmp_path / "public"),
                     cwd=tmp_path)
    assert out.returncode == 2 and "not a task secret (64 hex characters" in out.stderr
    assert "Traceback" not in out.stderr
    out = _score_cli("task=binpacking", "missing.py", cwd=tmp_path)
    assert out.returncode == 2 and "missing.py is not a file" in out.stderr
    out = _score_cli("task=nosuchtask", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and "nosuchtask" in out.stderr and "Traceback" not in out.stderr


def test_score_cli_takes_flags_before_between_and_after_the_files(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("def priority(item, bins):\n    return -bins\n")
    (tmp_path / "secrets").mkdir()  # a secret's folder is masked whole: not beside good.py
    secret = str(tmp_path / "secrets" / "s")
    for args in (["--json", "task=binpacking", "task.weibull_items=200", str(good),
                  "--secret-file", secret],
                 ["task=binpacking", "--json", "task.weibull_items=200", "--secret-file", secret,
                  str(good)]):
        out = _score_cli(*args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        (row,) = [json.loads(line) for line in out.stdout.splitlines()]
        assert row["program"] == str(good) and row["passed"]


# -- a missing entry point is missing_entry_point in every task (issue 49) --------------------
NO_ENTRY = "import numpy as np\n\n\ndef estimate_centre(xs):\n    return float(np.median(xs))\n"


def test_a_program_without_the_entry_point_is_missing_entry_point_never_a_race(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaffold's scorer sends ~1 MB before it reads: a runner that fails at once (no
    `estimate`) used to close its pipe mid-send, and the program counted as killed
    (BrokenPipeError). Now the runner's own word is read after the broken pipe, every time."""
    scaffold("entry_demo", tmp_path)
    _on_path(tmp_path, monkeypatch)
    task = make_task(_target_="entry_demo.EntryDemoTask", name="entry_demo")
    with Sandbox.for_task(task, resources=Resources(workers=1)) as sb:
        evs = sb.evaluate_many([NO_ENTRY] * 12, task.context(0))
        broken = sb.evaluate("def estimate(xs:\n", task.context(0))
    assert {(ev.failure_kind, ev.message) for ev in evs} == {
        (FailureKind.MISSING_ENTRY_POINT.value, "the program defines no function named 'estimate'")}
    assert broken.failure_kind == FailureKind.SYNTAX_ERROR.value, broken.message  # likewise
    report = check_task(task, secrets=1)
    check = next(c for c in report.checks if c.name.startswith("a program without the entry"))
    assert check.status == "ok" and check.detail.startswith("missing_entry_point"), report.text()
    # atlas.score says the same (exit 1: the program failed)
    prog = tmp_path / "prog.py"
    prog.write_text(NO_ENTRY)
    out = subprocess.run([sys.executable, "-m", "atlas.score", "task=entry_demo",
                          "hydra.searchpath=[pkg://entry_demo.conf]", str(prog)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path),
                                                                          str(ROOT)])))
    assert out.returncode == 1 and "FAILED missing_entry_point" in out.stdout, out.stdout
    assert "the program defines no function named 'estimate'" in out.stdout


@pytest.mark.parametrize("task_name", ["bandit", "binpacking"])
def test_built_in_tasks_fail_a_program_without_its_entry_point_the_same_way(task_name) -> None:
    from atlas.tasks.checker import without_entry_point_program

    task = build_task(compose([f"task={task_name}"]))
    with Sandbox.for_task(task, resources=Resources(workers=1)) as sb:
        ev = sb.evaluate(without_entry_point_program(task.prompt_spec().entry_point),
                         task.context(0))
    assert ev.failure_kind == FailureKind.MISSING_ENTRY_POINT.value, ev.message


def test_the_checker_parses_the_seed_for_its_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed defining `estimate_centre` does not define `estimate` (the check used to be a
    substring test): the checker names what the seed defines, and the command exits 1."""
    _faulty(tmp_path, monkeypatch, "centre", "def estimate(xs):\n    \"\"\"The sample mean",
            "def estimate_centre(xs):\n    \"\"\"The sample mean", file="__init__.py")
    task = make_task(_target_="centre.CentreTask", name="centre")
    report = check_task(task, secrets=1)
    entry = next(c for c in report.checks if c.name == "entry point")
    assert entry.status == "fail"
    assert entry.detail == ("the seed program defines no top-level 'estimate' (it defines "
                            "estimate_centre); rename 'estimate_centre' to 'estimate', or set "
                            "PromptSpec.entry_point to the function it defines")
    seed = next(c for c in report.checks if c.name == "seed program passes")
    assert seed.status == "fail" and seed.detail.startswith("missing_entry_point"), seed.detail
    out = subprocess.run([sys.executable, "-m", "atlas.tasks", "check", "task=centre",
                          "hydra.searchpath=[pkg://centre.conf]", "--secrets", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path),
                                                                          str(ROOT)])))
    assert out.returncode == 1 and "FAIL  entry point: the seed program defines no top-level " \
        "'estimate' (it defines estimate_centre)" in out.stdout, out.stdout + out.stderr
    assert "BrokenPipeError" not in out.stdout
