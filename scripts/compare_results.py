"""Diff two runs' ``results.json`` (and, with ``--events``, their ``events.jsonl``), ignoring
wall-clock fields.

    python scripts/compare_results.py BEFORE AFTER [--events]

BEFORE / AFTER: a run folder or a ``results.json`` path. Exit status 0 when the deterministic
fields agree, 1 otherwise (each difference printed as ``path: before != after``).

Ignored: wall-clock timings (any key ``wall_seconds``, ``seconds``, ``seconds_*``, ``*_seconds``,
``*_ms``, ``*_s``: the sampler's ``setup_s`` ... ``tok_s``) and, in the ``config`` event, the fields that name the run (``run_dir``, ``name``).
Everything else, floats included, must be equal exactly: a seeded run is bit-reproducible.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RUN_NAMING = {"run_dir", "name"}  # differ by construction between two run folders


def wall_clock(key: str) -> bool:
    """A key whose value is a timing, so differs from run to run."""
    return (key in ("wall_seconds", "seconds") or key.startswith("seconds_")
            or key.endswith("_seconds") or key.endswith("_ms") or key.endswith("_s"))


def diff(a: Any, b: Any, path: str = "", ignore: frozenset[str] = frozenset()) -> list[str]:
    """Differences between two JSON values, as ``path: a != b`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        if list(a) != list(b) and set(a) == set(b):
            out.append(f"{path or '<root>'}: key order {list(a)} != {list(b)}")
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if wall_clock(str(key)) or any(sub.endswith("." + name) for name in ignore):
                continue
            if key not in a or key not in b:
                out.append(f"{sub}: {'missing' if key not in a else a[key]!r} != "
                           f"{'missing' if key not in b else b[key]!r}")
            else:
                out.extend(diff(a[key], b[key], sub, ignore))
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]", ignore)]
    if type(a) is not type(b) or a != b:
        if a != a and b != b:  # both NaN
            return []
        return [f"{path}: {a!r} != {b!r}"]
    return []


def _folder(p: str) -> Path:
    path = Path(p)
    return path.parent if path.name == "results.json" else path


def compare(before: str, after: str, events: bool = False) -> list[str]:
    a, b = _folder(before), _folder(after)
    out = diff(json.loads((a / "results.json").read_text()),
               json.loads((b / "results.json").read_text()), "results")
    if events:
        ea = [json.loads(line) for line in (a / "events.jsonl").read_text().splitlines()]
        eb = [json.loads(line) for line in (b / "events.jsonl").read_text().splitlines()]
        if len(ea) != len(eb):
            out.append(f"events: {len(ea)} lines != {len(eb)} lines")
        for i, (x, y) in enumerate(zip(ea, eb)):
            ignore = frozenset(f"config.{k}" for k in RUN_NAMING) if x.get("event") == "config" \
                else frozenset()
            out.extend(diff(x, y, f"events[{i}]", ignore))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--events", action="store_true", help="also diff events.jsonl line by line")
    args = ap.parse_args(argv)
    diffs = compare(args.before, args.after, events=args.events)
    for line in diffs:
        print(line)
    print(f"{'identical' if not diffs else f'{len(diffs)} difference(s)'} "
          f"(wall-clock fields ignored{'; events.jsonl too' if args.events else ''})")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
