"""Re-running a finished run's command (issue 49): it says so before a model, a sandbox or
torch loads; a finished run whose last lines were torn gets them back from its checkpoint;
``atlas.report`` says why a run's count is short."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["experiment=test", "method=evotune", "progress=false", "explore.rounds=2", "explore.phase_every=2",
        "task.T=200", "task.env_seeds=[0]"]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}


def _train(run: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *extra, "-m", "atlas.train", *ARGS,
                           f"hydra.run.dir={run}"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=900)
    return proc, time.perf_counter() - t0


def _summary(out: str) -> list[str]:
    return [line for line in out.splitlines()
            if line.startswith(("ATLAS run:", "  ")) and not line.startswith("  outputs in ")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    run = tmp_path_factory.mktemp("rerun") / "run"
    proc, _ = _train(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, _summary(proc.stdout)


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_a_finished_run_is_recognised_before_anything_loads(finished, tmp_path) -> None:
    run, summary = finished
    copy = _copy(run, tmp_path)
    before = {p.name: p.read_bytes() for p in (copy / "events.jsonl", copy / "programs.jsonl")}
    proc, took = _train(copy, "-X", "importtime")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _summary(proc.stdout) == summary  # the same summary, from results.json
    assert "already holds a finished run" in proc.stdout + proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & {"torch", "transformers", "lightning", "wandb"}, "loaded for nothing"
    assert "sandbox isolation:" not in proc.stdout + proc.stderr  # no sandbox was built
    assert {p.name: p.read_bytes() for p in (copy / "events.jsonl", copy / "programs.jsonl")} \
        == before
    assert took < 30, took  # ~2 s on an idle machine (11-15 s when the model loaded first)


def test_a_finished_run_gets_its_torn_lines_back(finished, tmp_path) -> None:
    """Each JSONL file loses its last bytes after the run ended (a copy cut short, a disk
    fault): the re-run restores them byte for byte from the checkpoint, and says so."""
    run, summary = finished
    copy = _copy(run, tmp_path)
    whole = {name: (copy / name).read_bytes() for name in ("events.jsonl", "programs.jsonl")}
    for name, cut in (("events.jsonl", 5), ("programs.jsonl", 10)):
        with open(copy / name, "r+b") as fh:
            fh.truncate(len(whole[name]) - cut)
    proc, _ = _train(copy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _summary(proc.stdout) == summary
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "restored it" in line]
    assert len(said) == 2 and all("shorter than its checkpoint recorded (a torn last line); "
                                  "restored it from the checkpoint" in x for x in said), said
    assert {name: (copy / name).read_bytes() for name in whole} == whole


def test_the_report_says_why_a_count_is_short(finished, tmp_path) -> None:
    run, _ = finished
    copy = _copy(run, tmp_path / "sweep")
    candidates = json.loads((copy / "results.json").read_text())["candidates"]
    text = (copy / "programs.jsonl").read_bytes()
    (copy / "programs.jsonl").write_bytes(text[:-10])
    out = subprocess.run([sys.executable, "-m", "atlas.report", str(tmp_path / "sweep"),
                          "--out", str(tmp_path / "report")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"warning: {copy}: programs.jsonl holds {candidates - 1} of the {candidates} "
            f"candidates its end record counts (torn last line in programs.jsonl); re-run its "
            f"command: a finished run gets its lines back from its checkpoint") in out.stderr
    events = (copy / "events.jsonl").read_bytes()
    (copy / "events.jsonl").write_bytes(events[:-5])
    out = subprocess.run([sys.executable, "-m", "atlas.report", str(tmp_path / "sweep"),
                          "--out", str(tmp_path / "report")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert f"warning: {copy}: no end record, so its counts stop at round 2 (torn last line " \
           f"in events.jsonl, programs.jsonl)" in out.stderr, out.stderr[-3000:]
