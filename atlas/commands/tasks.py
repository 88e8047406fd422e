"""A task author's commands (docs/tasks.md):

``python -m atlas.tasks check task=<name> [overrides ...]``: the Task contract
(``atlas.tasks.checker``) in the sandbox a run uses, with ``atlas.train``'s overrides and
``hydra.searchpath``; exit status 0 when it passes, 1 when a check fails, 2 on bad input.

``python -m atlas.tasks new <name> [--dir DIR]``: a working task package ``DIR/<name>/``
(task class, scorer and runner, YAML, a test that runs the checker) to edit into yours.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atlas.commands import composed_task
from atlas.tasks.checker import MAX_SPREAD, SECRETS, check_task
from atlas.tasks.scaffold import scaffold


def check(overrides: list[str], secrets: int, max_spread: float, secret_seed: int) -> int:
    try:
        cfg, task = composed_task("tasks check", overrides)
        report = check_task(task, secrets=secrets, max_spread=max_spread,
                            secret_seed=secret_seed, isolation=str(cfg.sandbox.isolation))
    except (TypeError, ValueError) as exc:
        print(f"atlas.tasks check: {exc}", file=sys.stderr)
        return 2
    print(report.text(), flush=True)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas.tasks",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="run the Task contract on a task")
    p_check.add_argument("overrides", nargs="*",
                         help="task=<name> and any atlas.train overrides")
    p_check.add_argument("--secrets", type=int, default=SECRETS,
                         help=f"secrets the seed is scored with (default {SECRETS})")
    p_check.add_argument("--max-spread", type=float, default=MAX_SPREAD,
                         help=f"largest (max - min) / |mean| of the seed's scores across the "
                              f"secrets (default {MAX_SPREAD})")
    p_check.add_argument("--secret-seed", type=int, default=0,
                         help="picks the secrets (they are reproducible; default 0)")
    p_new = sub.add_parser("new", help="write a working task package to start from")
    p_new.add_argument("name", help="the task's name, a Python package name")
    p_new.add_argument("--dir", default=".", help="folder to write <name>/ in (default .)")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.overrides, args.secrets, args.max_spread, args.secret_seed)
    where = Path(args.dir).resolve()
    try:
        written = scaffold(args.name, where)
    except (ValueError, OSError) as exc:
        print(f"atlas.tasks new: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"\ncheck it:  PYTHONPATH={where} python -m atlas.tasks check task={args.name} "
          f"hydra.searchpath=[pkg://{args.name}.conf]\n"
          f"run it:    PYTHONPATH={where} python -m atlas.train task={args.name} "
          f"hydra.searchpath=[pkg://{args.name}.conf] experiment=test\n"
          f"test it:   PYTHONPATH={where} python -m pytest {where / args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
