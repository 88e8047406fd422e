"""The command lines of low packages live in ``atlas.commands``; ``python -m atlas.sandbox``
and ``python -m atlas.tasks`` still run them, with their exit statuses and one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("package", "commands"), [("atlas.sandbox", "{audit}"),
                                                   ("atlas.tasks", "{check,new}")])
def test_python_m_runs_the_packages_command(package: str, commands: str) -> None:
    out = _run(package, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {package} [-h] {commands}")


def test_bad_input_is_one_line_and_status_2(tmp_path: Path) -> None:
    out = _run("atlas.sandbox", "audit")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "atlas.sandbox audit: name the task: python -m atlas.sandbox audit task=<name> "
        "[hydra.searchpath=[pkg://<package>.conf]]"]
    out = _run("atlas.tasks", "new", "1bad", "--dir", str(tmp_path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("atlas.tasks new: task name '1bad' is invalid")


def test_new_writes_the_scaffold_that_imports_build_task_from_its_home(tmp_path: Path) -> None:
    out = _run("atlas.tasks", "new", "demo_task", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    test = (tmp_path / "demo_task" / "test_task.py").read_text()
    assert "from atlas.tasks import build_task\n" in test
    assert "from atlas.compose import compose\n" in test
