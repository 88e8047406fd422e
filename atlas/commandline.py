"""``python -m atlas.train``'s command line, checked before Hydra runs, and its exit statuses.

Why before Hydra: Hydra answers a flag it does not know with a usage block, an override its
grammar refuses with ``mismatched input '<EOF>' expecting {...}`` naming no override, and a YAML
mistake with PyYAML's traceback. Here each is one line that names the flag, override or file
and the fix, with the exit status of a mistake (``MISTAKE``).

Exit statuses (docs/cli.md, "Exit status"), one per kind of ending:

- ``0``: the run finished, or had finished before (its summary is printed again);
- ``1`` (``FAILED``): the run stopped on an error after it started: the task is broken, the
  disk filled up, or a bug in atlas (a traceback); in a sweep, a job that failed;
- ``2`` (``MISTAKE``): refused before anything started, in one line naming the fix: a mistake
  in the command, the config or a YAML file, or something the run needs that is missing or
  busy (its run folder in use, a server that does not answer, weights, a GPU);
- ``130`` / ``143``: stopped by SIGINT (Ctrl-C) / SIGTERM, the last finished round kept.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atlas.compose import (
    compose_problem,
    group_problem,
    groups,
    override_problem,
    schema,
    searchpath_problem,
)
from atlas.overrides import CommandLine, grammar_problem, modes_problem, split
from atlas.schema import ConfigError
from atlas.sweep import check_sweep, sweep_jobs

FAILED = 1
MISTAKE = ConfigError.exit_status  # 2

#: Hydra's flags that stop before a job runs (help, completion, versions)
_NO_JOB = ("--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--info",
           "-i")


# -- flags Hydra does not know ----------------------------------------------------------------
def _fields() -> list[str]:
    """Every ``group.field`` (and top-level field) a YAML of ``conf/`` defines."""
    out: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            out.append(path)
            if isinstance(value, dict):
                walk(value, f"{path}.")

    walk(schema(), "")
    return out


def meant_override(flag: str, value: str | None) -> str:
    """The override an argparse-style ``--flag value`` probably meant (``--rounds 3`` ->
    ``explore.rounds=3``, ``--method atlas`` -> ``method=atlas``)."""
    name = flag.lstrip("-").replace("-", "_")
    shown = value if value is not None else "<value>"
    if name in groups():
        return f"{name}={shown}"
    fields = _fields()
    if name in fields:  # a top-level field (seed, device, resume, ...)
        return f"{name}={shown}"
    exact = [f for f in fields if f.endswith(f".{name}")]
    if not exact:
        close = difflib.get_close_matches(name, [f.rsplit(".", 1)[-1] for f in fields], n=1)
        exact = [f for f in fields if close and f.rsplit(".", 1)[-1] == close[0]]
    if not exact:
        return f"{name}={shown}"
    exact.sort(key=lambda f: (f.count("."), f))
    return " or ".join(f"{f}={shown}" for f in exact[:3])


def flag_problem(line: CommandLine) -> str | None:
    """One line for the first flag Hydra does not know, naming the override it probably meant."""
    if not line.unknown:
        return None
    flag, value = line.unknown[0]
    return (f"{flag} is not an option of python -m atlas.train: settings are overrides written "
            f"key=value, without dashes; did you mean {meant_override(flag, value)}? "
            f"(python -m atlas.train --help lists the groups, docs/configuration.md every field)")


# -- all of them, in order ---------------------------------------------------------------------
def problem(argv: Sequence[str]) -> str | None:
    """The one line for the first mistake on this command line that Hydra would report badly
    (or, for a sweep, for the first job that would fail at start); None when there is none.

    Order: flags and grammar (no file read), then the search path and the group and option
    names, then the YAML files the config is composed from (a file that does not parse is
    absent from the known keys), then the keys, then every job of a sweep.
    """
    line = split(argv)
    if found := (flag_problem(line) or modes_problem(line)
                 or grammar_problem(line.overrides, groups())):
        return found
    if any(f in line.flags for f in _NO_JOB):
        return None
    overrides = line.overrides
    config_dir = line.flag("--config-dir", "-cd")
    if config_dir and not Path(config_dir).is_dir():
        return (f"--config-dir {config_dir}: no such folder; give the folder that holds your "
                f"config groups (e.g. DIR/experiment/mine.yaml for experiment=mine)")
    if found := searchpath_problem(overrides) or group_problem(
            [*overrides, *([f"--config-dir={config_dir}"] if config_dir else [])]):
        return found
    job: list[str] | None = list(overrides)
    if line.sweep:  # its first job's files (every job's are composed by check_sweep)
        try:
            jobs = sweep_jobs(overrides)
        except Exception:  # noqa: BLE001 - a sweeper of its own: Hydra expands it
            jobs = []
        job = jobs[0] if jobs else None
    if job is not None and not line.flag("--config-path", "-cp") and (found := compose_problem(
            job, config_dir, line.flag("--config-name", "-cn") or "train")):
        return found
    if config_dir is None and (found := override_problem(overrides)):
        return found
    if line.sweep and not line.flags.keys() - {"-m", "--multirun"}:
        return check_sweep(overrides)
    return None
