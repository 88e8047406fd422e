"""Experiment loggers, built from the ``logger`` config group with Hydra's ``instantiate``.

A logger YAML names a factory (or a Lightning logger class) in ``_target_``; its other fields
are the factory's keyword arguments. Two call-time arguments are passed to a factory whose
signature accepts them: ``run_dir`` (the job's run folder) and ``run_config`` (the resolved
config as a dict). A Lightning logger class that takes neither can still reach the run
folder through interpolation (``save_dir: ${run_dir}``), e.g. in your package's
``conf/logger/csv.yaml``::

    _target_: lightning.pytorch.loggers.CSVLogger
    name: csv
    save_dir: ${run_dir}

``name: none`` (``conf/logger/none.yaml``) means no logger: the run folder's JSONL files are
written either way. A config without ``_target_`` but with ``name: wandb`` (as in run folders whose recorded
config has no ``_target_``) builds the W&B logger.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WANDB_TARGET = "atlas.loggers.wandb_logger"


@dataclass(frozen=True)
class LoggerSpec:
    """The run's logger as validated (``Settings.logger``): the factory or Lightning logger
    class its ``_target_`` names, and the YAML's other fields, its keyword arguments."""

    target: str
    fields: Mapping[str, Any]


def logger_spec(node: Mapping[str, Any]) -> LoggerSpec | None:
    """The ``logger`` group (resolved, as plain data) as a ``LoggerSpec``; None for
    ``logger.name=none``, a ValueError naming the fix for a logger with no ``_target_``."""
    if node.get("name") == "none":
        return None
    target = node.get("_target_") or (WANDB_TARGET if node.get("name") == "wandb" else None)
    if target is None:
        raise ValueError(f"logger.name={node.get('name')!r} has no `_target_`: give the logger's "
                         "YAML `_target_: <package.module.factory_or_class>`, or use "
                         "logger=wandb / logger=none")
    return LoggerSpec(target=str(target), fields={k: v for k, v in node.items()
                                                  if k != "_target_"})


def builtin(node: Mapping[str, Any]) -> bool:
    """True for the loggers atlas's own schema checks (wandb, none): no ``_target_`` or
    ours; a logger with another ``_target_`` is checked by its factory."""
    return (node.get("_target_") or WANDB_TARGET) == WANDB_TARGET


def wandb_logger(run_dir: Path, run_config: Mapping[str, Any], name: str = "wandb",
                 mode: str = "offline", project: str = "atlas", entity: str | None = None,
                 group: str | None = None) -> Any:
    """Lightning's W&B logger, offline unless configured otherwise; one W&B run per job,
    grouped by the sweep folder so a multirun shows up as one group. ``name`` is the config
    option's name, not the W&B run's (that is the run folder's name)."""
    os.environ.setdefault("WANDB_MODE", str(mode))
    os.environ.setdefault("WANDB_SILENT", "true")
    from lightning.pytorch.loggers import WandbLogger

    run_dir = Path(run_dir)
    # the run folder fixes the W&B run id, so a resumed job continues its W&B run
    run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    method = (run_config.get("method") or {}).get("name")
    logger = WandbLogger(project=project, entity=entity, group=group or _sweep_group(),
                         name=run_dir.name, save_dir=str(run_dir), job_type=method,
                         config=dict(run_config), id=run_id, resume="allow",
                         offline=os.environ["WANDB_MODE"] == "offline")
    # Lightning passes anonymous=None to wandb.init, which then prints that the (removed)
    # setting has no effect: leave it unset
    logger._wandb_init.pop("anonymous", None)
    return logger


def make_logger(spec: LoggerSpec | None, run_dir: Path, run_config: Mapping[str, Any]) -> Any:
    """The logger ``spec`` describes (``Settings.logger``), or None for ``logger.name=none``;
    ``run_config``: the resolved config the run records."""
    if spec is None:
        return None
    target = spec.target
    from hydra.utils import get_method, instantiate

    try:
        factory = get_method(target) if target != WANDB_TARGET else wandb_logger
    except Exception as exc:  # ImportError, AttributeError: name the field and the fix
        raise ValueError(f"logger._target_={target!r} cannot be imported ({exc}); install or "
                         "path-add its package, or fix the path") from exc
    offered = {"run_dir": run_dir, "run_config": run_config}
    params = inspect.signature(factory).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    extra = {k: v for k, v in offered.items() if takes_all or k in params}
    # _partial_: the call-time arguments stay plain Python objects (not merged into a config)
    build = instantiate({"_target_": target, "_partial_": True, "_recursive_": False,
                         **spec.fields})
    return build(**extra)


def _sweep_group() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return Path(hc.sweep.dir).name
    except ValueError:  # not running under Hydra (tests call run() directly)
        pass
    return None


def finish_logger(logger: Any, status: str = "success") -> None:
    """Close this job's logger. Hydra's basic launcher runs a sweep's jobs one after another
    in ONE process: without ``wandb.finish`` the next job would log into this job's W&B run."""
    if logger is None:
        return
    logger.finalize(status)
    if type(logger).__name__ == "WandbLogger":
        import wandb

        wandb.finish(exit_code=0 if status == "success" else 1)
