"""First fit, best fit and FunSearch's published Weibull heuristic on each instance set.

``python -m atlas.tasks.binpacking.baselines`` prints the excess over the L1 bound (%) with
the same packing loop, replay check and count that score candidates, on the default
Weibull 5 x 5000 set and an OR3-like set (20 x 500 uniform [20, 100], capacity 150,
generated: OR-Library's binpack3 has this distribution, not these items), plus any
OR-Library file given with ``--instances``. ``--write-or PATH`` writes the OR3-like set in
the OR-Library format (a fixture for ``task.instances=PATH``), ``--write-weibull PATH`` the
public Weibull draw. ``--speed`` measures
candidates/s on the Weibull set (25,000 items).

Published (FunSearch Table 1): Weibull 5k first fit 4.23 %, best fit 3.98 %, FunSearch 0.68 %;
OR3 first fit 5.74 %, best fit 5.37 %, FunSearch 3.11 %.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

from atlas.sandbox import Confinement, Resources, Sandbox
from atlas.tasks.binpacking import BinPackingTask
from atlas.tasks.binpacking.evaluator import score_priority
from atlas.tasks.binpacking.heuristics import best_fit as _best_fit
from atlas.tasks.binpacking.heuristics import first_fit as _first_fit
from atlas.tasks.binpacking.heuristics import funsearch_weibull as _funsearch_weibull
from atlas.tasks.binpacking.instances import (
    Instance,
    read_orlib,
    uniform_instances,
    weibull_instances,
    write_orlib,
)

# the heuristics are program files (atlas/tasks/binpacking/heuristics/): the same text that
# `python -m atlas.score task=binpacking <file>` scores in the sandbox
first_fit = _first_fit.priority
best_fit = _best_fit.priority
funsearch_weibull = _funsearch_weibull.priority


HEURISTICS: dict[str, Callable[[float, np.ndarray], np.ndarray]] = {
    "first fit": first_fit, "best fit": best_fit, "FunSearch (Weibull)": funsearch_weibull}

#: FunSearch Table 1 (excess %), keyed like ``instance_sets``
PUBLISHED = {"Weibull 5k": {"first fit": 4.23, "best fit": 3.98, "FunSearch": 0.68},
             "OR3": {"first fit": 5.74, "best fit": 5.37, "FunSearch": 3.11}}


def instance_sets(extra: Sequence[str] = ()) -> dict[str, list[Instance]]:
    """The sets the baselines run on: Weibull 5k, an OR3-like uniform set, given files."""
    sets = {"Weibull 5 x 5000 (seed 0)": weibull_instances(),
            "OR3-like 20 x 500 U[20,100] cap 150 (generated)": uniform_instances()}
    for path in extra:
        sets[path] = read_orlib(path)
    return sets


def table(sets: dict[str, list[Instance]]) -> list[tuple[str, str, float, float]]:
    """(set, heuristic, excess %, seconds) for every set and heuristic."""
    rows = []
    for set_name, instances in sets.items():
        for name, fn in HEURISTICS.items():
            start = time.perf_counter()
            _, metrics = score_priority(fn, instances)
            rows.append((set_name, name, metrics["excess_pct"], time.perf_counter() - start))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", action="append", default=[],
                    help="an OR-Library bin-packing file (repeatable)")
    ap.add_argument("--write-or", metavar="PATH",
                    help="write the generated OR3-like set to PATH (OR-Library format) and exit")
    ap.add_argument("--write-weibull", metavar="PATH",
                    help="write the public Weibull 5 x 5000 draw (the table's) to PATH "
                         "(OR-Library format) and exit: `python -m atlas.score "
                         "task=binpacking task.instances=PATH <program>` scores on it")
    ap.add_argument("--speed", action="store_true",
                    help="also time a candidate through the sandbox (candidates/s)")
    args = ap.parse_args(argv)
    if args.write_or or args.write_weibull:
        for path, instances in ((args.write_or, uniform_instances),
                                (args.write_weibull, weibull_instances)):
            if path:
                print(f"wrote {write_orlib(path, instances())}")
        return
    print(f"{'instance set':<50} {'heuristic':<22} {'excess %':>9} {'seconds':>8}")
    for set_name, name, excess, secs in table(instance_sets(args.instances)):
        print(f"{set_name:<50} {name:<22} {excess:>9.2f} {secs:>8.2f}")
    print("published (FunSearch Table 1): "
          + "; ".join(f"{s}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items())
                      for s, d in PUBLISHED.items()))
    if args.speed:
        print(speed())


def speed(candidates: int = 4) -> str:
    """Candidates/s of the seed program through the real sandbox (scorer + fresh runner)."""
    task = BinPackingTask()
    secret = "5eed" * 8
    n = sum(len(i.items) for i in task.scored_instances(secret))
    # timed: the same program runs again on purpose (a Sandbox scores a program once)
    with Sandbox.for_task(task, secret=secret, resources=Resources(workers=1),
                          confinement=Confinement(score_once=False)) as sb:
        sb.evaluate(task.seed_program(), task.context(0))  # warm-up
        start = time.perf_counter()
        for _ in range(candidates):
            ev = sb.evaluate(task.seed_program(), task.context(0))
        secs = (time.perf_counter() - start) / candidates
    return (f"sandbox ({sb.isolation}): {secs:.2f} s per candidate on {n} items = "
            f"{1 / secs:.2f} candidates/s per worker (score {ev.score:.3f}, {ev.failure_kind})")


if __name__ == "__main__":
    main()
