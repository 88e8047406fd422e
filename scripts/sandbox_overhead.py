"""The sandbox's fixed cost per candidate: a trivial program (the toy task, one step), one
worker, candidates one after another, so nothing but the sandbox's own work is timed (a fresh
runner, its namespaces and state reset, the link, the sweep). Each candidate is another
program (a numbered no-op line): the sandbox scores a program once, so a repeated one would
time nothing.

    python scripts/sandbox_overhead.py bwrap 40    # or rlimits

Prints one JSON line: the median and fastest seconds per candidate over N, after 4 warm-ups.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER

TRIVIAL = "def policy(contexts, history, t, state):\n    return 0\n"


def main(mode: str, n: int) -> dict[str, float | int | str]:
    with Sandbox(TaskSpec(TOY_SCORER, {"steps": 1}, TOY_RUNNER), resources=Resources(workers=1),
                 confinement=Confinement(isolation=mode)) as sb:
        for i in range(4):
            assert sb.evaluate(TRIVIAL + f"_warm = {i}\n", {}).passed
        seconds = []
        for i in range(n):
            code = TRIVIAL + f"_candidate = {i}\n"
            t0 = time.perf_counter()
            ev = sb.evaluate(code, {})
            seconds.append(time.perf_counter() - t0)
            assert ev.passed, ev
    return {"mode": mode, "n": n, "median_s": statistics.median(seconds), "min_s": min(seconds)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "auto",
                          int(sys.argv[2]) if len(sys.argv) > 2 else 40)))
