"""What a report says about learning: the probe's findings per method and phase, and the
three separations a reviewer asks for first.

- **The learning table**: per task, method and phase, the learning probe's mean over seeds
  (``atlas.probe``: programs written before and after the phase, on prompts it never trained
  on) of the change in valid rate and in score, KL(policy || base) and the held-out
  preference accuracy, each with its 95 % t interval over seeds. Only methods that fine-tune
  have rows; a phase a run skipped adds nothing to that phase's row.
- **The separations**, paired on seeds (the same hidden environments): what the LLM adds over
  blind tuning (the agent's own best under each LLM method minus the best of
  ``random_literals``, which has no LLM); what fine-tuning adds over sampling (the agent's
  own best under each fine-tuning method minus ``sample``'s, the same agent never trained);
  what the supporters add (ATLAS's best of any source minus its agent's own best, within a
  run, and ATLAS minus EvoDPO, the same evolving reference without supporters).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from atlas import stats

#: the learning table's measures: (key in the phase line's ``probe``, label, how to read it)
PROBE_MEASURES = (("valid_change", "valid rate change"), ("score_change", "score change"),
                  ("kl_base", "KL to base"), ("heldout_accuracy", "held-out accuracy"))
NO_LLM, NEVER_TRAINED = "random_literals", "sample"
FINE_TUNED = ("evotune", "evodpo", "atlas")


def _value(probe: dict[str, Any], key: str) -> float | None:
    v = probe.get(key)
    return v.get("mean") if isinstance(v, dict) else v


def learning_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, method and phase: each probe measure's mean over seeds with its t interval
    (``runs``: results records with ``reference_log``, as ``atlas.report.load_run`` gives)."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        for line in r.get("reference_log") or []:
            if line.get("probe"):
                cells[(r["task"], r["method"], int(line["phase"]))].append(line["probe"])
    rows = []
    for (task, method, phase), probes in sorted(cells.items()):
        row: dict[str, Any] = {"task": task, "method": method, "phase": phase,
                               "n": len(probes)}
        for key, _ in PROBE_MEASURES:
            row[key] = stats.t_interval([_value(p, key) for p in probes])
        rows.append(row)
    return rows


def separations(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three separations (module docstring), per task, as paired differences on seeds."""
    by: dict[str, dict[str, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        by[r["task"]][r["method"]][int(r["seed"])] = r
    rows = []

    def add(task: str, question: str, a_label: str, a: dict[int, Any], b_label: str,
            b: dict[int, Any]) -> None:
        res = stats.paired(a, b)
        if res["n"]:
            rows.append({"task": task, "question": question, "a": a_label, "b": b_label, **res})

    for task, methods in sorted(by.items()):
        def col(method: str, key: str, methods: dict = methods) -> dict[int, Any]:
            return {s: r.get(key) for s, r in methods.get(method, {}).items()}
        for m in (NEVER_TRAINED, *FINE_TUNED):
            if NO_LLM in methods and m in methods:
                add(task, "the LLM over blind tuning", f"{m} (agent's own)",
                    col(m, "final_agent"), NO_LLM, col(NO_LLM, "final_score"))
        for m in FINE_TUNED:
            if NEVER_TRAINED in methods and m in methods:
                add(task, "fine-tuning over sampling", f"{m} (agent's own)",
                    col(m, "final_agent"), f"{NEVER_TRAINED} (agent's own)",
                    col(NEVER_TRAINED, "final_agent"))
        if "atlas" in methods:
            add(task, "the supporters, within ATLAS runs", "atlas (any source)",
                col("atlas", "final_score"), "atlas (agent's own)", col("atlas", "final_agent"))
        if "atlas" in methods and "evodpo" in methods:
            add(task, "the supporters over EvoDPO", "atlas (any source)",
                col("atlas", "final_score"), "evodpo", col("evodpo", "final_score"))
            add(task, "the supporters over EvoDPO", "atlas (agent's own)",
                col("atlas", "final_agent"), "evodpo (agent's own)",
                col("evodpo", "final_agent"))
    return rows
