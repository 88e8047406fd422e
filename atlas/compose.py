"""The run's config outside ``python -m atlas.train``: the same ``conf/``, overrides and
``hydra.searchpath``, so ``atlas.score`` and ``atlas.tasks check`` build exactly the task a run
builds. Also the one check Hydra does badly: a ``pkg://`` search path whose package cannot
be imported (Hydra says only "Could not find 'task/<name>'").
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parents[1] / "conf"

_PKG = re.compile(r"pkg\\?://([A-Za-z_][\w.]*)")  # pkg\:// : as a sweep's jobs carry it


def searchpath_problem(overrides: list[str]) -> str | None:
    """One line naming a ``pkg://`` entry of ``hydra.searchpath`` whose package cannot be
    imported, and the fix; None when every one can."""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") != "hydra.searchpath":
            continue
        for package in _PKG.findall(value):
            try:
                found = importlib.util.find_spec(package) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                top = package.split(".")[0]
                return (f"hydra.searchpath: pkg://{package} cannot be imported (no package "
                        f"{package!r} on the Python path); run with PYTHONPATH=<the folder "
                        f"that holds {top}/>, or pip install -e your package")
    return None


def compose(overrides: list[str]) -> Any:
    """The composed ``train`` config for ``overrides`` (as on the command line), without the
    run-folder fields that need a running Hydra job. ValueError: a one-line cause."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from atlas.config import group_problem, override_problem

    problem = (searchpath_problem(overrides) or group_problem(overrides)
               or override_problem(overrides))
    if problem:
        raise ValueError(problem)
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose("train", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ValueError(" ".join(str(exc).split())) from None


def build_task(cfg: Any) -> Any:
    """The task a run of ``cfg`` builds (``cfg.task`` resolved, fields checked)."""
    from omegaconf import OmegaConf

    from atlas.tasks import make_task

    return make_task(**OmegaConf.to_container(cfg.task, resolve=True))
