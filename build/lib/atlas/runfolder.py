"""The run folder holds one run, made with one configuration.

A run folder is found again by its name (re-running a command resumes it), so a second
invocation with other settings would otherwise continue, or quietly return, a run whose
records say something else. ``prepare`` refuses that before anything is loaded, records the
configuration once, when a run starts from round 0 (``.hydra/config.yaml``; Hydra's own
per-invocation copy is switched off in ``conf/train.yaml``), and turns an unwritable folder
into one line naming the path and the fix.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from atlas.config import ConfigError
from atlas.telemetry import EVENTS

log = logging.getLogger("atlas.runfolder")

# keys that may differ between invocations of one run: how it is driven and where it is
# written or logged, never what it computes
INVOCATION_KEYS = ("resume", "progress", "device", "run_dir", "name", "experiment_name", "logger")
_SHOWN = 12  # differing keys listed in the error


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
        if key.split(".")[0] in INVOCATION_KEYS:
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append((key, "<absent>" if va is missing else va,
                        "<absent>" if vb is missing else vb))
    return out


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as the ``config`` event stores it (JSON round trip: tuples become lists)."""
    from atlas.telemetry import dumps

    return json.loads(dumps(OmegaConf.to_container(cfg, resolve=True)))


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpointed run that ``resume=true`` would continue."""
    return (Path(run_dir) / "checkpoint" / "state.pt").exists()


def check_same_config(cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to resume (or return the results of) a run made with another configuration."""
    if not cfg.resume or not holds_run(run_dir):
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
        f"its settings to continue it, add name=<new> for a new run folder, or resume=false to "
        f"overwrite it")


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
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)


def prepare(cfg: DictConfig, run_dir: Path) -> None:
    """Everything about the run folder that must hold before a model is loaded."""
    check_writable(run_dir)
    check_same_config(cfg, run_dir)
    if not (cfg.resume and holds_run(run_dir)):
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
