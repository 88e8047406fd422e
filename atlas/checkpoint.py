"""Atomic, per-round checkpoints so that a killed run loses at most the round in flight.

One file, ``checkpoint/state.pt``, written to a temporary name and renamed into place
(``os.replace`` is atomic on POSIX): a ``kill -9`` mid-write leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FILENAME = "state.pt"


def rng_state() -> dict[str, Any]:
    """Every random-number generator the loop draws from."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically under ``run_dir/checkpoint``."""
    folder = Path(run_dir) / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / FILENAME
    tmp = folder / f".{FILENAME}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load(run_dir: Path) -> dict[str, Any] | None:
    """The last complete checkpoint of ``run_dir``, or ``None`` for a fresh run."""
    path = Path(run_dir) / "checkpoint" / FILENAME
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
