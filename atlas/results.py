"""``results.json``: the per-run summary the paper's tables are computed from.

Derived only from ``events.jsonl`` and ``programs.jsonl``, so a report can recompute it
for any run folder without re-running anything.

Two columns of every score: ``final_score`` is the best program of any source (the agent,
the ATLAS exploration supporter, the seed); ``final_agent`` is the best the agent wrote (or
the seed, where the agent never beat it), so a supporter's hand-written tuning is never
credited to the agent, nor is the agent's verbatim copy of a supporter program from its
prompt. Like for like: scores compare only on one equation (``Program.regime``; the PINN
viscosity steps between phases), so initial and final are both taken on the last
equation of the run, the seed and the incumbents re-scored on it (``source="rescore"``), and
Figure 2's best-so-far at round r is over programs scored on round r's equation.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from atlas.compose import group_defaults
from atlas.dpo.config import GateConfig
from atlas.dpo.rules import DEFAULT_RULE, INSUFFICIENT, rule
from atlas.knobs import KNOBS
from atlas.novelty import labelled, program_key, tally
from atlas.schema import ExploreConfig, from_record
from atlas.telemetry import EVENTS, PROGRAMS, read_jsonl

__all__ = ["KNOBS", "summarise"]


def _score(p: dict[str, Any]) -> float:
    s = p["evaluation"].get("score")
    return -math.inf if s is None or not p["evaluation"].get("passed") else float(s)


def _origins(programs: list[dict[str, Any]], entry_point: str | None = None) -> dict[int, str]:
    """Program id -> who wrote its code. A re-score counts as the program it re-scored, and an
    agent program that repeats an earlier supporter program counts as the supporter's: the
    agent's prompt shows its island's best programs, supporter patches included, and copying
    one out of the prompt is not the agent's own discovery (in the seed study's ATLAS bandit
    runs the agent's best was such a copy in most seeds). "Repeats" is ``atlas.novelty``'s
    rule: the same syntax tree of the code the entry point reaches, so a patch with an unused
    function appended is still the patch. A copy with any live change of its own (one
    literal) stays the agent's."""
    by_id = {int(p["id"]): p for p in programs}
    supporter_code: set[str] = set()
    out = {}
    for p in sorted(programs, key=lambda p: int(p["id"])):
        q = p
        while q.get("source") == "rescore" and q.get("parents") and int(q["parents"][0]) in by_id:
            q = by_id[int(q["parents"][0])]
        source = q.get("source", "agent")
        key = program_key(q["code"], entry_point) if isinstance(q.get("code"), str) else None
        if source == "supporter" and key is not None:
            supporter_code.add(key)
        elif source == "agent" and key is not None and key in supporter_code:
            source = "supporter_copy"
        out[int(p["id"])] = source
    return out


def valid_rate(programs: list[dict[str, Any]]) -> float | None:
    agent = [p for p in programs if p.get("source") == "agent"]
    if not agent:
        return None
    return sum(1 for p in agent if p["evaluation"].get("passed")) / len(agent)


def round_regimes(programs: list[dict[str, Any]], rounds: int) -> list[str]:
    """The equation each round scored on (a round without programs keeps the previous one)."""
    seen: dict[int, str] = {}
    for p in programs:
        if p.get("source") != "rescore" or int(p["round"]) not in seen:
            seen[int(p["round"])] = p.get("regime", "")
    out, current = [], seen.get(0, "")
    for r in range(rounds + 1):
        current = seen.get(r, current)
        out.append(current)
    return out


def best_so_far(programs: list[dict[str, Any]], rounds: int,
                sources: tuple[str, ...] | None = None,
                entry_point: str | None = None) -> list[float | None]:
    """Best passed score after each round among programs on that round's equation
    (Figure 2's trajectory); ``sources`` keeps only code those sources wrote."""
    origins = _origins(programs, entry_point)
    regimes = round_regimes(programs, rounds)
    out = []
    for r in range(rounds + 1):
        best = max((_score(p) for p in programs if int(p["round"]) <= r
                    and p.get("regime", "") == regimes[r]
                    and (sources is None or origins[int(p["id"])] in sources)),
                   default=-math.inf)
        out.append(best if math.isfinite(best) else None)
    return out


def _pct(new: float, old: float) -> float | None:
    if math.isfinite(old) and math.isfinite(new) and old != 0:
        return 100.0 * (new - old) / abs(old)
    return None


def recorded_config(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's composed config as its ``config`` event recorded it ({} without one)."""
    return next((e["config"] for e in events if e["event"] == "config"), None) or {}


def entry_point(events: list[dict[str, Any]]) -> str | None:
    """The task's entry point: as the ``config`` event recorded it, else the one the
    recorded task builds today (None where neither is known: then no code counts as dead)."""
    first = next((e for e in events if e["event"] == "config"), None) or {}
    if first.get("entry_point"):
        return str(first["entry_point"])
    task = (first.get("config") or {}).get("task")
    if not isinstance(task, dict):
        return None
    try:
        from atlas.tasks import make_task  # deferred: a task imports its evaluator and Hydra

        return make_task(**task).prompt_spec().entry_point
    except Exception:  # noqa: BLE001 - an old or foreign task: keep every definition
        return None


def novelty(programs: list[dict[str, Any]], events: list[dict[str, Any]],
            origins: dict[int, str]) -> dict[str, Any]:
    """``atlas.novelty.tally`` for the agent and the supporters, over the run and per
    exploration phase (the rounds before phase k's training are phase k): copies that were
    not evaluated come from the round events. A re-score is not a proposal."""
    skipped: dict[int, list[dict[str, Any]]] = {}
    patch_copies: dict[int, list[Any]] = {}
    phase_of = {int(e["round"]): int(e.get("phase", 0)) for e in events if e["event"] == "round"}
    for e in events:
        if e["event"] == "round":
            skipped.setdefault(int(e.get("phase", 0)), []).extend(e.get("copies") or [])
        elif e["event"] == "exploration" and e.get("copies"):
            patch_copies.setdefault(phase_of.get(int(e["round"]), 0), []).extend(e["copies"])

    def writer(p: dict[str, Any]) -> str | None:
        who = origins.get(int(p["id"]))
        return {"agent": "agent", "supporter_copy": "agent", "supporter": "supporter"}.get(
            who or "")

    def part(rows: list[dict[str, Any]], copies: list[Any], patches: list[Any]
             ) -> dict[str, Any]:
        return {"agent": tally([p for p in rows if writer(p) == "agent"], copies),
                "supporter": tally([p for p in rows if writer(p) == "supporter"], patches)}

    def every(d: dict[int, list[Any]]) -> list[Any]:
        return [c for cs in d.values() for c in cs]

    phases = sorted({int(p.get("phase", 0)) for p in programs if writer(p)} | set(skipped)
                    | set(patch_copies))
    return {**part(programs, every(skipped), every(patch_copies)),
            "by_phase": [{"phase": k, **part([p for p in programs
                                              if int(p.get("phase", 0)) == k],
                                             skipped.get(k, []), patch_copies.get(k, []))}
                         for k in phases if k > 0]}


def _budget(config: dict[str, Any], rounds: int) -> int | None:
    """Evaluated candidates the config allows: rounds x islands_per_round x samples_per_prompt
    (the explore settings read through their schema; None where the run did not record the
    two per-round counts, or recorded values the schema refuses; a run that did not record
    its rounds counts the rounds its programs reached)."""
    recorded = from_record(ExploreConfig, config.get("explore"), group_defaults("explore"))
    if recorded is None:
        return None
    explore, lacked = recorded
    if {"islands_per_round", "samples_per_prompt"} & lacked:
        return None
    runs = rounds if "rounds" in lacked else explore.rounds
    return runs * explore.islands_per_round * explore.samples_per_prompt


def gate_rule(config: dict[str, Any]) -> str:
    """The rule that judged the run's phases (``gate.rule``; a run recorded before rules
    existed, or whose gate settings the schema refuses, had the default)."""
    recorded = from_record(GateConfig, config.get("gate"), {})
    return recorded[0].rule if recorded is not None else DEFAULT_RULE


def probe_line(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the learning probe of one phase found (``atlas.probe``), from its ``phase``
    event: valid rate and scores before and after with the paired changes, the KL to the
    base and to the reference, held-out preference accuracy and margin, and its cost (seconds
    and the share of the phase's own seconds); None without a probe."""
    probe = event.get("probe")
    if not probe:
        return None
    before, after = probe.get("before") or {}, probe.get("after") or {}
    change = probe.get("change") or {}
    held = probe.get("heldout") or {}
    seconds = (probe.get("seconds") or {}).get("total")
    phase_seconds = event.get("seconds")
    nov_b, nov_a = before.get("novelty") or {}, after.get("novelty") or {}
    return {"prompts": probe.get("prompts"), "samples": probe.get("samples"),
            "valid_before": before.get("valid_rate"), "valid_after": after.get("valid_rate"),
            "valid_change": change.get("valid_rate"),
            "copies_before": nov_b.get("copies"), "copies_after": nov_a.get("copies"),
            "new_valid_before": nov_b.get("new_valid"), "new_valid_after": nov_a.get("new_valid"),
            "parents_from_phase": probe.get("parents_from_phase"),
            "heldout_right": held.get("right"), "heldout_p": held.get("p"),
            "mean_before": before.get("mean_score"), "mean_after": after.get("mean_score"),
            "best_before": before.get("best_score"), "best_after": after.get("best_score"),
            "score_change": change.get("score"),
            "kl_base": probe.get("kl_base"), "kl_reference": probe.get("kl_reference"),
            "heldout_pairs": held.get("pairs"), "heldout_accuracy": held.get("accuracy"),
            "heldout_margin": held.get("margin"), "seconds": seconds,
            # the phase event's seconds leave the probe out: its share of phase and probe
            "share_of_phase": (seconds / (phase_seconds + seconds)
                               if seconds is not None and phase_seconds else None)}


def phase_line(event: dict[str, Any], rule_name: str = DEFAULT_RULE) -> dict[str, Any]:
    """What the reference did in one phase, from its ``phase`` event: trained or skipped (and
    why), G_k, the gain, its lower bound, the KL and the outcome (promoted, rejected in the
    words of the rule that judged it, ``rule_name``; vetoed, insufficient evidence, or the
    fixed reference kept), and what the learning probe found (``probe_line``)."""
    out: dict[str, Any] = {"phase": event.get("phase"), "round": event.get("round"),
                           "trained": not event.get("skipped"), "probe": probe_line(event)}
    if event.get("skipped"):
        return {**out, "outcome": "skipped", "why": event.get("reason")}
    gate = event.get("gate")
    if gate is None:
        return {**out, "outcome": "fixed reference", "why": f"reference={event.get('reference')}"}
    ev = gate.get("evidence") or {}
    out.update(evidence=ev.get("mode"), in_sample=ev.get("in_sample"),
               completions=ev.get("completions"),
               informative_completions=ev.get("informative_completions"),
               gain=gate.get("gain"), lower_bound=gate.get("lower_bound"), kl=gate.get("kl"),
               epsilon=gate.get("epsilon"), delta=gate.get("delta"), candidate=gate.get("chosen"))
    reason = gate.get("reason") or ""
    if reason == INSUFFICIENT:
        why = (f"{ev.get('informative_completions')} informative completions < "
               f"gate.min_completions={ev.get('minimum')}")
        return {**out, "outcome": "insufficient evidence", "why": why}
    if event.get("vetoed"):
        verdict = event.get("inspector") or {}
        return {**out, "outcome": "vetoed", "why": verdict.get("reason") or "inspector veto"}
    if event.get("promoted"):
        return {**out, "outcome": "promoted", "why": reason}
    return {**out, "outcome": "rejected", "why": rule(rule_name).explain(gate)}


def summarise(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Compute the results record of a run folder; ``meta`` adds task/method/seed/wall time."""
    run_dir = Path(run_dir)
    events = read_jsonl(run_dir / EVENTS)
    entry = entry_point(events)
    programs = labelled(read_jsonl(run_dir / PROGRAMS), entry)
    config = recorded_config(events)
    rounds = max((int(p["round"]) for p in programs), default=0)
    origins = _origins(programs, entry)
    last_regime = round_regimes(programs, rounds)[-1]  # the equation the run ends on
    at_last = [p for p in programs if p.get("regime", "") == last_regime]
    seeds = [p for p in at_last if origins[int(p["id"])] == "seed"]
    initial = max((_score(p) for p in seeds), default=-math.inf)
    final = max((_score(p) for p in at_last), default=-math.inf)
    final_agent = max((_score(p) for p in at_last if origins[int(p["id"])] in ("seed", "agent")),
                      default=-math.inf)
    improvement = _pct(final, initial)
    by_source = Counter(p.get("source", "agent") for p in programs if p.get("source") != "seed")
    agent_rounds = sorted({int(p["round"]) for p in programs if p.get("source") == "agent"})
    first = [p for p in programs if p.get("source") == "agent" and agent_rounds and int(p["round"]) == agent_rounds[0]]
    last = [p for p in programs if p.get("source") == "agent" and agent_rounds and int(p["round"]) == agent_rounds[-1]]

    phases = [e for e in events if e["event"] == "phase"]
    pair_kinds: Counter[str] = Counter()
    for e in phases:
        pair_kinds.update(e.get("pair_kinds") or {})
    trained = [e for e in phases if not e.get("skipped")]
    gated = [e for e in trained if e.get("gate") is not None]
    promotions = sum(1 for e in gated if e.get("promoted"))
    # decisions: gated phases that had the evidence to decide (an EvoDPO phase "decides" too)
    decided = [e for e in gated if (e["gate"].get("reason") or "") != INSUFFICIENT]
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
        "final_agent": final_agent if math.isfinite(final_agent) else None,
        "improvement_agent_pct": _pct(final_agent, initial),
        "rounds": rounds,
        # evaluated candidates (the budget every method spends equally): agent + supporter
        "candidates": by_source.get("agent", 0) + by_source.get("supporter", 0),
        "candidate_budget": _budget(config, rounds),
        "candidates_by_source": {k: by_source.get(k, 0) for k in ("agent", "supporter", "rescore")},
        # agent programs that repeat an earlier supporter program: evaluated agent samples
        # (they count in the budget and the valid rate) but not the agent's own best
        "agent_copies_of_supporter": sum(1 for p in programs
                                         if origins[int(p["id"])] == "supporter_copy"),
        "score_regime": last_regime,
        "valid_rate": valid_rate(programs),
        "valid_rate_first_round": valid_rate(first),
        "valid_rate_last_round": valid_rate(last),
        # the agent's valid rate per exploration phase (rounds before phase k's training)
        "valid_rate_by_phase": {str(k): valid_rate([p for p in programs
                                                    if int(p.get("phase", 0)) == k])
                                for k in sorted({int(p.get("phase", 0)) for p in programs
                                                 if p.get("source") == "agent"})},
        "novelty": novelty(programs, events, origins),
        "generated_tokens": sum(int((e.get("sampler") or {}).get("new_tokens") or 0)
                                for e in events if e["event"] == "round"),
        "failure_kinds": dict(failures),
        "best_by_round": best_so_far(programs, rounds),
        "best_by_round_agent": best_so_far(programs, rounds, ("seed", "agent"), entry),
        "phases": len(phases),
        "phases_trained": len(trained),
        "phases_skipped": len(phases) - len(trained),
        "pair_kinds": dict(pair_kinds),
        "promotions": promotions,
        "accept_rate": rate(promotions, len(decided)),
        "vetoes": sum(1 for e in gated if e.get("vetoed")),
        "insufficient_evidence": len(gated) - len(decided),
        "reference_log": [phase_line(e, gate_rule(config)) for e in phases],
        "interventions": interventions,
        "intervention_rates": {k: rate(v, len(trained)) for k, v in interventions.items()},
        "supporter_calls": supporter_calls(meta.get("supporters")),
    }


def supporter_calls(stats: dict[str, Any] | None) -> dict[str, dict[str, int]] | None:
    """Per supporter role: calls ``answered``, ``invalid`` and ``fell_back`` (no answer from
    its server), from the roles' counters; None when the method ran no supporters."""
    if not stats:
        return None
    from atlas.supporters.base import call_counts  # deferred: supporters load Hydra, pydantic

    return {role: call_counts(s) for role, s in stats.items()}
