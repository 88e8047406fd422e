"""Seconds per bandit candidate through the real sandbox, each candidate another program.

Why: with hidden inputs of each program's own (``atlas.sandbox.inputs``) the scorer draws a
program's environments when it first sees the program (about 0.05 s per environment of the
default task here); ``scripts/sandbox_overhead.py`` times a trivial toy program and cannot
show that. Each candidate is the seed policy with a numbered no-op line (another program key,
so its own environments), one worker, candidates one after another, after one warm-up.

    python scripts/bandit_candidate_cost.py rlimits 8    # or bwrap

Prints one JSON line: the median and fastest seconds per candidate.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.tasks import make_task


def main(mode: str, n: int) -> dict[str, float | int | str]:
    task = make_task("bandit")
    with Sandbox.for_task(task, secret="5e" * 32, resources=Resources(workers=1),
                          confinement=Confinement(isolation=mode)) as sb:
        context = task.context(0)
        assert sb.evaluate(task.seed_program() + "\n_warm = 0\n", context).passed
        seconds = []
        for i in range(n):
            code = task.seed_program() + f"\n_candidate = {i}\n"
            t0 = time.perf_counter()
            ev = sb.evaluate(code, context)
            seconds.append(time.perf_counter() - t0)
            assert ev.passed, ev
    return {"mode": mode, "n": n, "median_s": statistics.median(seconds), "min_s": min(seconds)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "auto",
                          int(sys.argv[2]) if len(sys.argv) > 2 else 8)))
