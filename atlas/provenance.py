"""Where a run came from: the code, the libraries, the machine, the dtype and device used.

Why: two runs of one table can differ in any of these (a dirty tree, another transformers,
bf16 on one machine and fp32 on another) and their numbers then compare less well than the
table says. ``results.json`` and the W&B config hold this record; ``atlas.report`` shows it
per arm and warns when the runs of one table differ (``differences``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the libraries whose versions change what a run computes
LIBRARIES = ("torch", "transformers", "peft", "lightning", "jax")


@functools.lru_cache(maxsize=1)
def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(commit, whether the tree has uncommitted changes) of the atlas checkout; (None, None)
    outside a git checkout (an installed wheel)."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def versions() -> dict[str, str | None]:
    """Installed version of each of ``LIBRARIES`` (None: not installed), without importing them."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's word elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class LoadMeter:
    """How busy the machine was while a run ran, beside the run's own use of it: the load
    average at start and end, and the CPU seconds of this process tree (live descendants and
    those reaped: the sandbox workers and candidates). A load well above ``own_load`` means
    something else shared the cores, so the run's seconds are no timing."""

    def __init__(self) -> None:
        self.start_load = _loadavg()
        self.start_cpu = _cpu_seconds()
        self.start_wall = time.monotonic()

    def record(self) -> dict[str, Any]:
        wall = time.monotonic() - self.start_wall
        cpu = _cpu_seconds() - self.start_cpu
        return {"loadavg_start": self.start_load, "loadavg_end": _loadavg(),
                "own_cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
                "own_load": round(cpu / wall, 2) if wall > 0 else None,
                "cores": os.cpu_count()}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return None


def _cpu_seconds() -> float:
    """CPU seconds of this process and every descendant, live or reaped (a reaped process's
    time sits in its parent's ``children_*``)."""
    import psutil  # deferred: only a run's start and end need it

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # ended meanwhile: its time went to its parent
            continue
    return total


def provenance(device: str, dtype: str) -> dict[str, Any]:
    """The record of this process: git commit and dirty flag, library versions, CPU and GPU
    model, and the ``device`` and ``dtype`` the agent actually used."""
    commit, dirty = git_state()
    gpu = None
    if str(device).startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(torch.device(device))
    return {"git_commit": commit, "git_dirty": dirty, "versions": versions(),
            "python": platform.python_version(), "cpu": cpu_model(), "gpu": gpu,
            "device": str(device), "dtype": str(dtype)}


def flat(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A provenance record as one level (``versions.torch``), for comparing and printing."""
    out: dict[str, Any] = {}
    for key, value in (record or {}).items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def differences(records: Sequence[Mapping[str, Any] | None]) -> dict[str, list[Any]]:
    """``{field: [its distinct values]}`` for the fields in which the runs' records differ
    (a run without a record counts as ``None`` in every field)."""
    flats = [flat(r) for r in records]
    keys = sorted({k for f in flats for k in f})
    out: dict[str, list[Any]] = {}
    for key in keys:
        values: list[Any] = []
        for f in flats:
            if f.get(key) not in values:
                values.append(f.get(key))
        if len(values) > 1:
            out[key] = values
    return out
