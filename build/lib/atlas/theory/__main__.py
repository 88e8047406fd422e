"""``python -m atlas.theory``: sweep horizons and seeds, print the table, write PNG + JSON.

Kept apart from the simulation so tests and notebooks can call ``sweep`` without matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from atlas.theory.simulation import TheoryConfig, sweep


def parse_ints(text: str, name: str) -> list[int]:
    """'250,500' or '0-4' or a mix ('0-2,7') -> ints; a clear error names the flag."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise ValueError(
            f"--{name} {text!r} is invalid: use integers like '250,500' or '0-4'") from None
    if not out:
        raise ValueError(f"--{name} is empty: give at least one integer, e.g. '0-4'")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m atlas.theory",
        description="Dynamic regret of KL-regularised policies with a fixed uniform vs an "
                    "evolving reference in a drifting Bradley-Terry contextual bandit.")
    p.add_argument("--horizons", default="250,500,1000,2000,4000", help="comma list of T")
    p.add_argument("--seeds", default="0-4", help="e.g. '0-4' or '0,3,7'")
    p.add_argument("--beta", type=float, default=0.1, help="KL strength of the policy")
    p.add_argument("--window", default="50",
                   help="sliding window w, or 'auto' = c (T/B_T)^(2/3)")
    p.add_argument("--window-coef", type=float, default=1.0, help="c of --window auto")
    p.add_argument("--budget", type=float, default=1.0, help="total-variation budget B_T")
    p.add_argument("--reg", type=float, default=1.0, help="ridge lambda of the window fit")
    p.add_argument("--arms", type=int, default=5)
    p.add_argument("--dim", type=int, default=5)
    p.add_argument("--segments", type=int, default=4, help="great-circle arcs of the drift")
    p.add_argument("--newton-steps", type=int, default=2)
    p.add_argument("--floor", type=float, default=None,
                   help="also run 'evolving_floor': reference mixed with p_min (Assumption 2)")
    p.add_argument("--out", default="docs/theory.png", help="PNG path; JSON goes next to it")
    p.add_argument("--json", default=None, help="JSON path (default: --out with .json)")
    return p


def config_from_args(args: argparse.Namespace) -> TheoryConfig:
    if args.window == "auto":
        window = None
    else:
        try:
            window = int(args.window)
        except ValueError:
            raise ValueError(
                f"--window {args.window!r} is invalid: use an integer or 'auto'") from None
    return TheoryConfig(n_arms=args.arms, dim=args.dim, beta=args.beta, window=window,
                        window_coef=args.window_coef, budget=args.budget, reg=args.reg,
                        segments=args.segments, newton_steps=args.newton_steps, floor=args.floor)


def format_table(record: dict) -> str:
    """Mean cumulative regret per horizon and method, then the fitted log-log slopes."""
    methods = record["methods"]
    head = f"{'T':>7} {'w':>5} " + " ".join(f"{m:>22}" for m in methods)
    lines = [head, "-" * len(head)]
    for row in record["rows"]:
        cells = " ".join(f"{row[m]['mean']:>12.2f} +- {row[m]['std']:>6.2f}" for m in methods)
        lines.append(f"{row['T']:>7} {row['window']:>5} {cells}")
    lines.append("-" * len(head))
    lines.append(f"{'slope':>13} " + " ".join(f"{record['slopes'][m]:>22.3f}" for m in methods))
    last = " ".join(f"{(record['local_slopes'][m] or [float('nan')])[-1]:>22.3f}"
                    for m in methods)
    lines.append(f"{'last slope':>13} {last}")
    return "\n".join(lines)


def plot(record: dict, path: Path) -> None:
    """Left: regret vs T on log-log axes with fitted slopes; right: the largest run's curve."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    colors = {"fixed": "tab:red", "evolving": "tab:blue", "evolving_floor": "tab:green"}
    labels = {"fixed": "fixed uniform reference (DPO)",
              "evolving": "evolving reference (EvoDPO)",
              "evolving_floor": "evolving reference, floor p_min"}
    hs = np.array(record["horizons"], float)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in record["methods"]:
        mean = np.array([r[m]["mean"] for r in record["rows"]])
        std = np.array([r[m]["std"] for r in record["rows"]])
        c = colors.get(m, None)
        ax.errorbar(hs, mean, yerr=std, marker="o", capsize=3, color=c,
                    label=f"{labels.get(m, m)}: slope {record['slopes'][m]:.2f}")
        if len(hs) > 1:
            k, b = np.polyfit(np.log(hs), np.log(mean), 1)
            ax.plot(hs, np.exp(b) * hs**k, ls="--", lw=1, color=c)
        ax2.plot(record["curve"]["t"], record["curve"][m], color=c, label=labels.get(m, m))
    cfg = record["config"]
    w = "auto" if cfg["window"] is None else cfg["window"]
    ax.set(xscale="log", yscale="log", xlabel="horizon T", ylabel="cumulative dynamic regret",
           title=f"beta={cfg['beta']}, w={w}, B_T={cfg['budget']}, "
                 f"{len(record['seeds'])} seeds")
    ax.set_xticks(hs, [str(int(h)) for h in hs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8)
    ax2.set(xlabel="t", ylabel="cumulative dynamic regret",
            title=f"one horizon, T={record['horizons'][-1]} (mean over seeds)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        horizons = parse_ints(args.horizons, "horizons")
        seeds = parse_ints(args.seeds, "seeds")
        if min(horizons) < 2:
            raise ValueError(f"--horizons {args.horizons!r} is invalid: every T must be >= 2")
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    start = time.perf_counter()
    record = sweep(horizons, seeds, cfg)
    record["seconds"] = round(time.perf_counter() - start, 2)
    print(format_table(record))
    print(f"({len(seeds)} seeds, {record['seconds']} s)")
    out = Path(args.out)
    json_path = Path(args.json) if args.json else out.with_suffix(".json")
    plot(record, out)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} and {json_path}")
    return record


if __name__ == "__main__":
    main()
