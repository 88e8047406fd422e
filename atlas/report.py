"""``python -m atlas.report <multirun dir> [...]``: the paper's Tables 2, 3, 5 and Figure 2.

Everything is recomputed from the run folders' ``events.jsonl`` / ``programs.jsonl`` (via
``atlas.results.summarise``), so a table can be rebuilt from an archived sweep without
re-running anything, including runs that crashed before writing ``results.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from atlas.results import KNOBS, summarise
from atlas.telemetry import EVENTS, read_jsonl

METHOD_ORDER = ("evotune", "evodpo", "atlas")


def find_runs(roots: list[Path]) -> list[Path]:
    """Every folder below ``roots`` that holds an ``events.jsonl``."""
    runs: set[Path] = set()
    for root in roots:
        root = Path(root)
        if (root / EVENTS).exists():
            runs.add(root)
        runs.update(p.parent for p in root.rglob(EVENTS) if "wandb" not in p.parts)
    return sorted(runs)


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's results, recomputed from its JSONL files."""
    events = read_jsonl(run_dir / EVENTS)
    config = next((e["config"] for e in events if e["event"] == "config"), None)
    if config is None:
        raise ValueError(f"{run_dir}/events.jsonl has no config event; is it an atlas run folder?")
    meta = {"task": config["task"]["name"], "method": config["method"]["name"],
            "seed": config["seed"], "run_dir": str(run_dir),
            "score_label": score_label(config["task"])}
    end = next((e for e in reversed(events) if e["event"] == "end"), None)
    meta["wall_seconds"] = end["results"].get("wall_seconds") if end else None
    meta["complete"] = end is not None
    return summarise(run_dir, meta)


def score_label(task_cfg: dict[str, Any]) -> str:
    """The task's own name for its score (``Task.score_label``), from the run's task config."""
    from atlas.tasks import make_task

    cfg = dict(task_cfg)
    try:
        return str(make_task(cfg.pop("name"), **cfg).score_label)
    except Exception:  # a task renamed or removed since the run: the plain word
        return "score"


def _mean_std(values: list[float | None]) -> tuple[float, float, int]:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return math.nan, math.nan, 0
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0, len(xs)


def _group(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["task"], r["method"])].append(r)
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99), kv[0][1])))


def table2(runs: list[dict[str, Any]]) -> str:
    """Initial, final, improvement per task and method: mean +- std over seeds."""
    keys = ("initial_score", "final_score", "improvement_pct", "final_agent",
            "improvement_agent_pct")
    lines = ["Table 2: best score, mean +- std over seeds (higher is better); final: any source "
             "(agent, supporter, seed), agent: the agent's own programs (or the seed); "
             "candidates: evaluated agent+supporter programs (the equal budget)",
             f"{'task':8} {'method':8} {'seeds':>5} {'initial':>18} {'final':>18} "
             f"{'improv. %':>16} {'final agent':>18} {'agent improv. %':>16} {'candidates':>12}"]
    labels: dict[str, str] = {}
    for (task, method), rs in _group(runs).items():
        labels.setdefault(task, str(rs[0].get("score_label") or "score"))
        cols = []
        for key in keys:
            m, s, _ = _mean_std([r.get(key) for r in rs])
            cols.append(f"{m:.4g} +- {s:.2g}")
        cand = sorted({str(r["candidates"]) if r.get("candidate_budget") is None
                       else f"{r['candidates']}/{r['candidate_budget']}" for r in rs})
        lines.append(f"{task:8} {method:8} {len(rs):>5} {cols[0]:>18} {cols[1]:>18} "
                     f"{cols[2]:>16} {cols[3]:>18} {cols[4]:>16} {','.join(cand):>12}")
    lines.insert(1, "score: " + "; ".join(f"{t} = {lab}" for t, lab in labels.items()))
    return "\n".join(lines)


def table3(runs: list[dict[str, Any]], per_trial: bool = False) -> str:
    """Strategist intervention rate per knob and inspector accept rate (Table 3; Table 5 per trial)."""
    title = "Table 5: per trial" if per_trial else "Table 3: agent dynamics, mean over seeds"
    head = f"{'task':8} {'method':8} {'seed':>5} " if per_trial else f"{'task':8} {'method':8} "
    lines = [title, head + " ".join(f"{k:>16}" for k in (*KNOBS, "accept_rate"))]
    for (task, method), rs in _group(runs).items():
        if per_trial:
            for r in sorted(rs, key=lambda r: r["seed"]):
                n = r["phases_trained"]
                cells = [f"{r['interventions'][k]}/{n}" for k in KNOBS]
                cells.append(f"{r['promotions']}/{n}" if r["accept_rate"] is not None else "-")
                lines.append(f"{task:8} {method:8} {r['seed']:>5} " + " ".join(f"{c:>16}" for c in cells))
        else:
            cells = []
            for k in KNOBS:
                m, _, _ = _mean_std([r["intervention_rates"][k] for r in rs])
                cells.append("-" if math.isnan(m) else f"{100 * m:.1f}%")
            m, _, _ = _mean_std([r["accept_rate"] for r in rs])
            cells.append("-" if math.isnan(m) else f"{100 * m:.1f}%")
            lines.append(f"{task:8} {method:8} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def figure2(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Best-so-far score per round, mean and std band over seeds, one PNG per task: solid
    lines are the best of any source, dashed lines the agent's own programs (and the seed).
    A score labelled "-X" that is never positive is drawn as X on a log axis (lower is
    better), e.g. PINN's "-validation loss"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    by_task: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[str, str] = {}
    for r in runs:
        by_task[r["task"]][r["method"]].append(r)
        labels.setdefault(r["task"], str(r.get("score_label") or "score"))
    for task, methods in sorted(by_task.items()):
        label = labels[task]
        values = [v for rs in methods.values() for r in rs for v in r["best_by_round"]
                  if v is not None]
        negated = label.startswith("-") and bool(values) and max(values) < 0
        fig, ax = plt.subplots(figsize=(6, 4))
        for ci, method in enumerate(sorted(methods, key=lambda m: (METHOD_ORDER + (m,)).index(m))):
            for key, style in (("best_by_round", "-"), ("best_by_round_agent", "--")):
                curves = [r.get(key) for r in methods[method] if r.get(key)]
                if not curves:
                    continue
                length = max(len(c) for c in curves)
                arr = np.full((len(curves), length), np.nan)
                for i, c in enumerate(curves):
                    arr[i, : len(c)] = [np.nan if v is None else v for v in c]
                y = -arr if negated else arr
                mean, std = np.nanmean(y, axis=0), np.nanstd(y, axis=0)
                x = np.arange(length)
                who = "any source" if style == "-" else "agent only"
                ax.plot(x, mean, style, color=f"C{ci}",
                        label=f"{method}, {who} (n={len(curves)})")
                if style == "-":
                    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=f"C{ci}")
        if negated:
            ax.set_yscale("log")
            ax.set_ylabel(f"{label[1:].strip()} (lower is better)")
        else:
            ax.set_ylabel(f"best {label} (higher is better)")
        ax.set_xlabel("round")
        ax.set_title(f"Figure 2: {task}")
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"figure2_{task}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m atlas.report", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="multirun or run folders")
    parser.add_argument("--out", type=Path, default=None, help="where PNGs go (default: first dir)")
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not d.exists():
            parser.error(f"{d} does not exist")
    paths = find_runs(args.dirs)
    if not paths:
        parser.error(f"no run folders (with {EVENTS}) under {[str(d) for d in args.dirs]}: "
                     f"pass a sweep folder (multirun/<name>) or a run folder")
    runs = []
    for path in paths:
        try:
            runs.append(load_run(path))
        except (ValueError, KeyError) as exc:  # a run killed before its config event
            print(f"skipping {path}: {exc!r}", file=sys.stderr)
    if not runs:
        parser.error(f"none of the {len(paths)} run folders under {[str(d) for d in args.dirs]} "
                     f"could be read (see above)")
    incomplete = [r["run_dir"] for r in runs if not r["complete"]]
    print(f"{len(runs)} runs ({len(incomplete)} incomplete)\n")
    print(table2(runs), end="\n\n")
    print(table3(runs), end="\n\n")
    print(table3(runs, per_trial=True), end="\n\n")
    for path in figure2(runs, args.out or args.dirs[0]):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
