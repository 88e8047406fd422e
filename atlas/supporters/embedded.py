"""The embedded (rule-based, deterministic, model-free) answer of each role.

These rules are the default backend and the fallback of every LLM role, so they must
always produce an in-bounds answer. They are deliberately simple; each rule that fires
names itself in the critique/rationale/reason so a log reader can see why.

Exploration: perturb numeric hyper-parameters found with ``ast`` in the island's best
program (x0.5 and x2, as the paper's supporter moved the LinUCB window 50 -> 20/100), and,
for loss-strategy programs (entry point or task name contains "loss"/"pinn") without any
clipping, swap squared terms for a smooth Huber (paper B.3.2). Temperature: down a step when
most recent programs fail, up a step when they pass but are all alike.

Strategist (first matching rules; each changes at most one knob):
  few pairs (< min_pairs) and a threshold set  -> lower score_threshold to the passed minimum
  low code diversity (< low_diversity)         -> beta x2 (stay nearer the reference)
  last gate rejected for KL (kl > delta)       -> lr x0.5
  last gate rejected for no gain, KL in bounds -> lr x2
  DPO accuracy >= high_accuracy and epochs > 1 -> epochs - 1 (over-fitting a small D_k)
  DPO accuracy < low_accuracy                  -> epochs + 1

Inspector: only the task's declared quality metrics are compared (``Task.quality_metrics``,
carried in the request with their directions; timings, flags and candidate-relative numbers
never). Veto an accepted promotion if a declared "min" metric of the candidate's preferred
programs grew by more than ``max_regression_ratio`` (and ``min_regression_abs``), a declared
"max" metric dropped by more than ``max_drop``, or one became non-finite.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from atlas.supporters.answers import changed_knobs
from atlas.supporters.config import ExplorationConfig, InspectorConfig, StrategistConfig
from atlas.supporters.patching import add_robust_loss, find_numeric_sites, normalise, perturb
from atlas.supporters.schemas import (
    TEMPERATURE_BOUNDS,
    ExplorationAdvice,
    ExplorationRequest,
    InspectorRequest,
    InspectorVerdict,
    Knobs,
    StrategistAdvice,
    StrategistRequest,
)


def _is_loss_strategy(req: ExplorationRequest) -> bool:
    key = f"{req.task_name} {req.entry_point}".lower()
    return "loss" in key or "pinn" in key


def explore(req: ExplorationRequest, cfg: ExplorationConfig, rng: random.Random
            ) -> ExplorationAdvice:
    """Critique + patched programs + temperature, from the island's programs alone."""
    passed = sorted((p for p in req.programs if p.passed and p.score is not None),
                    key=lambda p: p.score, reverse=True)  # type: ignore[arg-type, return-value]
    failed = [p for p in req.programs if not p.passed]
    notes: list[str] = []
    if passed:
        notes.append(f"Best program scores {passed[0].score:.4g}.")
    if failed:
        kinds = Counter(p.failure_kind for p in failed).most_common(2)
        notes.append(f"{len(failed)}/{len(req.programs)} failed ("
                     + ", ".join(f"{k} x{n}" for k, n in kinds) + "): keep to one complete "
                     f"`{req.entry_point}` function.")
    patches: list[str] = []
    base = passed[0].code if passed else None
    if base is not None and cfg.max_patches > 0:
        if _is_loss_strategy(req):
            robust = add_robust_loss(base, req.entry_point)
            if robust is not None:
                patches.append(robust)
                notes.append("Squared terms can explode near shocks: use a Huber loss.")
        sites = find_numeric_sites(base)
        if sites:
            start = rng.randrange(len(sites))
            k = 0
            while len(patches) < cfg.max_patches and k < 2 * len(sites):
                site = sites[(start + k // 2) % len(sites)]
                factor = 0.5 if k % 2 == 0 else 2.0
                code, text = perturb(base, site, factor)
                if code not in patches and code != base:
                    patches.append(code)
                    notes.append(f"Try {site.name}={text} (was {site.value:g}).")
                k += 1
    temperature = _temperature(req, cfg, passed, failed)
    if temperature != req.temperature:
        notes.append(f"Temperature {req.temperature:g} -> {temperature:g}.")
    if not notes:
        notes.append("No programs yet: start from the task's seed program.")
    return ExplorationAdvice(backend="embedded", critique=" ".join(notes)[: cfg.critique_chars],
                             patches=patches, temperature=temperature)


def _temperature(req: ExplorationRequest, cfg: ExplorationConfig, passed: list, failed: list
                 ) -> float:
    lo, hi = TEMPERATURE_BOUNDS
    t = min(max(req.temperature, lo), hi)
    n = len(req.programs)
    if n == 0:
        return round(t, 4)
    if len(failed) / n > 0.5:
        t -= cfg.temperature_step  # mostly broken: sample closer to the mode
    elif len(passed) >= 2 and len({normalise(p.code) for p in passed}) == 1:
        t += cfg.temperature_step  # all alike: spread out
    return round(min(max(t, lo), hi), 4)


def strategize(req: StrategistRequest, cfg: StrategistConfig) -> StrategistAdvice:
    """The rule table in the module docstring, applied top to bottom."""
    k, b = req.knobs, req.bounds
    new = k.model_dump()
    why: list[str] = []
    # values the caller passed outside the bounds are brought inside first
    new["beta"] = min(max(new["beta"], b.beta[0]), b.beta[1])
    new["lr"] = min(max(new["lr"], b.lr[0]), b.lr[1])
    new["epochs"] = int(min(max(new["epochs"], b.epochs[0]), b.epochs[1]))
    lo, hi = req.scores.min, req.scores.best
    th = new["score_threshold"]
    if th is not None and (lo is None or hi is None):
        new["score_threshold"] = None
        why.append("no passed programs: threshold cleared")
    elif th is not None and lo is not None and hi is not None:
        new["score_threshold"] = min(max(th, lo), hi)
        if req.pairs_built < cfg.min_pairs and new["score_threshold"] > lo:
            new["score_threshold"] = lo
            why.append(f"only {req.pairs_built} pairs: threshold lowered to {lo:.4g}")
    if req.diversity < cfg.low_diversity:
        new["beta"] = min(new["beta"] * 2.0, b.beta[1])
        why.append(f"code diversity {req.diversity:.2f} is low: beta raised")
    last = req.gate_decisions[0] if req.gate_decisions else None
    if last is not None and not last.accepted and last.kl is not None:
        if req.gate_delta is not None and last.kl > req.gate_delta:
            new["lr"] = max(new["lr"] * 0.5, b.lr[0])
            why.append(f"gate rejected for KL {last.kl:.3g} > {req.gate_delta:.3g}: lr halved")
        elif last.gain is not None and last.gain < req.gate_epsilon:
            new["lr"] = min(new["lr"] * 2.0, b.lr[1])
            why.append(f"gate rejected for gain {last.gain:.3g}: lr doubled")
    acc = req.dpo.accuracy
    if acc is not None and acc >= cfg.high_accuracy and new["epochs"] > b.epochs[0]:
        new["epochs"] -= 1
        why.append(f"DPO accuracy {acc:.2f} is saturated: one epoch fewer")
    elif acc is not None and acc < cfg.low_accuracy and new["epochs"] < b.epochs[1]:
        new["epochs"] += 1
        why.append(f"DPO accuracy {acc:.2f} is low: one epoch more")
    knobs = Knobs(**new)
    return StrategistAdvice(backend="embedded", knobs=knobs, changed=changed_knobs(k, knobs),
                            rationale="; ".join(why) or "telemetry in range: no change")


def inspect(req: InspectorRequest, cfg: InspectorConfig) -> InspectorVerdict:
    """Veto an accepted promotion on a regression of a declared quality metric; pass a
    rejection through. Metrics the task does not declare are never compared."""
    g = req.gate
    if not g.accepted:
        return InspectorVerdict(backend="embedded", accepted=False,
                                reason=f"gate rejected ({g.reason or 'Eq. 5'}); nothing to review")
    directions = req.directions
    compared = sorted(set(directions) & set(req.candidate_metrics) & set(req.reference_metrics))
    regressions: dict[str, list[float | None]] = {}
    for name in compared:
        c, r = req.candidate_metrics[name], req.reference_metrics[name]
        if not math.isfinite(r):
            continue
        if not math.isfinite(c):
            bad = True
        elif directions[name] == "min":
            bad = c > abs(r) * cfg.max_regression_ratio and c - r > cfg.min_regression_abs
        else:
            bad = r - c > cfg.max_drop
        if bad:
            regressions[name] = [c if math.isfinite(c) else None, r]
    if regressions:
        what = ", ".join(f"{n} {'non-finite' if c is None else format(c, '.3g')} vs {r:.3g} "
                         f"({'lower' if directions[n] == 'min' else 'higher'} is better)"
                         for n, (c, r) in regressions.items())
        return InspectorVerdict(backend="embedded", accepted=False, veto=True,
                                reason=f"Regression: {what} (candidate vs reference)",
                                regressions=regressions)
    if not compared:
        return InspectorVerdict(backend="embedded", accepted=True,
                                reason="no declared quality metric to compare: gate decision kept")
    return InspectorVerdict(backend="embedded", accepted=True,
                            reason="no regression on " + ", ".join(compared))
