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

W&B online is checked at start (``wandb_problem``, from ``atlas.config.validate``): a key and a
server that answers, within seconds, where wandb itself would wait 90 s and end in a traceback.
A server lost during a run is said once (``ServerWatch``); the run goes on, wandb keeps what it
logs in the run folder for ``wandb sync``, and gives the upload at most ``FINISH_TIMEOUT_S``
at the end.
"""

from __future__ import annotations

import configparser
import hashlib
import inspect
import logging
import netrc
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from atlas.reach import unreachable

WANDB_TARGET = "atlas.loggers.wandb_logger"
WANDB_URL = "https://api.wandb.ai"  # wandb's own default server
#: seconds the W&B server may take to answer the start-up check (and each check in a run)
PROBE_TIMEOUT_S = 3.0
#: seconds between checks of the server during an online run
WATCH_EVERY_S = 60.0
#: seconds an online run's end waits for W&B's upload; the rest stays on disk for `wandb sync`
FINISH_TIMEOUT_S = 120.0

log = logging.getLogger("atlas.loggers")


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


# -- W&B online: checked at start, watched during the run ----------------------------------------
def wandb_mode(fields: Mapping[str, Any]) -> tuple[str, str]:
    """(the mode wandb will run in, what set it): ``WANDB_MODE`` overrides ``logger.mode``, as
    ``wandb_logger`` does; wandb's ``run`` is ``online`` and ``dryrun`` is ``offline``."""
    env = os.environ.get("WANDB_MODE")
    mode = env or str(fields.get("mode") or "offline")
    mode = {"run": "online", "dryrun": "offline"}.get(mode, mode)
    return mode, (f"WANDB_MODE={env}" if env else f"logger.mode={mode}")


def wandb_url() -> str:
    """The W&B server wandb talks to: ``WANDB_BASE_URL``, else ``base_url`` in wandb's settings
    file (``wandb login --host``), else W&B's cloud."""
    if url := os.environ.get("WANDB_BASE_URL"):
        return url.rstrip("/")
    folder = os.environ.get("WANDB_CONFIG_DIR") or os.path.expanduser("~/.config/wandb")
    settings = configparser.ConfigParser()
    try:
        settings.read(os.path.join(folder, "settings"))
        return settings.get("default", "base_url", fallback=WANDB_URL).rstrip("/")
    except configparser.Error:
        return WANDB_URL


def netrc_path() -> Path:
    """The netrc file wandb reads keys from (``NETRC``, else ``~/.netrc``)."""
    return Path(os.environ.get("NETRC") or "~/.netrc").expanduser()


def wandb_key_source(url: str) -> str | None:
    """Where wandb would find an API key for ``url`` (its lookup order), or None."""
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE"
    try:
        found = netrc.netrc(str(netrc_path())).authenticators(urlparse(url).netloc)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(netrc_path()) if found and found[2] else None


def wandb_problem(spec: LoggerSpec | None) -> str | None:
    """One line when ``logger=wandb`` would run online without an API key or a server that
    answers within ``PROBE_TIMEOUT_S``, naming the fix; None otherwise (offline, disabled,
    another logger, or all is well). No wandb import: it answers in seconds."""
    if spec is None or spec.target != WANDB_TARGET:
        return None
    mode, source = wandb_mode(spec.fields)
    if mode != "online":
        return None
    offline = ("WANDB_MODE=offline" if source.startswith("WANDB_MODE")
               else "logger.mode=offline (or WANDB_MODE=offline)")
    url = wandb_url()
    if wandb_key_source(url) is None:
        return (f"logger=wandb runs online ({source}) but no W&B API key is set for {url} "
                f"(WANDB_API_KEY, or {netrc_path()}); run `wandb login` once, or log offline "
                f"with {offline} and upload later with `wandb sync`")
    if why := unreachable(url, PROBE_TIMEOUT_S, http=True):
        return (f"logger=wandb runs online ({source}) but the W&B server {why}; log offline with "
                f"{offline} and upload later with `wandb sync <run dir>/wandb/offline-run-*`, "
                f"or set WANDB_BASE_URL to a server that answers")
    return None


class ServerWatch:
    """Checks an online run's W&B server at most every ``every_s`` seconds, and says once
    when it stopped answering. Why: wandb keeps logging into the run folder and retries the
    upload by itself, but says nothing a user would see; the run must neither stop nor hang."""

    def __init__(self, url: str, folder: Path, every_s: float = WATCH_EVERY_S,
                 timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.url, self.folder, self.every_s, self.timeout_s = url, folder, every_s, timeout_s
        self.lost: str | None = None
        self._next = time.monotonic() + every_s

    def check(self) -> None:
        if self.lost is not None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        if why := unreachable(self.url, self.timeout_s, http=True):
            self.lost = why
            log.warning("W&B: the server %s; the run goes on, and W&B keeps what it logs in %s "
                        "(upload it with `wandb sync %s` once the server answers)", why,
                        self.folder, self.folder / "latest-run")


def _watched(logger: Any, watch: ServerWatch) -> Any:
    """``logger`` (a WandbLogger) with ``watch`` checked before each ``log_metrics``."""
    send = logger.log_metrics

    def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
        watch.check()
        send(metrics, step)

    logger.log_metrics = log_metrics
    logger.server_watch = watch
    return logger


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
    online = wandb_mode({"mode": mode})[0] == "online"
    extra: dict[str, Any] = {}
    if online:  # the end of a run whose server went away must not wait for it forever
        import wandb

        extra["settings"] = wandb.Settings(finish_timeout=FINISH_TIMEOUT_S)
    logger = WandbLogger(project=project, entity=entity, group=group or _sweep_group(),
                         name=run_dir.name, save_dir=str(run_dir), job_type=method,
                         config=dict(run_config), id=run_id, resume="allow",
                         offline=os.environ["WANDB_MODE"] == "offline", **extra)
    # Lightning passes anonymous=None to wandb.init, which then prints that the (removed)
    # setting has no effect: leave it unset
    logger._wandb_init.pop("anonymous", None)
    if online:
        return _watched(logger, ServerWatch(wandb_url(), run_dir / "wandb"))
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
