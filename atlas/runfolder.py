"""The run folder holds one run, made with one configuration.

A run folder is found again by its name (re-running a command resumes it), so a second
invocation with other settings would otherwise continue, or quietly return, a run whose
records say something else. ``prepare`` refuses that before anything is loaded, records the
configuration once, when a run starts from round 0 (``.hydra/config.yaml``; Hydra's own
per-invocation copy is switched off in ``conf/train.yaml``), and turns an unwritable folder
into one line naming the path and the fix.

One process per run folder: ``locked`` holds an exclusive ``flock`` on ``<run dir>/.lock`` for
the whole job, so a second command aimed at the folder (the same command twice, or two sweeps
launched into one sweep folder, whose jobs land in the same folders) stops in one line naming
the holder's PID, instead of writing every record twice. The kernel drops the lock when its
process dies (``kill -9`` included), so a crashed run resumes without anyone removing a stale
lock file; the PID written in the file is only read to name the holder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from atlas.atomic import write_text_atomic
from atlas.schema import ConfigError
from atlas.telemetry import EVENTS, PROGRAMS, dumps, restore_files

log = logging.getLogger("atlas.runfolder")

# keys that may differ between invocations of one run: how it is driven and where it is
# written or logged, never what it computes
INVOCATION_KEYS = ("resume", "progress", "device", "run_dir", "name", "experiment_name", "logger",
                   "sandbox.create_secret")
_SHOWN = 12  # differing keys listed in the error
LOCK_FILE = ".lock"  # held (flock) by the process running the run; holds its PID


class RunFolderError(ConfigError):
    """The run folder cannot hold this run (unwritable, or another configuration's run)."""


def check_writable(run_dir: Path) -> None:
    """Create ``run_dir`` and a file in it, or fail in one line naming the path and the fix."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".atlas-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        blocker = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
        where = f" ({blocker} is a file)" if blocker is not None and not blocker.is_dir() else ""
        raise RunFolderError(
            f"cannot write the run folder {run_dir}: {reason}{where}; choose a writable folder "
            f"with hydra.run.dir=<dir> (or run_dir=<dir>, hydra.sweep.dir=<dir> for -m), or run "
            f"from a writable working directory") from None


def _holder(fd: int) -> str:
    """The PID written in an open lock file, or "" (the holder has not written it yet)."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


@contextmanager
def locked(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block (the run), or raise ``RunFolderError`` naming the
    process that holds it and the fix. The folder must exist (``check_writable``)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise RunFolderError(f"cannot open the run folder's lock file {path}: "
                             f"{exc.strerror or exc}; choose a writable run folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            who = f"process {pid}" if pid else "another process"
            stop = f"stop it (kill {pid})" if pid else f"stop the process holding {path}"
            raise RunFolderError(
                f"run folder {run_dir} is in use by {who}, which is running this run; wait for "
                f"it to finish or {stop} and re-run to resume, or choose another run folder "
                f"with {new_folder_hint()}"
                f"{' (hydra.sweep.dir=<dir> under -m)' if 'name=' in new_folder_hint() else ''}"
                ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        try:
            yield path
        finally:
            try:
                os.ftruncate(fd, 0)  # released cleanly: no PID left to mislead anyone
            except OSError:
                pass
    finally:
        os.close(fd)  # drops the flock


class LogFilesHeld:
    """The root logger's file handlers (Hydra's ``<run dir>/train.log``), detached until this
    process holds the run folder's lock; what was logged meanwhile is replayed into them then.

    Why: Hydra opens ``train.log`` before atlas runs, so a second command refused because the
    folder is in use (or stopped by a mistake before the lock) wrote its lines into the log of
    the run that holds the folder. Refused, it writes to its own stderr only.
    """

    def __init__(self) -> None:
        self.root = logging.getLogger()
        self.files = [h for h in self.root.handlers if isinstance(h, logging.FileHandler)]
        self.records: list[logging.LogRecord] = []
        self.buffer = _Keep(self.records)
        for handler in self.files:
            self.root.removeHandler(handler)
        if self.files:
            self.root.addHandler(self.buffer)

    def release(self) -> None:
        """The lock is held: the files get what was logged so far, and all that follows."""
        if not self.files:
            return
        self.root.removeHandler(self.buffer)
        for handler in self.files:
            self.root.addHandler(handler)
            for record in self.records:
                if record.levelno >= handler.level:
                    handler.handle(record)
        self.files, self.records[:] = [], []

    def drop(self) -> None:
        """Never locked: the files stay untouched (closed; the process ends or Hydra's next job
        opens its own)."""
        self.root.removeHandler(self.buffer)
        for handler in self.files:
            handler.close()
        self.files = []


class _Keep(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


@contextmanager
def log_files_held() -> Iterator[LogFilesHeld]:
    """``LogFilesHeld`` for the block: released by the caller once locked, else dropped."""
    held = LogFilesHeld()
    try:
        yield held
    finally:
        held.drop()


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The resolved config the run in ``run_dir`` was started with (its first ``config`` event)."""
    path = Path(run_dir) / EVENTS
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        record = json.loads(first)
    except (OSError, ValueError):
        return None
    return record.get("config") if record.get("event") == "config" else None


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every leaf that differs, invocation keys excluded."""
    a, b = _leaves(old), _leaves(new)
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        if key in INVOCATION_KEYS or key.split(".")[0] in INVOCATION_KEYS:
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append((key, "<absent>" if va is missing else va,
                        "<absent>" if vb is missing else vb))
    return out


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as the ``config`` event stores it (JSON round trip: tuples become lists)."""

    return json.loads(dumps(OmegaConf.to_container(cfg, resolve=True)))


def new_folder_hint() -> str:
    """How to get a new run folder on this command line: ``name=<new>``, unless the command
    line gives the folder itself (``hydra.run.dir=``, or ``hydra.sweep.dir=`` under ``-m``),
    where ``name`` changes nothing."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return "name=<new>"
    given = {o.split("=", 1)[0].lstrip("+~") for o in hc.overrides.hydra}
    key = "hydra.sweep.dir" if hc.mode == RunMode.MULTIRUN else "hydra.run.dir"
    return f"{key}=<another dir>" if key in given else "name=<new>"


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpointed run that ``resume=true`` would continue."""
    return (Path(run_dir) / "checkpoint" / "state.pt").exists()


def _last_record(path: Path) -> dict[str, Any] | None:
    """The last line of a JSONL file as a record; None when the file does not end with a whole
    line (torn) or the line does not parse."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, end - (1 << 20)))
            data = fh.read()
    except OSError:
        return None
    if not data.endswith(b"\n"):
        return None
    try:
        record = json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def finished_results(run_dir: Path) -> dict[str, Any] | None:
    """The results of the finished run in ``run_dir``, or None when it has not finished.

    Why here: re-running a finished run's command must say so before a model or a sandbox is
    built (it took 11-15 s). A finished run's ``events.jsonl`` ends with its ``end`` record,
    which holds ``results.json``'s content, and both JSONL files end with a whole line: then
    no torch is imported. A folder that does not look so is read from its checkpoint: a
    finished run whose last lines were torn gets them back from it (or a warning naming what
    is lost, ``atlas.telemetry.restore_files``); an unfinished one is left to resume.
    """
    run_dir = Path(run_dir)
    if not holds_run(run_dir):
        return None
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None
    end = _last_record(run_dir / EVENTS)
    if (end is not None and end.get("event") == "end" and end.get("results") == results
            and _last_record(run_dir / PROGRAMS) is not None):
        return results
    from atlas import checkpoint  # deferred: torch, for a folder that does not look finished

    state = checkpoint.load(run_dir)
    if not state or not state.get("finished"):
        return None
    restore_files(run_dir, state.get("telemetry") or {})  # warns what it restored or lost
    return results


def check_same_config(cfg: DictConfig, run_dir: Path, *, resume: bool) -> None:
    """With ``resume`` (``Settings.run.resume``), refuse to resume (or return the results of)
    a run made with another configuration than ``cfg``."""
    if not resume or not holds_run(run_dir):
        return
    old = recorded_config(run_dir)
    if old is None:
        log.warning("%s holds a checkpoint but no recorded config (%s); cannot check that it "
                    "was made with this configuration", run_dir, EVENTS)
        return
    diff = differences(old, _resolved(cfg))
    if not diff:
        return
    shown = ", ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, a, b in diff[:_SHOWN])
    more = f" and {len(diff) - _SHOWN} more" if len(diff) > _SHOWN else ""
    raise RunFolderError(
        f"{run_dir} holds a run made with another configuration ({shown}{more}); re-run with "
        f"its settings to continue it, add {new_folder_hint()} for a new run folder, or "
        f"resume=false to overwrite it")


def record_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write ``.hydra/config.yaml`` (and, under Hydra, ``overrides.yaml`` / ``hydra.yaml``)
    for a run starting at round 0; a resumed or finished run keeps the files it started with."""
    folder = Path(run_dir) / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    files = {"config.yaml": OmegaConf.to_yaml(cfg)}
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        files["overrides.yaml"] = OmegaConf.to_yaml(hc.overrides.task)
        files["hydra.yaml"] = OmegaConf.to_yaml(OmegaConf.create({"hydra": hc}))
    except ValueError:  # not running under Hydra (tests call atlas.train.run directly)
        pass
    for name, text in files.items():
        write_text_atomic(folder / name, text)


def prepare(cfg: DictConfig, run_dir: Path, *, resume: bool) -> None:
    """Everything about a writable, locked run folder (``check_writable``, ``locked``) that
    must hold before a model is loaded: ``cfg``, the composed config, is compared with the
    recorded one and recorded; ``resume`` is ``Settings.run.resume``."""
    check_same_config(cfg, run_dir, resume=resume)
    if not (resume and holds_run(run_dir)):
        record_config(cfg, run_dir)


class RunFolderCallback(Callback):
    """Hydra callback: check the run (or sweep) folder before Hydra creates it, so that an
    unwritable one ends in one line instead of a traceback from inside Hydra (which would
    only warn about an exception raised here, hence the exit)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        try:
            folder = OmegaConf.select(config, key)
        except Exception:  # noqa: BLE001 - an interpolation Hydra resolves later; it checks then
            return
        if not folder:
            return
        try:
            check_writable(Path(str(folder)))
        except RunFolderError as exc:  # Hydra turns a callback's exception into a warning
            print(f"Error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
