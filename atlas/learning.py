"""What a report says about learning: the probe's findings per method and phase, and the
separations a reviewer asks for first.

- **The learning table**: per task, method and phase, the learning probe's mean over seeds
  (``atlas.probe``: programs written before and after the phase, on prompts it never trained
  on) of the change in valid rate and in score, KL(policy || base) and the held-out
  preference accuracy, each with its 95 % t interval over seeds. Only methods that fine-tune
  have rows; a phase a run skipped adds nothing to that phase's row.
- **The separations**, paired on seeds (the same hidden environments): what the LLM adds over
  blind tuning (the agent's own best under each LLM method minus the best of
  ``random_literals``, which has no LLM); what fine-tuning adds over sampling (the agent's
  own best under each fine-tuning method minus ``sample``'s, the same agent never trained);
  what the evolving reference adds (EvoDPO's agent minus EvoTune's, a fixed reference);
  what the supporters add (ATLAS minus EvoDPO, the same evolving reference without
  supporters). All exploratory: the verdict's tests are ``atlas.verdict``'s.
- **A decomposition, not a test**: the supporters within ATLAS runs, the best of any source
  minus the agent's own best of the same run. It is >= 0 by construction (the best of any
  source includes the agent's), so a test of it would reject "no difference" whenever a
  supporter ever wrote the best program: it gets its mean and the seeds where it is above
  0, no interval and no p.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from atlas import stats

NO_LLM, NEVER_TRAINED = "random_literals", "sample"
FINE_TUNED = ("evotune", "evodpo", "atlas")


def _value(probe: dict[str, Any], key: str) -> float | None:
    v = probe.get(key)
    return v.get("mean") if isinstance(v, dict) else v


def _total(probes: list[dict[str, Any]], get: Any) -> int | None:
    """The sum over seeds of a count (None when a record lacks it: written before counts)."""
    values = [get(p) for p in probes]
    return None if any(v is None for v in values) else int(sum(values))


def learning_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, method and phase, the probe over seeds (``runs``: results records with
    ``reference_log``, as ``atlas.report.load_run`` gives). Binary outcomes are pooled as
    counts with exact tests, never t intervals: the valid slots that went fail -> pass and
    pass -> fail (sign test p), held-out pairs right of all (binomial p; no accuracy below
    ``stats.MIN_ACCURACY_PAIRS`` pairs), copies and new valid programs before and after. The
    score change and the KL get a t interval over seeds (the KL's floored at 0)."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        for line in r.get("reference_log") or []:
            if line.get("probe"):
                cells[(r["task"], r["method"], int(line["phase"]))].append(line["probe"])
    rows = []
    for (task, method, phase), probes in sorted(cells.items()):
        up = _total(probes, lambda p: (p.get("valid_change") or {}).get("fail_to_pass"))
        down = _total(probes, lambda p: (p.get("valid_change") or {}).get("pass_to_fail"))
        pairs = _total(probes, lambda p: p.get("heldout_pairs") or 0) or 0
        right = _total(probes, lambda p: p.get("heldout_right") if p.get("heldout_right")
                       is not None else (None if p.get("heldout_accuracy") is None
                                         else round(p["heldout_accuracy"]
                                                    * (p.get("heldout_pairs") or 0))))
        kl = stats.t_interval([p.get("kl_base") for p in probes])
        if kl.get("lo") is not None and kl["lo"] == kl["lo"]:
            kl["lo"] = max(0.0, kl["lo"])
        rows.append({
            "task": task, "method": method, "phase": phase, "n": len(probes),
            "slots": _total(probes, lambda p: (p.get("prompts") or 0) * (p.get("samples") or 0)),
            "valid_change": {"fail_to_pass": up, "pass_to_fail": down,
                             "p": stats.binomial_p(up, up + down)
                             if up is not None and down is not None else None},
            "score_change": stats.t_interval([_value(p, "score_change") for p in probes]),
            "kl_base": kl,
            "heldout": {"pairs": pairs, "right": right,
                        "accuracy": right / pairs if right is not None
                        and pairs >= stats.MIN_ACCURACY_PAIRS else None,
                        "p": stats.binomial_p(right, pairs) if right is not None else None},
            "copies": {"before": _total(probes, lambda p: p.get("copies_before")),
                       "after": _total(probes, lambda p: p.get("copies_after"))},
            "new_valid": {"before": _total(probes, lambda p: p.get("new_valid_before")),
                          "after": _total(probes, lambda p: p.get("new_valid_after"))}})
    return rows


def novelty_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, method, writer (agent, supporters) and exploration phase (the rounds before
    phase k's training), pooled over seeds: proposals, copies, evaluated programs that were
    new, new valid programs per proposal and those above their parents
    (``results.json``'s ``novelty``)."""
    cells: dict[tuple[str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        for row in (r.get("novelty") or {}).get("by_phase") or []:
            for who in ("agent", "supporter"):
                t = row.get(who) or {}
                if t.get("proposals"):
                    cells[(r["task"], r["method"], who, int(row["phase"]))].append(t)
    out = []
    for (task, method, who, phase), ts in sorted(cells.items()):
        total = {k: sum(int(t.get(k) or 0) for t in ts)
                 for k in ("proposals", "evaluated", "copies", "valid", "new_valid",
                           "new_beats_parents")}
        new = sum(int((t.get("labels") or {}).get("new") or 0) for t in ts)
        out.append({"task": task, "method": method, "writer": who, "phase": phase,
                    "seeds": len(ts), **total, "new": new,
                    "copy_rate": total["copies"] / total["proposals"],
                    "new_share_of_evaluated": new / total["evaluated"]
                    if total["evaluated"] else None,
                    "new_valid_per_proposal": total["new_valid"] / total["proposals"]})
    return out


def separations(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The separations (module docstring), per task, as paired differences on seeds; each
    row's ``kind`` says whether it is an exploratory comparison or the decomposition."""
    by: dict[str, dict[str, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        by[r["task"]][r["method"]][int(r["seed"])] = r
    rows = []

    def add(task: str, question: str, a_label: str, a: dict[int, Any], b_label: str,
            b: dict[int, Any], decomposition: bool = False) -> None:
        res = stats.paired(a, b)
        if decomposition:  # descriptive only (module docstring)
            res.update({k: None for k in ("boot_lo", "boot_hi", "t_lo", "t_hi",
                                          "p_signed_rank", "p_min", "ties")})
        if res["n"]:
            rows.append({"task": task, "question": question, "a": a_label, "b": b_label,
                         "kind": "decomposition" if decomposition else "exploratory", **res})

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
        if "evodpo" in methods and "evotune" in methods:
            add(task, "the evolving reference", "evodpo (agent's own)",
                col("evodpo", "final_agent"), "evotune (agent's own)",
                col("evotune", "final_agent"))
        if "atlas" in methods:
            add(task, "the supporters, within ATLAS runs", "atlas (any source)",
                col("atlas", "final_score"), "atlas (agent's own)", col("atlas", "final_agent"),
                decomposition=True)
        if "atlas" in methods and "evodpo" in methods:
            add(task, "the supporters over EvoDPO", "atlas (any source)",
                col("atlas", "final_score"), "evodpo", col("evodpo", "final_score"))
            add(task, "the supporters over EvoDPO", "atlas (agent's own)",
                col("atlas", "final_agent"), "evodpo (agent's own)",
                col("evodpo", "final_agent"))
    return rows
