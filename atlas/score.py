"""Score programs without the LLM loop: ``python -m atlas.score task=<name> prog.py [...]``.

Why through the run's own sandbox (``Sandbox.for_task``): a number printed here is the number
a run would record for the same program, secret and round, and a program that fails here
fails there for the same reason. Overrides and ``hydra.searchpath`` are those of
``atlas.train`` (``task.problems=8``, ``hydra.searchpath=[pkg://mypkg.conf]``).

The secret (hidden environments, validation points) is explicit: ``--secret-file F`` reads F
(64 hex characters: a run folder's ``.task_secret`` reproduces that run's scores) or creates it
when it does not exist; without the flag a fresh secret is written to a new file that the
output names, so the same scores can be had again.

Exit status: 0 when every program passed, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.pool import SandboxError
from atlas.sandbox.secret import create_secret_file, is_secret
from atlas.tasks import build_task

USAGE = ("python -m atlas.score task=<name> [overrides ...] prog.py [more.py ...] "
         "[--secret-file F] [--round R] [--json]")


def secret_from(path: str | None) -> tuple[str, Path, bool]:
    """(secret, the file holding it, whether it was created): ``path`` read, or created with
    a fresh secret when it does not exist; a new file in the temporary folder when ``path``
    is None (in a new folder of its own)."""
    if path is None:  # a folder of its own: the sandbox masks a secret's folder whole
        name = os.path.join(tempfile.mkdtemp(prefix="atlas-score-"), ".task_secret")
    file = Path(path or name).expanduser()
    created = not file.exists()
    if created:
        create_secret_file(file)
    value = file.read_text().strip()
    if not is_secret(value):
        raise ValueError(f"--secret-file {file}: not a task secret (64 hex characters, e.g. "
                         f"python -c 'import secrets; print(secrets.token_hex(32))' > {file}); "
                         f"a run folder's .task_secret is one")
    return value, file, created


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(overrides, program files): ``key=value`` items are overrides, the rest files."""
    overrides = [a for a in args if "=" in a and not Path(a).is_file()]
    files = [a for a in args if a not in overrides]
    return overrides, files


def describe(path: str, ev: Any) -> dict[str, Any]:
    """One program's result as plain JSON."""
    return {"program": path, "passed": ev.passed,
            "score": ev.score if math.isfinite(ev.score) else None,
            "failure_kind": ev.failure_kind, "message": ev.message,
            "metrics": ev.metrics, "seconds": round(ev.seconds, 3)}


def render(row: dict[str, Any], label: str) -> str:
    """The human-readable block of one program."""
    lines = [f"{row['program']}"]
    if row["passed"]:
        lines.append(f"  {label} {row['score']:.10g}   ({row['seconds']:.2f} s)")
    else:
        lines.append(f"  FAILED {row['failure_kind']}   ({row['seconds']:.2f} s)")
        lines += [f"  | {line}" for line in row["message"].splitlines() or [""]]
    for key in sorted(row["metrics"]):
        lines.append(f"  {key:<24} {row['metrics'][key]:.6g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas.score", usage=USAGE,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="*", help="overrides (key=value) and program files")
    parser.add_argument("--secret-file", default=None,
                        help="file with the task secret (64 hex characters), created if absent; "
                             "default: a fresh secret in a new file the output names")
    parser.add_argument("--round", type=int, default=0,
                        help="round whose context the programs are scored in (PINN: its "
                             "viscosity); default 0, the seed's")
    parser.add_argument("--workers", type=int, default=1, help="sandbox workers (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per program")
    args = parser.parse_intermixed_args(argv)  # flags before, between or after the files
    overrides, files = split_args(args.items)
    try:
        if not files:
            raise ValueError(f"no program file given; usage: {USAGE}")
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise ValueError(f"{missing[0]} is not a file (an override needs key=value); "
                             f"usage: {USAGE}")
        if args.workers < 1 or args.round < 0:
            raise ValueError("--workers must be >= 1 and --round >= 0")
        from atlas.compose import compose  # deferred: Hydra, after the arguments are checked

        cfg = compose(overrides)
        task = build_task(cfg)
        secret, secret_path, created = secret_from(args.secret_file)
    except (TypeError, ValueError, OSError) as exc:
        print(f"atlas.score: {exc}", file=sys.stderr)
        return 2
    note = "fresh, written to" if created else "read from"
    print(f"task {task.name}: secret {note} {secret_path} (pass --secret-file {secret_path} "
          f"to score on the same hidden instances)", file=sys.stderr)
    context = task.context(args.round)
    codes = [Path(f).read_text() for f in files]
    try:
        with Sandbox.for_task(task, secret=secret, resources=Resources(workers=args.workers),
                              confinement=Confinement(isolation=str(cfg.sandbox.isolation),
                                                      hide=(str(secret_path.resolve()),))) as sb:
            evaluations = sb.evaluate_many(codes, context)
    except (SandboxError, ValueError) as exc:
        print(f"atlas.score: the sandbox could not start the task's scorer: "
              f"{' '.join(str(exc).split())[-800:]}", file=sys.stderr)
        return 2
    rows = [describe(f, ev) for f, ev in zip(files, evaluations)]
    for row in rows:
        print(json.dumps(row) if args.json else render(row, task.score_label), flush=True)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
