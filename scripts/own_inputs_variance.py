"""What hidden inputs of a program's own do to the variance of scores (docs/sandbox.md).

Why: each program now faces bandit environments drawn from the secret *and* its program key
(``atlas.sandbox.inputs``), so a relay between candidates is worth nothing; the price is that
two programs no longer share their environments. This script measures, on the bandit task's
default configuration (or ``--T``), in process (trusted policies, no sandbox):

- ``own``: the seed policy and arm 0, each over ``--keys`` program keys of one secret (no-op
  variants of the program): the spread of one program's score now;
- ``shared``: the same two programs over ``--keys`` secrets with shared environments (the
  design before): the spread a program's score had across runs, and the paired difference
  seed - arm 0 on the same environments;
- the difference seed - arm 0 on independent environments (own) against paired (shared).

    python scripts/own_inputs_variance.py --keys 8 --json docs/bench/own_inputs_variance.json
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import time
from pathlib import Path

from atlas.sandbox.candidate import load_candidate
from atlas.sandbox.inputs import program_key
from atlas.tasks.bandit import BanditTask
from atlas.tasks.bandit.evaluator import build_envs, score_policy

ARM0 = "def policy(contexts, history, t, state):\n    return 0\n"


def _summary(xs: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.mean(xs), 4), "std": round(statistics.stdev(xs), 4),
            "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--T", type=int, default=0, help="horizon (0: the task's default)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    task = BanditTask(**({"T": args.T} if args.T else {}))
    config = task.evaluator_config()
    programs = {"seed": task.seed_program(), "arm0": ARM0}
    policies = {name: load_candidate(code, "policy") for name, code in programs.items()}
    secret = "5e" * 32
    own: dict[str, list[float]] = {n: [] for n in programs}
    shared: dict[str, list[float]] = {n: [] for n in programs}
    start = time.perf_counter()
    for i in range(args.keys):
        for name, code in programs.items():
            envs = build_envs(config, secret, program_key(code + f"\n_variant = {i}\n"))
            own[name].append(score_policy(lambda env, p=policies[name]: p, envs)[0])
        envs = build_envs(config, secrets.token_hex(32))
        for name in programs:
            shared[name].append(score_policy(lambda env, p=policies[name]: p, envs)[0])
    paired = [a - b for a, b in zip(shared["seed"], shared["arm0"])]
    unpaired = [a - b for a, b in zip(own["seed"], own["arm0"])]
    out = {"config": {k: config[k] for k in ("T", "K", "d", "env_seeds", "noise_sigma")},
           "own_inputs": {n: _summary(v) for n, v in own.items()},
           "shared_inputs_across_secrets": {n: _summary(v) for n, v in shared.items()},
           "seed_minus_arm0_paired_shared": _summary(paired),
           "seed_minus_arm0_unpaired_own": _summary(unpaired),
           "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
