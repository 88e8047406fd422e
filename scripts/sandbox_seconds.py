"""Sandbox seconds of a run's distinct passed programs, scored again one after another on one
worker (docs/results.md, "Sandbox cost"): what one evaluation of the task's real programs
costs, to compare two versions of a task's scorer or runner side by side.

    python scripts/sandbox_seconds.py <run dir> [N]    # the first N distinct codes (10)

Scores on the run's task with a fixed secret (the seconds, not the scores, are the point;
the sum of the scores shows whether two versions score alike). Prints one line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from atlas.sandbox import Resources, Sandbox
from atlas.tasks import make_task


def main(run: Path, n: int) -> str:
    rows = [json.loads(line) for line in (run / "programs.jsonl").read_text().splitlines()]
    task_name = json.loads((run / "results.json").read_text())["task"]
    codes = list(dict.fromkeys(r["code"] for r in rows if r["evaluation"].get("passed")))[:n]
    with Sandbox.for_task(make_task(task_name), secret="ab" * 32, resources=Resources(workers=1)) as sb:
        sb.evaluate(codes[0], {})  # warm the worker
        t0 = time.perf_counter()
        evs = [sb.evaluate(code, {}) for code in codes]
        wall = time.perf_counter() - t0
    return (f"{len(codes)} programs of {run}: {wall:.2f} s, {wall / len(codes):.3f} s each; "
            f"sum of scores {sum(e.score for e in evs):.6f}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    print(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) == 3 else 10))
