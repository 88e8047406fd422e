"""``python -m atlas.report <multirun dir> [...]``: the paper's Tables 2, 3, 5 and Figure 2.

Everything is recomputed from the run folders' ``events.jsonl`` / ``programs.jsonl`` (via
``atlas.results.summarise``), so a table can be rebuilt from an archived sweep without
re-running anything, including runs that crashed before writing ``results.json``.

For a seed study it adds (statistics in ``atlas.stats``): each method's mean with a 95%
Student-t interval, paired differences between methods on the same seeds (bootstrap and t
95% intervals, the exact signed-rank p and the smallest p that test can give with that many
seeds), both for the best of any source and the agent's own best, and the agent's
valid-program rate per phase. ``--out`` (default ``report/`` inside the first folder, so the
runs' own folders only ever gain that one folder) receives every table as Markdown
(``report.md``), CSV and JSON (``report.json``), plus the Figure 2 PNGs, so a study's tables
can be committed.

For the pre-registered study it prints the verdict first (``atlas.verdict``: four comparisons
with Holm-adjusted p; every other table is exploratory), and for any runs it checks that the
arms of each block (one task, one seed) faced one task secret (``atlas.pairing``), naming
each block that did not, and lists the runs that were cut and resumed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from atlas import pairing, stats, verdict
from atlas.learning import (
    FINE_TUNED,
    NEVER_TRAINED,
    NO_LLM,
    learning_rows,
    novelty_rows,
    separations,
)
from atlas.provenance import differences, flat
from atlas.results import KNOBS, round_regimes, summarise
from atlas.tasks import make_task
from atlas.telemetry import EVENTS, PROGRAMS, dumps, read_jsonl

#: what a report says of its tables: only the pre-registered family is a test of the study
EXPLORATORY = ("Only the pre-registered family (atlas.verdict) answers the study's questions; "
               "every other table is exploratory.")

#: the arms in the order paired differences are taken (later minus earlier): the two
#: controls first (no LLM, then the agent never fine-tuned), then the fine-tuned methods
METHOD_ORDER = (NO_LLM, NEVER_TRAINED, *FINE_TUNED)


#: where ``atlas.report DIR`` writes by default: beside the runs it reads, never among them
REPORT_DIR = "report"


def holds_run_files(folder: Path) -> bool:
    """Whether ``folder`` is a run folder (its ``events.jsonl`` or ``results.json``)."""
    return (folder / EVENTS).exists() or (folder / "results.json").exists()


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
    meta = {"task": config["task"]["name"], "method": arm(config),
            "seed": config["seed"], "run_dir": str(run_dir),
            "experiment": config.get("experiment_name"),
            "score_label": score_label(config["task"])}
    end = next((e for e in reversed(events) if e["event"] == "end"), None)
    meta["wall_seconds"] = end["results"].get("wall_seconds") if end else None
    meta["complete"] = end is not None
    meta["provenance"] = end["results"].get("provenance") if end else None
    meta["resumed_at"] = end["results"].get("resumed_at") if end else None
    out = summarise(run_dir, meta)
    programs = read_jsonl(run_dir / PROGRAMS)
    out["valid_by_phase"] = valid_by_phase(programs)
    out["phase_log"] = phase_log(events)
    regimes = round_regimes(programs, out["rounds"])
    out["regime_changes"] = [r for r in range(1, len(regimes)) if regimes[r] != regimes[r - 1]]
    out["count_note"] = count_note(run_dir, out, end, events)
    out["secret"] = pairing.secret_evidence(
        run_dir, config, end["results"].get("secret_fingerprint") if end else None)
    return out


def _torn(path: Path) -> bool:
    """Whether ``path`` ends inside a line (its last record cut)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                return False
            fh.seek(size - 1)
            return fh.read(1) != b"\n"
    except OSError:
        return False


def count_note(run_dir: Path, out: dict[str, Any], end: dict[str, Any] | None,
               events: list[dict[str, Any]]) -> str | None:
    """Why a run's counts are short, in one line; None when they are whole. Why: a table
    that counts 15 of 16 candidates must say whether a line was torn or the run stopped."""
    torn = [name for name in (EVENTS, PROGRAMS) if _torn(run_dir / name)]
    cut = f" (torn last line in {', '.join(torn)})" if torn else ""
    fix = "re-run its command: a finished run gets its lines back from its checkpoint"
    if end is None:
        last = max((e.get("round", 0) for e in events if e.get("event") == "round"), default=0)
        return (f"{run_dir}: no end record, so its counts stop at round {last}{cut}; the run "
                f"stopped before it finished, or its last line was torn; {fix}, an unfinished "
                f"one resumes")
    recorded = (end.get("results") or {}).get("candidates")
    if isinstance(recorded, int) and out.get("candidates", 0) < recorded:
        return (f"{run_dir}: {PROGRAMS} holds {out['candidates']} of the {recorded} candidates "
                f"its end record counts{cut or ' (lines lost after the run ended)'}; {fix}")
    return None


def resumed_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One line per run that was cut off and resumed (``resumed_at``: the rounds it resumed
    at). Why shown: a study's runs are resumed, never restarted, and the reader can check."""
    return [f"resumed: {r['task']} {r['method']} seed {r['seed']} at round "
            f"{', '.join(map(str, r['resumed_at']))} ({Path(r['run_dir']).name})"
            for r in sorted(runs, key=lambda r: (r["task"], _arm_order(r["method"]), r["seed"]))
            if r.get("resumed_at")]


def provenance_lines(runs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(one line per arm with its runs' provenance, one warning per table whose runs differ
    in any provenance field). Why warn: runs on another commit, dirty tree, library version,
    machine, dtype or device compare less well than the table's columns suggest."""
    shown, warnings = [], []
    for (task, method), rs in _group(runs).items():
        records = [r.get("provenance") for r in rs]
        fields: dict[str, list[Any]] = {}
        for rec in records:
            for k, v in flat(rec).items():
                if v not in fields.setdefault(k, []):
                    fields[k].append(v)
        text = ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in fields.items()) \
            or "no provenance recorded (a run from before it was recorded, or unfinished)"
        shown.append(f"{task} {method}: {text}")
    for task in sorted({r["task"] for r in runs}):
        diff = differences([r.get("provenance") for r in runs if r["task"] == task])
        if diff:
            warnings.append(f"warning: the runs of task {task}'s tables differ in " + "; ".join(
                f"{k} ({', '.join(map(str, v))})" for k, v in diff.items()))
    return shown, warnings


def phase_log(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per fine-tuning phase: the data D_k (pairs by kind, held-out prompts), the
    gate's decision on the held-out G_k (c*, its score S and the reference's, the gain, its
    paired lower bound, KL) and the strategist's changes with their reasons, so a reader sees
    per phase what the accept rate and intervention rate summarise."""
    rows = []
    for e in events:
        if e.get("event") != "phase":
            continue
        gate = e.get("gate") or {}
        strat = e.get("strategist") or {}
        if e.get("skipped"):
            decision = f"skipped: {e.get('reason', '')}"
        elif not gate:
            decision = "trained (no gate)"
        elif e.get("vetoed"):
            decision = "vetoed by the inspector"
        else:
            decision = "promoted" if e.get("promoted") else str(gate.get("reason", "rejected"))
        rows.append({
            "phase": e.get("phase"), "round": e.get("round"), "pairs": e.get("pairs"),
            "pair_kinds": e.get("pair_kinds") or {}, "held_out_prompts": e.get("held_out_prompts"),
            "decision": decision, "chosen": gate.get("chosen"), "score": gate.get("score"),
            "ref_score": gate.get("ref_score"), "gain": gate.get("gain"),
            "lower": gate.get("lower_bound"), "kl": gate.get("kl"),
            "gate_items": gate.get("items"),
            "strategist": {k: (strat.get("reasons") or {}).get(k, "")
                           for k in strat.get("changed") or []},
        })
    return rows


def arm(config: dict[str, Any]) -> str:
    """The row a run belongs to: its method, or ``method:name`` when the run was given its own
    label (``name=`` differing from the experiment's), so an ablation swept under another name
    (``name=study_nopref supporters.exploration.as_preferences=false``) is its own arm and is
    compared pair-wise with the method on the same seeds, not averaged into it."""
    method = str(config["method"]["name"])
    name, experiment = config.get("name"), config.get("experiment_name")
    return f"{method}:{name}" if name and experiment and name != experiment else method


def valid_by_phase(programs: list[dict[str, Any]]) -> dict[int, float]:
    """Share of the agent's programs that passed, per phase (phase k: the programs phase k
    trains on, written by the policy after k-1 fine-tunings)."""
    seen: dict[int, list[bool]] = defaultdict(list)
    for p in programs:
        if p.get("source") == "agent":
            seen[int(p.get("phase", 0))].append(bool(p["evaluation"].get("passed")))
    return {k: sum(v) / len(v) for k, v in sorted(seen.items()) if v}


def score_label(task_cfg: dict[str, Any]) -> str:
    """The task's own name for its score (``Task.score_label``), from the run's task config."""
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


def _arm_order(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def _group(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["task"], r["method"])].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], _arm_order(kv[0][1]))))


#: columns of words, flush left in a printed table (the others hold numbers: flush right)
TEXT_COLUMNS = frozenset({"task", "method", "metric", "A - B", "question", "kinds", "decision",
                          "c*", "strategist"})


def aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    """``header`` and ``rows`` as lines whose columns line up whatever a cell holds (a long
    method name such as ``random_literals`` shifts nothing): words flush left, numbers flush
    right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    left = [h in TEXT_COLUMNS for h in header]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if left[i] else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), *(line(r) for r in rows)]


def table2(runs: list[dict[str, Any]]) -> str:
    """Initial, final, improvement per task and method: mean +- std over seeds."""
    keys = ("initial_score", "final_score", "improvement_pct", "final_agent",
            "improvement_agent_pct")
    header = ["task", "method", "seeds", "initial", "final", "improv. %", "final agent",
              "agent improv. %", "candidates"]
    rows = []
    labels: dict[str, str] = {}
    for (task, method), rs in _group(runs).items():
        labels.setdefault(task, str(rs[0].get("score_label") or "score"))
        cols = []
        for key in keys:
            m, s, _ = _mean_std([r.get(key) for r in rs])
            cols.append(f"{m:.4g} +- {s:.2g}")
        cand = sorted({str(r["candidates"]) if r.get("candidate_budget") is None
                       else f"{r['candidates']}/{r['candidate_budget']}" for r in rs})
        rows.append([task, method, str(len(rs)), *cols, ",".join(cand)])
    return "\n".join([
        "Table 2: best score, mean +- std over seeds (higher is better); final: any source "
        "(agent, supporter, seed), agent: the agent's own programs (or the seed); "
        "candidates: evaluated agent+supporter programs (the equal budget)",
        "score: " + "; ".join(f"{t} = {lab}" for t, lab in labels.items()),
        *aligned(header, rows)])


def table3(runs: list[dict[str, Any]], per_trial: bool = False) -> str:
    """Strategist intervention rate per knob and inspector accept rate (Table 3; Table 5 per trial)."""
    title = "Table 5: per trial" if per_trial else "Table 3: agent dynamics, mean over seeds"
    header = ["task", "method", *(["seed"] if per_trial else []), *KNOBS, "accept_rate"]
    rows = []
    for (task, method), rs in _group(runs).items():
        if per_trial:
            for r in sorted(rs, key=lambda r: r["seed"]):
                n = r["phases_trained"]
                cells = [f"{r['interventions'][k]}/{n}" for k in KNOBS]
                cells.append(f"{r['promotions']}/{n}" if r["accept_rate"] is not None else "-")
                rows.append([task, method, str(r["seed"]), *cells])
        else:
            cells = []
            for k in KNOBS:
                m, _, _ = _mean_std([r["intervention_rates"][k] for r in rs])
                cells.append("-" if math.isnan(m) else f"{100 * m:.1f}%")
            m, _, _ = _mean_std([r["accept_rate"] for r in rs])
            cells.append("-" if math.isnan(m) else f"{100 * m:.1f}%")
            rows.append([task, method, *cells])
    return "\n".join([title, *aligned(header, rows)])


# -- the seed study: intervals, paired differences, valid rate per phase ---------------------

#: (results key, column name): the best of any source and the agent's own, as scores and as %
STUDY_METRICS = (("final_score", "final (any source)"), ("improvement_pct", "improv. % (any)"),
                 ("final_agent", "final (agent)"), ("improvement_agent_pct", "improv. % (agent)"))


def _methods(rs: dict[str, Any]) -> list[str]:
    return sorted(rs, key=_arm_order)


def study_means(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, method and metric: n seeds, mean, std and the 95% t interval of the mean."""
    rows = []
    for (task, method), rs in _group(runs).items():
        for key, _ in STUDY_METRICS:
            ci = stats.t_interval([r.get(key) for r in rs])
            rows.append({"task": task, "method": method, "metric": key, **ci})
    return rows


def study_paired(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task and metric, A - B for each pair of methods (later in METHOD_ORDER minus
    earlier), over the seeds both ran: the seeds face the same hidden environments."""
    by_task: dict[str, dict[str, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        by_task[r["task"]][r["method"]][int(r["seed"])] = r
    rows = []
    for task, methods in sorted(by_task.items()):
        order = _methods(methods)
        for key, _ in STUDY_METRICS:
            for j, a in enumerate(order):
                for b in order[:j]:
                    res = stats.paired({s: r.get(key) for s, r in methods[a].items()},
                                       {s: r.get(key) for s, r in methods[b].items()})
                    rows.append({"task": task, "metric": key, "a": a, "b": b, **res})
    return rows


def study_valid(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, method and phase: the agent's valid-program rate, mean and t interval
    clipped to [0, 1] (a rate)."""
    rows = []
    for (task, method), rs in _group(runs).items():
        phases = sorted({k for r in rs for k in r.get("valid_by_phase", {})})
        for k in phases:
            ci = stats.rate_interval([r["valid_by_phase"].get(k) for r in rs])
            rows.append({"task": task, "method": method, "phase": k, **ci})
    return rows


def _g(v: Any, fmt: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def _ci(row: dict[str, Any], lo: str = "lo", hi: str = "hi") -> str:
    if row.get(lo) is None or math.isnan(row[lo]):
        return "-"
    return f"[{_g(row[lo])}, {_g(row[hi])}]"


def _ties(row: dict[str, Any]) -> str:
    """The signed-rank test's zero and tied differences (``stats.ties``)."""
    t = row.get("ties")
    return f"{t['zero']} zero, {t['tied']} tied" if t else "-"


def verdict_tables(runs: list[dict[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The pre-registered family (``atlas.verdict``) with Holm-adjusted p, its comparisons
    per task (exploratory) and each arm's endpoint rates; rows only when some run belongs to
    the pre-registered study, so another sweep's report says so instead of 20 empty blocks."""
    pre = verdict.PREREGISTRATION
    ours = any(verdict.in_study(r, pre) for r in runs)
    scope = (f"experiment={pre.experiment}, tasks {'/'.join(pre.tasks)}, seeds "
             f"{pre.seeds[0]}-{pre.seeds[-1]}" if pre.seeds else "")
    none = "" if ours else f"; no run here belongs to it ({scope})"

    def test(r: dict[str, Any]) -> list[str]:
        return [f"{r['a']} - {r['b']}", str(r["n"]), _g(r["mean"], "+.4g"),
                _ci(r, "boot_lo", "boot_hi"), _ci(r, "t_lo", "t_hi"),
                f"{r['wins']}/{r['losses']}", _ties(r), _g(r["p_signed_rank"], ".3g")]

    fam = [[r["question"], r["endpoint"], *test(r), _g(r["p_holm"], ".3g"),
            verdict.left_out_summary(r)] for r in verdict.family(runs)] if ours else []
    per_task = [[r["task"], r["question"], *test(r)] for r in verdict.by_task(runs)] \
        if ours else []
    means = [[r["task"], r["method"], r["endpoint"], str(r["n"]), _g(r["mean"], ".3f"),
              _ci(r) + (" (clipped)" if r.get("clipped") else "")]
             for r in verdict.endpoint_means(runs)]
    return [
        (f"The pre-registered family, the verdict ({scope}; atlas.verdict, docs/study/README.md "
         "'Pre-registration'): each question's A - B on its endpoint per run, paired on the "
         "blocks (task, seed) of both tasks where both runs finished on one task secret; "
         "bootstrap and t 95% CIs, wins/losses, ties, exact two-sided signed-rank p and its "
         f"Holm adjustment over the family of {len(pre.family)}, read against alpha "
         f"{pre.alpha}; blocks left out, by reason "
         f"(report.json names each){none}",
         ["question", "endpoint", "A - B", "blocks", "mean diff", "95% CI (bootstrap)",
          "95% CI (t)", "wins/losses", "ties", "p (signed-rank)", "p (Holm)", "left out"], fam),
        ("The family's comparisons per task: exploratory (no adjustment, not the verdict)" + none,
         ["task", "question", "A - B", "n", "mean diff", "95% CI (bootstrap)", "95% CI (t)",
          "wins/losses", "ties", "p (signed-rank)"], per_task),
        ("The family's endpoints per arm: mean rate over the finished study runs with its 95% "
         "t CI clipped to [0, 1]" + none,
         ["task", "method", "endpoint", "n", "mean", "95% CI (t)"], means),
    ]


def study_tables(runs: list[dict[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The study's tables as (title, header, rows of cells): printed, and written as
    Markdown and CSV by ``write_outputs``."""
    labels = {m: lab for m, lab in STUDY_METRICS}
    means = [[r["task"], r["method"], labels[r["metric"]], str(r["n"]), _g(r["mean"]),
              _g(r["std"], ".2g"), _ci(r)] for r in study_means(runs)]
    paired_rows = study_paired(runs)
    p_floor = sorted({r["p_min"] for r in paired_rows if r["n"]})
    paired = [[r["task"], labels[r["metric"]], f"{r['a']} - {r['b']}", str(r["n"]),
               _g(r["mean"]), _ci(r, "boot_lo", "boot_hi"), _ci(r, "t_lo", "t_hi"),
               f"{r['wins']}/{r['losses']}", _ties(r), _g(r["p_signed_rank"], ".3g"),
               _g(r["p_min"], ".3g")]
              for r in paired_rows]
    valid = [[r["task"], r["method"], str(r["phase"]), str(r["n"]), _g(r["mean"], ".3f"), _ci(r)]
             for r in study_valid(runs)]
    floor = ", ".join(_g(p, ".4g") for p in p_floor) or "-"
    kind_abbr = {"passed_vs_passed": "pp", "passed_vs_failed": "pf", "supporter_vs_agent": "sa"}
    phases = [[r["task"], r["method"], str(r["seed"]), str(p["phase"]), _g(p["pairs"]),
               " ".join(f"{kind_abbr.get(k, k)}{v}" for k, v in p["pair_kinds"].items() if v) or "-",
               _g(p["held_out_prompts"]), p["decision"], p["chosen"] or "-",
               _g(p["score"]), _g(p["ref_score"]), _g(p["gain"], "+.4g"), _g(p["lower"], "+.4g"),
               _g(p["kl"], ".2e"),
               "; ".join(f"{k}: {why}" for k, why in p["strategist"].items()) or "-"]
              for r in sorted(runs, key=lambda r: (r["task"], _arm_order(r["method"]), r["seed"]))
              for p in r.get("phase_log", [])]
    learning = [[r["task"], r["method"], str(r["phase"]), str(r["n"]), _g(r["slots"]),
                 _counts(r["valid_change"], "fail_to_pass", "pass_to_fail"),
                 f"{_g(r['score_change']['mean'], '+.3g')} {_ci(r['score_change'])}",
                 f"{_g(r['kl_base']['mean'], '.2e')} {_ci(r['kl_base'])}",
                 _accuracy(r["heldout"]),
                 _counts(r["copies"], "before", "after", "->"),
                 _counts(r["new_valid"], "before", "after", "->")]
                for r in learning_rows(runs)]
    novel = [[r["task"], r["method"], r["writer"], str(r["phase"]), str(r["seeds"]),
              str(r["proposals"]), f"{r['copies']} ({r['copy_rate']:.0%})",
              f"{r['new']}/{r['evaluated']}", f"{r['new_valid']} ({r['new_valid_per_proposal']:.2f})",
              str(r["new_beats_parents"])]
             for r in novelty_rows(runs)]
    separated = [[r["task"], r["question"], r["kind"], f"{r['a']} - {r['b']}", str(r["n"]),
                  _g(r["mean"]), _ci(r, "boot_lo", "boot_hi"), _ci(r, "t_lo", "t_hi"),
                  f"{r['wins']}/{r['losses']}", _ties(r), _g(r["p_signed_rank"], ".3g")]
                 for r in separations(runs)]
    return [
        *verdict_tables(runs),
        ("Means with 95% Student-t intervals over seeds (mean +- t(0.975, n-1) s/sqrt(n))",
         ["task", "method", "metric", "n", "mean", "std", "95% CI (t)"], means),
        ("Paired differences A - B on the same seeds (same hidden environments): bootstrap "
         f"percentile 95% CI ({stats.RESAMPLES} resamples) and paired t 95% CI; wins/losses: "
         "seeds with A > B / A < B; ties: zero differences (dropped) and tied sizes (average "
         "ranks); exact two-sided Wilcoxon signed-rank p and the smallest p "
         f"it can give with n non-zero pairs ({floor} here): no p below that floor exists, so "
         "these are not claims of significance at 0.05. Exploratory",
         ["task", "metric", "A - B", "n", "mean diff", "95% CI (bootstrap)", "95% CI (t)",
          "wins/losses", "ties", "p (signed-rank)", "min p"], paired),
        ("Valid-program rate of the agent per phase (phase k: written by the policy after k-1 "
         "fine-tunings), mean over seeds with 95% t CI clipped to [0, 1]",
         ["task", "method", "phase", "n", "valid rate", "95% CI (t)"], valid),
        ("Phases: DPO pairs by kind (pp passed/passed, pf passed/failed, sa supporter/agent), "
         "held-out G_k prompts, the decision, and for a gated phase the snapshot c* the gate "
         "chose, its inspector score S on G_k beside the reference's, the gain, its paired 90% "
         "lower bound and the KL; the strategist's changes with their reasons",
         ["task", "method", "seed", "phase", "pairs", "kinds", "G_k", "decision", "c*", "S(c*)",
          "S(ref)", "gain", "lower", "KL", "strategist"], phases),
        ("Learning: the learning probe per phase (programs written before and after the phase, "
         "on prompts it never trained on, with the same seeds), pooled over the n seeds: valid "
         "slots that went fail->pass/pass->fail with the exact sign-test p; the mean score "
         "change (failures at the phase's floor) and KL(policy || base) in nats per token, each "
         "with its 95% t CI over seeds; held-out preference accuracy with its pairs and exact "
         "binomial p (none below 10 pairs); copies of earlier programs and new valid programs, "
         "before -> after",
         ["task", "method", "phase", "n", "slots", "valid +/- (p)", "score change",
          "KL to base", "held-out accuracy", "copies", "new & valid"], learning),
        ("Novelty per exploration phase (phase k: the rounds before phase k's training), "
         "pooled over seeds: proposals, copies of a program the run already had (not "
         "evaluated under explore.copies=skip), evaluated programs that were new, new valid "
         "programs (per proposal), and new programs above the best parent in their prompt",
         ["task", "method", "writer", "phase", "seeds", "proposals", "copies", "new/evaluated",
          "new & valid", "above parents"], novel),
        ("What each part adds, paired on seeds: the LLM over blind tuning (random_literals, no "
         "LLM), fine-tuning over sampling (sample, never trained), the evolving reference "
         "(EvoDPO over EvoTune), the supporters over EvoDPO; bootstrap and t 95% CIs, "
         "wins/losses, ties, exact signed-rank p; exploratory. The supporters within ATLAS runs "
         "(any source minus the agent's own, >= 0 by construction) is a decomposition, not a "
         "test: its mean and the seeds above 0, no interval, no p",
         ["task", "question", "kind", "A - B", "n", "mean diff", "95% CI (bootstrap)",
          "95% CI (t)", "wins/losses", "ties", "p (signed-rank)"], separated),
    ]


def _counts(d: dict[str, Any], a: str, b: str, sep: str = "/") -> str:
    """Two pooled counts, with the exact p where the cell has one."""
    if d.get(a) is None or d.get(b) is None:
        return "n/a"
    p = d.get("p")
    return f"{d[a]}{sep}{d[b]}" + (f" (p {p:.2f})" if p is not None else "")


def _accuracy(h: dict[str, Any]) -> str:
    if h.get("accuracy") is None:
        return f"too few pairs ({h.get('pairs') or 0})"
    return f"{h['accuracy']:.2f} of {h['pairs']} (p {_g(h.get('p'), '.2g')})"


def empty_reason(title: str, runs: list[dict[str, Any]]) -> str:
    """Why a table of the study has no row, in words: most need two methods (or two arms of a
    question) on the same seeds, or a trained phase. Why: an empty header reads as a bug."""
    methods = sorted({r["method"] for r in runs}, key=_arm_order)
    seeds = sorted({int(r["seed"]) for r in runs})
    held = (f"these runs hold {len(methods)} method{'s' if len(methods) != 1 else ''} "
            f"({', '.join(methods)}) on {len(seeds)} seed{'s' if len(seeds) != 1 else ''} "
            f"({', '.join(map(str, seeds))})")
    if title.startswith("Paired"):
        return (f"no rows: a paired difference needs two methods run on the same seed; {held} "
                f"(e.g. -m method=evotune,atlas seed=0,1,2)")
    if title.startswith("What each part adds"):
        return (f"no rows: each question pairs two arms on the same seeds (random_literals or "
                f"sample against a fine-tuned method, evodpo against evotune, atlas against "
                f"evodpo); {held}")
    if title.startswith("Learning"):
        return ("no rows: no phase of these runs trained with the learning probe on (every "
                "phase was skipped, the method never fine-tunes, or probe.enabled=false)")
    if title.startswith("Phases"):
        return "no rows: no fine-tuning phase in these runs (explore.phase_every > explore.rounds?)"
    return f"no rows; {held}"


def _text(title: str, header: list[str], rows: list[list[str]],
          runs: list[dict[str, Any]] | None = None) -> str:
    if not rows:
        return "\n".join([title, "  " + empty_reason(title, runs or [])])
    return "\n".join([title, *aligned(header, rows)])


def _markdown(title: str, header: list[str], rows: list[list[str]],
              runs: list[dict[str, Any]] | None = None) -> str:
    if not rows:
        return "\n".join([f"**{title}**", "", f"_{empty_reason(title, runs or [])}_"])
    esc = lambda c: c.replace("|", "\\|")  # noqa: E731
    return "\n".join([f"**{title}**", "", "| " + " | ".join(header) + " |",
                       "|" + "---|" * len(header),
                       *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)])


def classic_tables(runs: list[dict[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Tables 2, 3 and 5 as (title, header, rows) for the Markdown/CSV files (the printed
    versions are ``table2`` and ``table3``)."""
    t2 = []
    for (task, method), rs in _group(runs).items():
        cells = [task, method, str(len(rs))]
        for key in ("initial_score", "final_score", "improvement_pct", "final_agent",
                    "improvement_agent_pct"):
            m, sd, _ = _mean_std([r.get(key) for r in rs])
            cells.append(f"{_g(m)} +- {_g(sd, '.2g')}")
        cells.append(",".join(sorted({str(r["candidates"]) for r in rs})))
        t2.append(cells)
    t3, t5 = [], []
    for (task, method), rs in _group(runs).items():
        cells = [task, method]
        for k in KNOBS:
            m, _, _ = _mean_std([r["intervention_rates"][k] for r in rs])
            cells.append("-" if math.isnan(m) else f"{100 * m:.1f}%")
        m, _, _ = _mean_std([r["accept_rate"] for r in rs])
        t3.append(cells + ["-" if math.isnan(m) else f"{100 * m:.1f}%"])
        for r in sorted(rs, key=lambda r: r["seed"]):
            n = r["phases_trained"]
            t5.append([task, method, str(r["seed"]), *(f"{r['interventions'][k]}/{n}" for k in KNOBS),
                       f"{r['promotions']}/{n}" if r["accept_rate"] is not None else "-"])
    return [
        ("Table 2: best score, mean +- std over seeds (final: any source; agent: the agent's own)",
         ["task", "method", "seeds", "initial", "final", "improv. %", "final agent",
          "agent improv. %", "candidates"], t2),
        ("Table 3: strategist intervention rate per knob and inspector accept rate, mean over seeds",
         ["task", "method", *KNOBS, "accept_rate"], t3),
        ("Table 5: per trial (interventions / trained phases, promotions / trained phases)",
         ["task", "method", "seed", *KNOBS, "accept_rate"], t5),
    ]


CSV_NAMES = ("table2", "table3", "table5", "verdict", "verdict_by_task", "endpoints", "means_ci",
             "paired", "valid_by_phase", "phases", "learning", "novelty", "separations")


def write_outputs(runs: list[dict[str, Any]], out_dir: Path, figures: list[Path]) -> list[Path]:
    """``report.md`` (every table), one CSV per table and ``report.json`` (per-run records
    and the study's numbers unrounded) into ``out_dir``."""
    import csv

    out_dir.mkdir(parents=True, exist_ok=True)
    tables = classic_tables(runs) + study_tables(runs)
    written = []
    for name, (_, header, rows) in zip(CSV_NAMES, tables):
        path = out_dir / f"{name}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(rows)
        written.append(path)
    md = ["# Study report", "",
          f"{len(runs)} runs; regenerate with `python -m atlas.report <run folders> --out <this folder>`.",
          "", EXPLORATORY, ""]
    for table in tables:
        md += [_markdown(*table, runs), ""]
    shown, warnings = provenance_lines(runs)
    blocks = pairing.blocks(runs)
    warnings += pairing.warnings(blocks)
    md += ["**Provenance per arm**", "",
           *(f"- {x}" for x in shown + resumed_lines(runs) + warnings), ""]
    changes = {t: sorted({c for r in runs if r["task"] == t for c in r.get("regime_changes") or []})
               for t in {r["task"] for r in runs}}
    for f in figures:
        if f.parent.resolve() == out_dir.resolve():
            md.append(f"![{f.stem}]({f.name})")
            task = f.stem.removeprefix("figure2_")
            if changes.get(task):
                md += ["", figure2_caption(changes[task]), ""]
    (out_dir / "report.md").write_text("\n".join(md) + "\n")
    written.append(out_dir / "report.md")
    keep = ("task", "method", "seed", "complete", "wall_seconds", "score_label", "candidates",
            "initial_score", "final_score", "improvement_pct", "final_agent",
            "improvement_agent_pct", "valid_rate", "valid_by_phase", "best_by_round",
            "best_by_round_agent", "phases", "phases_trained", "promotions", "accept_rate",
            "interventions", "pair_kinds", "candidates_by_source", "phase_log", "provenance",
            "regime_changes", "supporter_calls", "novelty", "valid_rate_by_phase",
            "generated_tokens", "experiment", "secret", "resumed_at")
    doc = {"runs": [{k: r.get(k) for k in keep} | {"run": Path(r["run_dir"]).name} for r in runs],
           "means": study_means(runs), "paired": study_paired(runs), "valid_by_phase": study_valid(runs),
           "learning": learning_rows(runs), "novelty": novelty_rows(runs),
           "separations": separations(runs),
           "pairing": {"blocks": blocks,
                       "unshared": [f"{b['task']} s{b['seed']}" for b in blocks if b["conflicts"]]},
           "verdict": {"preregistration": asdict(verdict.PREREGISTRATION),
                       "family": verdict.family(runs), "by_task": verdict.by_task(runs),
                       "endpoints": verdict.endpoint_means(runs)}}
    (out_dir / "report.json").write_text(dumps(doc) + "\n")
    written.append(out_dir / "report.json")
    return written


def _band(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column: mean over the finite rows and its 95% t interval (NaN where n < 2)."""
    from scipy.stats import t

    n = np.sum(np.isfinite(arr), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(np.where(np.isfinite(arr), arr, np.nan), axis=0) if arr.size else arr
        std = np.array([np.nanstd(c, ddof=1) if k > 1 else np.nan for c, k in zip(arr.T, n)])
        half = np.where(n > 1, t.ppf(0.975, np.maximum(n - 1, 1)) * std / np.sqrt(np.maximum(n, 1)),
                        np.nan)
    return mean, mean - half, mean + half


#: a score label's words, for a figure's axis: the tables keep the short label
LABEL_WORDS = {"NMR": "negative mean regret (NMR)"}


def _same_curve(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two mean curves coincide (NaN where both are NaN)."""
    return a.shape == b.shape and bool(np.allclose(a, b, equal_nan=True))


def figure2(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Best-so-far score per round, one PNG per task with two panels: the best of any source
    (agent, supporter, seed) and the agent's own programs (and the seed). Each method: the
    mean over seeds, with its 95% t band where it has two seeds or more (the title says which).
    A score labelled "-X" that is never positive is drawn as X on a log axis (lower is
    better), e.g. PINN's "-validation loss"; a short label is spelled out (``LABEL_WORDS``).

    Rounds are whole numbers on the axis; a dotted line after round k marks a fine-tuning
    phase there. A method whose curve coincides with one drawn before it keeps its own line
    style and says so in the legend ("= evotune"), so no line hides another in silence.
    A round where the task's equation changed (PINN's viscosity stepping to the shock
    regime) is marked with a dashed vertical line and the caption says so: the best so far
    is taken on each round's own equation, so the curve may jump there while Table 2,
    which compares initial and final on the last equation, reports a gain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
        changes = sorted({c for rs in methods.values() for r in rs
                          for c in r.get("regime_changes") or []})
        phases = sorted({int(p["round"]) for rs in methods.values() for r in rs
                         for p in r.get("phase_log") or [] if p.get("round") is not None})
        seeds = [len(rs) for rs in methods.values()]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.6 if changes else 4), sharey=True)
        coincide: list[str] = []
        for ax, key, who in ((axes[0], "best_by_round", "any source"),
                             (axes[1], "best_by_round_agent", "agent only")):
            drawn: list[tuple[str, np.ndarray]] = []
            for ci, method in enumerate(_methods(methods)):
                curves = [r.get(key) for r in methods[method] if r.get(key)]
                if not curves:
                    continue
                length = max(len(c) for c in curves)
                arr = np.full((len(curves), length), np.nan)
                for i, c in enumerate(curves):
                    arr[i, : len(c)] = [np.nan if v is None else v for v in c]
                mean, lo, hi = _band(-arr if negated else arr)
                x = np.arange(length)
                color = f"C{METHOD_ORDER.index(method) if method in METHOD_ORDER else 3 + ci}"
                # a line style and width per method, and the legend names the curve it
                # coincides with: identical curves (EvoDPO equal to EvoTune when the agent
                # never beats the seed after their references part) stay visible and said
                style = ("-", "--", ":", "-.")[_arm_order(method)[0] % 4]
                same = [m for m, other in drawn if _same_curve(mean, other)]
                if same:
                    coincide.append(f"{method} = {same[0]} ({who})")
                # a coinciding curve: thin and solid with its own markers, over the wider line
                # it coincides with, so both stay in sight
                ax.plot(x, mean, "-" if same else style, color=color,
                        linewidth=1.0 if same else 2.6 - 0.4 * (ci % 3),
                        marker=("x" if same else "o") if length <= 12 else None,
                        markersize=6 if same else 3,
                        label=f"{method} (n={len(curves)})" + (f" = {same[0]}" if same else ""))
                drawn.append((method, mean))
                if negated:  # a band reaching <= 0 cannot be drawn on the log axis
                    lo = np.where(lo > 0, lo, np.nan)
                if len(curves) > 1:
                    ax.fill_between(x, lo, hi, alpha=0.2, color=color, linewidth=0)
            for i, k in enumerate(phases):  # after round k, before round k + 1
                ax.axvline(k + 0.5, color="0.6", linestyle=":", linewidth=1.2,
                           label="fine-tuning phase" if i == 0 else None)
            for i, c in enumerate(changes):  # between round c-1 and c
                ax.axvline(c - 0.5, color="0.4", linestyle="--", linewidth=1,
                           label="equation changes" if i == 0 else None)
            ax.set_title(f"{task}: best so far, {who}")
            ax.set_xlabel("round (0: the seed program)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=8)
        words = LABEL_WORDS.get(label.lstrip("-").strip(), label.lstrip("-").strip())
        if negated:
            axes[0].set_yscale("log")
            axes[0].set_ylabel(f"{words} (lower is better)")
        else:
            axes[0].set_ylabel(f"best {LABEL_WORDS.get(label, label)} (higher is better)")
        if min(seeds) > 1:
            band = "mean over seeds with 95% t band"
        elif max(seeds) > 1:
            band = "mean over seeds; 95% t band where a method has 2+ seeds"
        else:
            band = "one seed per method, so no band"
        fig.suptitle(f"Figure 2: {task}, {band}")
        notes = ([f"Coinciding lines: {'; '.join(coincide)}."] if coincide else []) + (
            [figure2_caption(changes)] if changes else [])
        if notes:
            fig.set_figheight(4.6)  # a strip for the notes under the panels
            fig.text(0.5, 0.01, " ".join(notes), ha="center", va="bottom", fontsize=8,
                     wrap=True)
            fig.tight_layout(rect=(0, 0.08, 1, 1))
        else:
            fig.tight_layout()
        path = out_dir / f"figure2_{task}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def figure2_caption(changes: list[int]) -> str:
    """The caption line of a Figure 2 with regime changes (also in report.md)."""
    rounds = ", ".join(str(c) for c in changes)
    return (f"Dashed lines: the task's equation changed at round {rounds}. Each round's best is "
            f"scored on that round's equation, so the curve may jump there; Table 2 compares "
            f"initial and final on the last equation (the seed re-scored on it).")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m atlas.report", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="multirun or run folders")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the PNGs, report.md, the CSVs and report.json go (default: "
                             "report/ inside the first dir, never among a run's own files)")
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not d.exists():
            parser.error(f"{d} does not exist")
    out = args.out or args.dirs[0] / REPORT_DIR
    if holds_run_files(out):
        parser.error(f"--out {out} is a run folder: the report would mix its files with the "
                     f"run's own; choose another folder, or leave --out out "
                     f"({args.dirs[0] / REPORT_DIR})")
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
    print(f"{len(runs)} runs ({len(incomplete)} incomplete)\n{EXPLORATORY}\n")
    print(table2(runs), end="\n\n")
    print(table3(runs), end="\n\n")
    print(table3(runs, per_trial=True), end="\n\n")
    for table in study_tables(runs):
        print(_text(*table, runs), end="\n\n")
    shown, warnings = provenance_lines(runs)
    print("Provenance per arm:\n" + "\n".join(shown + resumed_lines(runs)), end="\n\n")
    warnings += pairing.warnings(pairing.blocks(runs))
    for line in warnings + [f"warning: {r['count_note']}" for r in runs if r.get("count_note")]:
        print(line, file=sys.stderr)
    figures = figure2(runs, out)
    for path in figures + write_outputs(runs, out, figures):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
