"""Seconds per bandit candidate through the real sandbox, each candidate another program.

Why: with hidden inputs of each program's own (``atlas.sandbox.inputs``) the scorer draws a
program's environments when it first sees the program (about 0.05 s per environment of the
default task here); ``scripts/sandbox_overhead.py`` times a trivial toy program and cannot
show that. Each candidate is the seed policy with a numbered no-op line (another program key,
so its own environments), one worker, candidates one after another, after one warm-up.

    python scripts/bandit_candidate_cost.py rlimits 8    # or bwrap
    python scripts/bandit_candidate_cost.py rlimits 8 --behaviour-pair [--task=binpacking]

Prints one JSON line: the median and fastest seconds per candidate. ``--behaviour-pair``
times the scorer with its public input (the behaviour fingerprint, ``atlas.sandbox.behaviour``)
and without it (``behaviour: false``), two sandboxes whose candidates alternate, so a
machine's changing load falls on both alike: one line each. ``--task`` times another task's
seed program the same way (bin packing: its public instance).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec
from atlas.tasks import make_task


def _sandbox(task, mode: str, behaviour: bool) -> Sandbox:
    spec = TaskSpec.of(task)
    spec = dataclasses.replace(spec, evaluator_config={**spec.evaluator_config,
                                                       "behaviour": behaviour})
    return Sandbox(spec, secret="5e" * 32, resources=Resources(workers=1),
                   confinement=Confinement(isolation=mode))


def main(mode: str, n: int, behaviours: tuple[bool, ...] = (True,), task_name: str = "bandit"
         ) -> list[dict[str, float | int | str | bool]]:
    task = make_task(task_name)
    context = task.context(0)
    boxes = [_sandbox(task, mode, b) for b in behaviours]
    seconds: list[list[float]] = [[] for _ in boxes]
    try:
        for sb in boxes:
            assert sb.evaluate(task.seed_program() + "\n_warm = 0\n", context).passed
        for i in range(n):
            code = task.seed_program() + f"\n_candidate = {i}\n"
            order = list(zip(boxes, seconds))
            for sb, out in (order if i % 2 == 0 else order[::-1]):  # neither always first
                t0 = time.perf_counter()
                ev = sb.evaluate(code, context)
                out.append(time.perf_counter() - t0)
                assert ev.passed, ev
    finally:
        for sb in boxes:
            sb.close()
    return [{"task": task_name, "mode": mode, "n": n, "behaviour": b,
             "median_s": statistics.median(s), "min_s": min(s)}
            for b, s in zip(behaviours, seconds)]


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pair = "--behaviour-pair" in sys.argv[1:]
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--task=")),
                "bandit")
    for row in main(args[0] if args else "auto", int(args[1]) if len(args) > 1 else 8,
                    (True, False) if pair else (True,), name):
        print(json.dumps(row))
