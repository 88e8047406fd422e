"""``python -m atlas.sandbox audit task=<name> [overrides ...]``: the system calls a task's
runner makes while its seed program runs, each marked with whether the sandbox allows it,
and the files it opens that a runner may not read (``atlas.sandbox.audit``).

Why: the runner's filter is an allow-list (``seccomp.ALLOWED``) and its view of the host an
allow-list of code; a task whose runner needs more (a native library, a newer glibc, a data
file outside its package) would fail with ``blocked`` failures or missing files. Exit status
0 when every call is allowed and every file readable, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from atlas.commands import composed_task
from atlas.sandbox.audit import audit_seed, calls, unallowed_calls, unreadable_paths


def audit(overrides: list[str]) -> int:
    try:
        cfg, task = composed_task("sandbox audit", overrides)
    except (TypeError, ValueError) as exc:
        print(f"atlas.sandbox audit: {exc}", file=sys.stderr)
        return 2
    ev = audit_seed(task, str(cfg.sandbox.isolation))
    made = calls(ev)
    missing = unallowed_calls(ev, task)
    print(f"{task.name}: the seed program {'passed' if ev.passed else 'failed'} "
          f"({ev.failure_kind}); {len(made)} distinct system calls after the filter point")
    for name in sorted(made):
        mark = "NOT ALLOWED: add it to Task.syscalls" if name in missing else "allowed"
        print(f"  {name:<24} {made[name]:>8}  {mark}")
    if missing:
        print(f"not allowed: {missing}")
    paths = unreadable_paths(ev)
    for path in paths:
        print(f"  not readable by a runner: {path} (keep the task's files in its package)")
    return 1 if missing or paths else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas.sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("audit", help="print the system calls and unreadable files of a "
                                     "task's runner")
    p.add_argument("overrides", nargs="*", help="task=<name> and atlas.train's overrides")
    args = parser.parse_args(argv)
    return audit(args.overrides)


if __name__ == "__main__":
    sys.exit(main())
