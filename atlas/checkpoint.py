"""Atomic, per-round checkpoints so that a killed run loses at most the round in flight.

One file, ``checkpoint/state.pt``, written to a temporary name and renamed into place
(``os.replace`` is atomic on POSIX): a ``kill -9`` mid-write leaves the previous
checkpoint intact, and the half-written temporary file it leaves behind is never read
(``load`` reads only ``state.pt`` and removes such leftovers).

What a checkpoint must hold for a resumed run to equal an uninterrupted one is listed in
``EvolutionLoop.state_dict``; the random-number generators are saved here (``rng_state``).
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.errors import CompactHydraException

from atlas.atomic import write_atomic
from atlas.interrupt import held

log = logging.getLogger("atlas.checkpoint")

FILENAME = "state.pt"
TMP_GLOB = f".{FILENAME}.*.tmp"  # what save() writes before the rename


class CheckpointError(RuntimeError, CompactHydraException):
    """A checkpoint that cannot be resumed from; the message names the file and the fix (on
    the command line, one line: no traceback)."""


def rng_state() -> dict[str, Any]:
    """Every global random-number generator the loop may draw from (CUDA ones when in use).

    Sampling and DPO use their own seeded generators (per round / per phase); the globals
    are saved too so that any code path that does draw from them resumes identically.
    """
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved (CUDA states only where this process uses CUDA)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            log.warning("checkpoint holds %d CUDA RNG states but %d GPUs are visible; "
                        "CUDA generators are not restored", len(cuda), torch.cuda.device_count())
        else:
            torch.cuda.set_rng_state_all(cuda)


def save(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically under ``run_dir/checkpoint``; on failure (a full disk) the
    previous checkpoint stays and the temporary file is removed (``atlas.atomic``). A stop
    signal waits for the write to end (``atlas.interrupt.held``)."""
    folder = Path(run_dir) / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    with held():
        return write_atomic(folder / FILENAME, lambda fh: torch.save(state, fh),
                            tmp=folder / f".{FILENAME}.{os.getpid()}.tmp", fsync=True)


def stale_tmp_files(run_dir: Path) -> list[Path]:
    """Temporary files a process killed inside ``save`` left behind (never complete)."""
    folder = Path(run_dir) / "checkpoint"
    return sorted(folder.glob(TMP_GLOB)) if folder.is_dir() else []


def load(run_dir: Path) -> dict[str, Any] | None:
    """The last complete checkpoint of ``run_dir``, or ``None`` for a fresh run.

    Leftover temporary files of an interrupted ``save`` are ignored and removed: only a file
    that reached ``os.replace`` is complete. A ``state.pt`` that cannot be read (a disk
    fault, a copy cut short) raises instead of silently restarting the run from round 0.
    """
    for tmp in stale_tmp_files(run_dir):
        log.warning("removing %s: an interrupted checkpoint write (the previous checkpoint "
                    "is intact)", tmp)
        tmp.unlink(missing_ok=True)
    path = Path(run_dir) / "checkpoint" / FILENAME
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling error means the same thing
        why = (str(exc).strip().splitlines() or [""])[0]  # one line: some errors span many
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {why}); "
                              f"delete {path.parent} to restart this run from round 0, or pass "
                              f"resume=false") from None
    if not isinstance(state, dict) or "next_round" not in state:
        raise CheckpointError(f"checkpoint {path} holds no run state (no 'next_round'); it was "
                              f"not written by atlas: delete {path.parent} or pass resume=false")
    return migrate(state)


def migrate(state: dict[str, Any]) -> dict[str, Any]:
    """Bring a checkpoint of an older format to today's (the next ``save`` writes it so).

    Promotions used to wait for the next phase's start: such a checkpoint holds the accepted
    candidate as ``finetuner.reference_swap.pending`` beside the old ``ref``. Today the
    reference callback promotes inside the phase, so the pending tensors are the reference:
    they become ``adapters.ref``.
    """
    tuner = state.get("finetuner")
    if isinstance(tuner, dict) and "reference_swap" in tuner:
        pending = (tuner.pop("reference_swap") or {}).get("pending")
        if pending is not None:
            state["adapters"]["ref"] = pending
            log.info("checkpoint: the promotion it had queued is now its reference")
    return state
