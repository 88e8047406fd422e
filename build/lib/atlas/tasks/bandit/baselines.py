"""Reference policies and the baseline table (``python -m atlas.tasks.bandit.baselines``).

Every baseline except the oracle is written against the candidate API
``policy(contexts, history, t, state) -> int`` and scored by the evaluator's own
``score_policy`` on the task's fixed environments, so the table is directly comparable with
agent scores. The oracle reads ``theta_t`` from the environment (the one privileged policy);
it defines NMR = 0. The LinUCB variants keep O(d^2) sufficient statistics in ``state``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from atlas.sandbox.candidate import load_candidate
from atlas.tasks.bandit import BanditTask
from atlas.tasks.bandit.env import BanditEnv
from atlas.tasks.bandit.evaluator import Policy, build_envs, score_policy

CONF = Path(__file__).resolve().parents[3] / "conf" / "task" / "bandit.yaml"


def oracle_factory(env: BanditEnv) -> Policy:
    """Picks the arm with the highest expected reward under the true ``theta_t``."""
    def policy(contexts: np.ndarray, history: list, t: int, state: dict) -> int:
        return int(np.argmax(env.means[t]))
    return policy


def random_policy(contexts: np.ndarray, history: list, t: int, state: dict) -> int:
    """Uniform arm; its own fixed-seed generator keeps the table reproducible."""
    rng = state.setdefault("rng", np.random.default_rng(12345))
    return int(rng.integers(contexts.shape[0]))


def linucb(alpha: float, lam: float, window: int | None = None,
           gamma: float = 1.0) -> Policy:
    """LinUCB family: plain (window=None, gamma=1), sliding-window (window=w), or discounted
    (gamma<1, D-LinUCB of Russac et al. 2019 with the simple width sqrt(x'A^-1 x)).

    Statistics are updated incrementally from the newest history entry (and, for a window,
    by removing the entry that left it), so each step is O(K d^2) whatever the window.
    """
    def policy(contexts: np.ndarray, history: list, t: int, state: dict) -> int:
        d = contexts.shape[1]
        if "A" not in state:
            state["A"], state["b"] = lam * np.eye(d), np.zeros(d)
        A, b = state["A"], state["b"]
        if history:
            arm, x, r = history[-1]
            if gamma < 1.0:  # discount old evidence, pull back towards the prior lam*I
                A *= gamma
                A += (1.0 - gamma) * lam * np.eye(d)
                b *= gamma
            A += np.outer(x, x)
            b += r * x
            if window is not None and len(history) > window:
                _, x_old, r_old = history[-window - 1]
                A -= np.outer(x_old, x_old)
                b -= r_old * x_old
        A_inv = np.linalg.inv(A)
        theta = A_inv @ b
        width = np.sqrt(np.maximum(np.einsum("kd,de,ke->k", contexts, A_inv, contexts), 0.0))
        return int(np.argmax(contexts @ theta + alpha * width))
    return policy


def seed_program_source() -> str:
    """Source of the seed policy the agent starts from."""
    return BanditTask().seed_program()


def load_task_config(path: Path | None = CONF) -> dict[str, Any]:
    """The evaluator config for a task yaml, validated by ``BanditTask`` (defaults if the
    repository's conf/ is absent, e.g. in an installed wheel)."""
    raw: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        with open(path) as fh:
            raw = dict(yaml.safe_load(fh) or {})
    elif path is not None and Path(path) != CONF:
        raise FileNotFoundError(f"--config {path} does not exist; pass a task yaml such as "
                                f"conf/task/bandit.yaml")
    return BanditTask(**raw).evaluator_config()


def _grid(quick: bool) -> list[tuple[str, Callable[[], Policy]]]:
    alphas = (0.1, 0.5, 1.0)
    lams = (0.1, 1.0)
    windows = (50, 100, 200, 400, 800) if not quick else (50, 200)
    gammas = (0.98, 0.99, 0.995, 0.998) if not quick else (0.99,)
    rows: list[tuple[str, Callable[[], Policy]]] = []
    for a in alphas:
        rows.append((f"LinUCB a={a}", lambda a=a: linucb(a, 1.0)))
    for w, a, lam in itertools.product(windows, alphas, lams):
        rows.append((f"SW-LinUCB w={w} a={a} lam={lam}", lambda w=w, a=a, lam=lam:
                     linucb(a, lam, window=w)))
    for g, a, lam in itertools.product(gammas, alphas, lams):
        rows.append((f"D-LinUCB g={g} a={a} lam={lam}", lambda g=g, a=a, lam=lam:
                     linucb(a, lam, gamma=g)))
    return rows


def baseline_table(envs: Sequence[BanditEnv], quick: bool = False) -> list[dict[str, Any]]:
    """Score the oracle, random, the seed program and the LinUCB grid on ``envs``."""
    seed_policy = load_candidate(seed_program_source(), "policy")
    rows: list[tuple[str, Callable[[BanditEnv], Policy]]] = [
        ("oracle", oracle_factory),
        ("random", lambda env: random_policy),
        ("seed program (SW-LinUCB w=50 a=1 lam=1)", lambda env: seed_policy),
    ]
    rows += [(name, lambda env, make=make: make()) for name, make in _grid(quick)]
    out = []
    for name, factory in rows:
        start = time.perf_counter()
        _, m = score_policy(factory, envs)
        out.append({"policy": name, "nmr": m["nmr"], "std": m["nmr_std"],
                    "r1": m["regret_first_half"], "r2": m["regret_second_half"],
                    "seconds": (time.perf_counter() - start) / len(envs)})
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table; the best non-oracle row of each family is flagged with '*'."""
    best: dict[str, float] = {}
    for r in rows:
        fam = r["policy"].split(" ")[0]
        best[fam] = max(best.get(fam, -np.inf), r["nmr"])
    lines = ["| policy | NMR mean +- std | regret 1st / 2nd half | s/episode |",
             "|---|---|---|---|"]
    for r in rows:
        fam = r["policy"].split(" ")[0]
        mark = " *" if r["nmr"] == best[fam] and fam not in ("oracle", "random", "seed") else ""
        lines.append(f"| {r['policy']}{mark} | {r['nmr']:.3f} +- {r['std']:.3f} | "
                     f"{r['r1']:.3f} / {r['r2']:.3f} | {r['seconds']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the baseline table for conf/task/bandit.yaml (or --config)."""
    p = argparse.ArgumentParser(description="Score oracle, random, the seed program and a "
                                "LinUCB grid on the bandit task's fixed environments.")
    p.add_argument("--config", type=Path, default=CONF, help="task yaml (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (about 4x faster)")
    args = p.parse_args(argv)
    cfg = load_task_config(args.config)
    envs = build_envs(cfg)
    print(f"bandit baselines: K={cfg['K']} d={cfg['d']} T={cfg['T']} "
          f"B_T={cfg['drift_budget']} sigma={cfg['noise_sigma']} env_seeds={cfg['env_seeds']}")
    start = time.perf_counter()
    print(format_table(baseline_table(envs, quick=args.quick)))
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
