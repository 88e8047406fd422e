"""``results.json``: the per-run summary the paper's tables are computed from.

Derived only from ``events.jsonl`` and ``programs.jsonl``, so a report can recompute it
for any run folder without re-running anything.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from atlas.telemetry import EVENTS, PROGRAMS, read_jsonl

KNOBS = ("score_threshold", "epochs", "beta", "lr")


def _score(p: dict[str, Any]) -> float:
    s = p["evaluation"].get("score")
    return -math.inf if s is None or not p["evaluation"].get("passed") else float(s)


def valid_rate(programs: list[dict[str, Any]]) -> float | None:
    agent = [p for p in programs if p.get("source") == "agent"]
    if not agent:
        return None
    return sum(1 for p in agent if p["evaluation"].get("passed")) / len(agent)


def best_so_far(programs: list[dict[str, Any]], rounds: int) -> list[float | None]:
    """Best passed score after each round (Figure 2's trajectory)."""
    best, out = -math.inf, []
    by_round: dict[int, list[float]] = {}
    for p in programs:
        by_round.setdefault(int(p["round"]), []).append(_score(p))
    for r in range(rounds + 1):
        best = max([best, *by_round.get(r, [])])
        out.append(best if math.isfinite(best) else None)
    return out


def summarise(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Compute the results record of a run folder; ``meta`` adds task/method/seed/wall time."""
    run_dir = Path(run_dir)
    programs = read_jsonl(run_dir / PROGRAMS)
    events = read_jsonl(run_dir / EVENTS)
    rounds = max((int(p["round"]) for p in programs), default=0)
    seeds = [p for p in programs if p.get("source") == "seed"]
    initial = max((_score(p) for p in seeds), default=-math.inf)
    final = max((_score(p) for p in programs), default=-math.inf)
    improvement = None
    if math.isfinite(initial) and math.isfinite(final) and initial != 0:
        improvement = 100.0 * (final - initial) / abs(initial)
    agent_rounds = sorted({int(p["round"]) for p in programs if p.get("source") == "agent"})
    first = [p for p in programs if p.get("source") == "agent" and agent_rounds and int(p["round"]) == agent_rounds[0]]
    last = [p for p in programs if p.get("source") == "agent" and agent_rounds and int(p["round"]) == agent_rounds[-1]]

    phases = [e for e in events if e["event"] == "phase"]
    trained = [e for e in phases if not e.get("skipped")]
    gated = [e for e in trained if e.get("gate") is not None]
    promotions = sum(1 for e in gated if e.get("promoted"))
    strategist = [e.get("strategist") or {} for e in trained]
    interventions = {k: sum(1 for s in strategist if k in (s.get("changed") or [])) for k in KNOBS}
    failures = Counter(p["evaluation"].get("failure_kind", "ok") for p in programs if p.get("source") == "agent")

    def rate(n: int, d: int) -> float | None:
        return n / d if d else None

    return {
        **meta,
        "initial_score": initial if math.isfinite(initial) else None,
        "final_score": final if math.isfinite(final) else None,
        "improvement_pct": improvement,
        "rounds": rounds,
        "candidates": sum(1 for p in programs if p.get("source") != "seed"),
        "valid_rate": valid_rate(programs),
        "valid_rate_first_round": valid_rate(first),
        "valid_rate_last_round": valid_rate(last),
        "failure_kinds": dict(failures),
        "best_by_round": best_so_far(programs, rounds),
        "phases": len(phases),
        "phases_trained": len(trained),
        "phases_skipped": len(phases) - len(trained),
        "promotions": promotions,
        "accept_rate": rate(promotions, len(gated)),
        "vetoes": sum(1 for e in gated if e.get("vetoed")),
        "interventions": interventions,
        "intervention_rates": {k: rate(v, len(trained)) for k, v in interventions.items()},
    }
