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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAILED = 1
MISTAKE = 2

#: Hydra's flags that stop before a job runs (help, completion, versions)
_NO_JOB = ("--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--info",
           "-i")
_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
_MODES = ("--run", "-r", "--multirun", "-m", "--cfg", "-c", "--info", "-i", "--shell-completion",
          "-sc")


@dataclass(frozen=True)
class CommandLine:
    """The command line split as Hydra reads it: its flags (with their values) and overrides."""

    flags: dict[str, str | None]
    overrides: list[str]
    unknown: list[tuple[str, str | None]]  # (flag, its value: ``--rounds 3`` or ``--rounds=3``)
    flag_items: list[str]  # Hydra's flags with their values, as typed

    def hoisted(self) -> list[str]:
        """Flags first, then the overrides: Hydra's parser needs that on Python < 3.12, where
        argparse cannot split positionals around a flag (``task=pinn -m seed=0,1``)."""
        return [*self.flag_items, *self.overrides]

    @property
    def sweep(self) -> bool:
        return "--multirun" in self.flags or "-m" in self.flags

    def flag(self, *names: str) -> str | None:
        return next((self.flags[n] for n in names if self.flags.get(n)), None)


def _hydra_flags() -> dict[str, Any]:
    """Hydra's flags -> how many values each takes (argparse's ``nargs``)."""
    from hydra._internal.utils import get_args_parser

    return {name: action for action in get_args_parser()._actions
            for name in action.option_strings}


def split(argv: Sequence[str]) -> CommandLine:
    """``argv`` (without the program) as flags, overrides and flags Hydra does not know."""
    known = _hydra_flags()
    flags: dict[str, str | None] = {}
    overrides: list[str] = []
    unknown: list[tuple[str, str | None]] = []
    flag_items: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        start = i
        i += 1
        if not item.startswith("-") or len(item) < 2 or item[1].isdigit():
            overrides.append(item)
            continue
        name, eq, value = item.partition("=")
        action = known.get(name)
        if action is None:
            if not eq and i < len(items) and "=" not in items[i] and not items[i].startswith("-"):
                value, i = items[i], i + 1
            unknown.append((name, value if eq or value else None))
            flag_items += items[start:i]
            continue
        if not eq and action.nargs is None and i < len(items):
            value, i = items[i], i + 1
        elif not eq and action.nargs == "?" and i < len(items) and items[i] in (action.choices or ()):
            value, i = items[i], i + 1
        flags[name] = value or None
        flag_items += items[start:i]
    return CommandLine(flags, overrides, unknown, flag_items)


# -- flags Hydra does not know ----------------------------------------------------------------
def _fields() -> list[str]:
    """Every ``group.field`` (and top-level field) a YAML of ``conf/`` defines."""
    from atlas.compose import schema

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
    from atlas.compose import groups

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


def _modes_problem(line: CommandLine) -> str | None:
    """Hydra takes one mode (``--run``, ``-m``, ``--cfg``, ``--info``, ``-sc``); two end in a
    traceback of its own."""
    modes = [f for f in line.flags if f in _MODES]
    if len(modes) < 2:
        return None
    return (f"{' and '.join(modes)}: python -m atlas.train takes one of --run, -m/--multirun, "
            f"--cfg, --info and --shell-completion at a time; drop all but one")


# -- Hydra's override grammar ---------------------------------------------------------------------
def _parses(item: str) -> str | None:
    """None when Hydra's grammar accepts ``item``; else its first line of complaint."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_overrides([item])
    except Exception as exc:  # noqa: BLE001 - OverrideParseException and the lexer's own
        lines = [x for x in str(exc).splitlines() if x.strip() and not x.startswith("See ")]
        return lines[-1].strip() if lines else "it does not parse"
    return None


def _glued(head: str, pieces: Sequence[str]) -> str:
    """``head`` and the pieces a shell split off it, joined as one override would be written."""
    out = head
    for piece in pieces:
        out += piece if out[-1:] in ",[{(:=" or piece[:1] in ",]})=" else f" {piece}"
    return out


def grammar_problem(overrides: Sequence[str]) -> str | None:
    """One line naming the first override Hydra's grammar refuses, with the fix: most often a
    space the shell split it at (``seed=0, 1`` -> ``seed=0,1``, or quote it)."""
    items = list(overrides)
    for i, item in enumerate(items):
        why = _parses(item)
        if why is None:
            continue
        after = []
        for piece in items[i + 1:]:
            if "=" in piece.lstrip("=") or _parses(piece) is None:
                break
            after.append(piece)
        if "=" not in item and items[i + 1:i + 2] and items[i + 1].startswith("="):
            fixed = _glued(item, [p for p in items[i + 1:i + 3] if p])
            return (f"{' '.join(items[i:i + 3])}: an override is key=value with no spaces "
                    f"around '='; write {fixed}")
        if "=" in item and after:
            fixed = _glued(item, after)
            key, _, value = item.partition("=")
            spaced = " ".join([value, *after])
            if " " not in fixed:
                return (f"{item} {' '.join(after)}: the shell split this override at a space; "
                        f"write {fixed} (no spaces), or quote it: '{key}={spaced}'")
            return (f"{item} {' '.join(after)}: the shell split this override at a space; quote "
                    f"the value: {key}='{spaced}'")
        if "=" not in item and i > 0 and "=" in items[i - 1]:
            key, _, value = items[i - 1].partition("=")
            return (f"{items[i - 1]} {item}: the shell split this override at a space; quote the "
                    f"value: {key}='{value} {item}'")
        if "=" not in item:
            return f"{item}: an override is key=value{_as_option(item)}"
        return (f"{item}: Hydra's override grammar refuses it ({why}); write key=value with no "
                f"spaces, and quote a value with spaces or special characters, e.g. "
                f"key='a b' ({_GRAMMAR})")
    return None


def _as_option(word: str) -> str:
    from atlas.compose import groups

    owners = [g for g, options in groups().items() if word in options]
    return f"; did you mean {owners[0]}={word}?" if owners else (
        ", e.g. task=bandit or explore.rounds=3")


# -- all of them, in order ---------------------------------------------------------------------
def problem(argv: Sequence[str]) -> str | None:
    """The one line for the first mistake on this command line that Hydra would report badly
    (or, for a sweep, for the first job that would fail at start); None when there is none.

    Order: flags and grammar (no file read), then the search path and the group and option
    names, then the YAML files the config is composed from (a file that does not parse is
    absent from the known keys), then the keys, then every job of a sweep.
    """
    line = split(argv)
    if problem := (flag_problem(line) or _modes_problem(line)
                   or grammar_problem(line.overrides)):
        return problem
    if any(f in line.flags for f in _NO_JOB):
        return None
    from atlas.compose import compose_problem, group_problem, override_problem, searchpath_problem

    overrides = line.overrides
    config_dir = line.flag("--config-dir", "-cd")
    if config_dir and not Path(config_dir).is_dir():
        return (f"--config-dir {config_dir}: no such folder; give the folder that holds your "
                f"config groups (e.g. DIR/experiment/mine.yaml for experiment=mine)")
    if problem := searchpath_problem(overrides) or group_problem(
            [*overrides, *([f"--config-dir={config_dir}"] if config_dir else [])]):
        return problem
    job: list[str] | None = list(overrides)
    if line.sweep:  # its first job's files (every job's are composed by check_sweep)
        from atlas.sweep import sweep_jobs

        try:
            job = (sweep_jobs(overrides) or [None])[0]
        except Exception:  # noqa: BLE001 - a sweeper of its own: Hydra expands it
            job = None
    if job is not None and not line.flag("--config-path", "-cp") and (problem := compose_problem(
            job, config_dir, line.flag("--config-name", "-cn") or "train")):
        return problem
    if config_dir is None and (problem := override_problem(overrides)):
        return problem
    if line.sweep and not line.flags.keys() - {"-m", "--multirun"}:
        from atlas.sweep import check_sweep

        return check_sweep(overrides)
    return None
