"""``python -m atlas.sandbox audit task=<name> [overrides ...]``: the system calls a task's
runner makes while its seed program runs, each marked with whether the sandbox allows it.

Why: the runner's filter is an allow-list (``seccomp.ALLOWED``); a task whose runner needs
more (a native library, a newer glibc) would fail with ``blocked`` failures. The audit runs
the seed program in the sandbox a run uses, with a filter that lets every call through and
reports it, so a task author sees what to add to ``Task.syscalls``. Exit status 0 when every
call is allowed, 1 when some are not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from atlas.commands import composed_task
from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.sandbox.seccomp import ALLOWED, CMD_CHECKED, PID_CHECKED


def audit(overrides: list[str]) -> int:
    try:
        cfg, task = composed_task("sandbox audit", overrides)
    except (TypeError, ValueError) as exc:
        print(f"atlas.sandbox audit: {exc}", file=sys.stderr)
        return 2
    with Sandbox.for_task(task, resources=Resources(workers=1), confinement=Confinement(
            isolation=str(cfg.sandbox.isolation), audit=True)) as sb:
        ev = sb.evaluate(task.seed_program(), {"round": 1})
    calls = {k.split(":", 1)[1]: int(v) for k, v in ev.metrics.items()
             if k.startswith("syscall:")}
    allowed = {*ALLOWED, *PID_CHECKED, *CMD_CHECKED, *task.syscalls, "clone", "sendmsg",
               "close"}
    print(f"{task.name}: the seed program {'passed' if ev.passed else 'failed'} "
          f"({ev.failure_kind}); {len(calls)} distinct system calls after the filter point")
    for name in sorted(calls):
        mark = "allowed" if name in allowed else "NOT ALLOWED: add it to Task.syscalls"
        print(f"  {name:<24} {calls[name]:>8}  {mark}")
    missing = sorted(set(calls) - allowed)
    if missing:
        print(f"not allowed: {missing}")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas.sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("audit", help="print the system calls a task's runner makes")
    p.add_argument("overrides", nargs="*", help="task=<name> and atlas.train's overrides")
    args = parser.parse_args(argv)
    return audit(args.overrides)


if __name__ == "__main__":
    sys.exit(main())
