"""A command line as Hydra reads it, and the overrides its grammar refuses, named with the fix.

Why: Hydra answers an override its grammar refuses with ``mismatched input '<EOF>' expecting
{...}``, naming no override; most such mistakes are a space the shell split an override at
(``seed=0, 1``), and the fix can be said exactly. ``atlas.commandline`` checks
``python -m atlas.train``'s command line with it, ``atlas.compose.compose`` the overrides of
``atlas.score`` and ``atlas.tasks check``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
#: Hydra's modes: one at a time
MODES = ("--run", "-r", "--multirun", "-m", "--cfg", "-c", "--info", "-i", "--shell-completion",
         "-sc")


@dataclass(frozen=True)
class CommandLine:
    """The command line split as Hydra reads it: its flags (with their values) and overrides."""

    flags: dict[str, str | None]
    overrides: list[str]
    unknown: list[tuple[str, str | None]]  # (flag, its value: ``--rounds 3`` or ``--rounds=3``)
    flag_items: list[str]  # Hydra's flags with their values, as typed
    refused: list[str]  # a Hydra flag with a value it does not take (``--cfg jobs``), and why

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
    refused: list[str] = []
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
        if value and action.choices and value not in action.choices:
            refused.append(f"{name} {value}: choose one of {', '.join(action.choices)}")
        flags[name] = value or None
        flag_items += items[start:i]
    return CommandLine(flags, overrides, unknown, flag_items, refused)


def modes_problem(line: CommandLine) -> str | None:
    """A flag's value Hydra does not take (``--cfg jobs``: a usage block), or two of its modes
    (``--run``, ``-m``, ``--cfg``, ``--info``, ``-sc``: a traceback of its own)."""
    if line.refused:
        return line.refused[0]
    modes = [f for f in line.flags if f in MODES]
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


def grammar_problem(overrides: Sequence[str],
                    options: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """One line naming the first override Hydra's grammar refuses, with the fix: most often a
    space the shell split it at (``seed=0, 1`` -> ``seed=0,1``, or quote it). ``options``:
    each config group's options, to name the group of a bare option (``pinn`` ->
    ``task=pinn``)."""
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
            return f"{item}: an override is key=value{_as_option(item, options or {})}"
        return (f"{item}: Hydra's override grammar refuses it ({why}); write key=value with no "
                f"spaces, and quote a value with spaces or special characters, e.g. "
                f"key='a b' ({_GRAMMAR})")
    return None


def _as_option(word: str, options: Mapping[str, Sequence[str]]) -> str:
    owners = [g for g, names in options.items() if word in names]
    return f"; did you mean {owners[0]}={word}?" if owners else (
        ", e.g. task=bandit or explore.rounds=3")
