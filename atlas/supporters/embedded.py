"""The embedded (rule-based, deterministic, model-free) answer of each role.

These rules are the default backend and the fallback of every LLM role, so they must
always produce an in-bounds answer. They are deliberately simple; each rule that fires
names itself in the critique/rationale/reason so a log reader can see why.

Exploration: perturb numeric hyper-parameters found with ``ast`` in the island's best
program (x0.5 and x2, as the paper's supporter moved the LinUCB window 50 -> 20/100), and,
for loss-strategy programs (the task's ``supporter_hints`` hold "robust_loss") without any
clipping, swap squared terms for a smooth Huber (paper B.3.2). Temperature: down a step when
most recent programs fail, up a step when they pass but are all alike.

Strategist: each rule reads one piece of phase telemetry and may change one knob; a knob
changes at most once per phase and every change is logged with its reason (``reasons``):
  score_threshold (pair selection: chosen programs below it are dropped)
    no passed programs                                   -> cleared
    last phase built < min_pairs pairs, threshold set    -> lowered to the passed minimum
    none set, >= threshold_min_passed passed programs
      and min < median < best (a real spread)            -> set to the passed median
    set, below the median, last phase built >= 2*min_pairs -> raised to the median
  beta
    agent's code diversity < low_diversity (repetitive)  -> x2 (stay nearer the reference)
    DPO accuracy >= high_accuracy at the minimum epochs  -> x1.5 (saturated: damp the drift)
  lr
    last gate rejected with KL > delta (moved too far)   -> x0.5
    DPO accuracy < collapse_accuracy (below chance)      -> x0.5 (collapsing)
    last reject_streak gates rejected for no gain (the
      decision's reason) with KL <= delta/2 (hardly moves) -> x2
  epochs
    DPO accuracy >= high_accuracy, above the minimum     -> -1 (saturated: over-fitting D_k)
    collapse_accuracy <= DPO accuracy < low_accuracy     -> +1 (under-fitting)

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

from atlas.dpo.rules import NO_GAIN
from atlas.knobs import HARD_BOUNDS
from atlas.supporters.answers import changed_knobs
from atlas.supporters.config import ExplorationConfig, InspectorConfig, StrategistConfig
from atlas.supporters.patching import add_robust_loss, find_numeric_sites, normalise, perturb
from atlas.supporters.schemas import (
    ExplorationAdvice,
    ExplorationRequest,
    InspectorRequest,
    InspectorVerdict,
    Knobs,
    StrategistAdvice,
    StrategistRequest,
)


def _is_loss_strategy(req: ExplorationRequest) -> bool:
    """The task asked for the Huber rewrite (``Task.supporter_hints``), not a name match."""
    return "robust_loss" in req.task_hints


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
    lo, hi = req.temperature_bounds
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
    """The rule table in the module docstring; one reason per changed knob."""
    k, b = req.knobs, req.bounds
    new = k.model_dump()
    why: dict[str, str] = {}
    # values the caller passed outside the bounds are brought inside first
    new["beta"] = min(max(new["beta"], b.beta[0]), b.beta[1])
    new["lr"] = min(max(new["lr"], b.lr[0]), b.lr[1])
    new["epochs"] = int(min(max(new["epochs"], b.epochs[0]), b.epochs[1]))
    for name in HARD_BOUNDS:
        if new[name] != getattr(k, name):
            why[name] = f"{name} {getattr(k, name):g} outside its bounds: clamped"
    _threshold(req, cfg, new, why)
    _beta(req, cfg, new, why)
    _lr(req, cfg, new, why)
    _epochs(req, cfg, new, why)
    knobs = Knobs(**new)
    changed = changed_knobs(k, knobs)
    reasons = {n: why[n] for n in changed if n in why}
    return StrategistAdvice(backend="embedded", knobs=knobs, changed=changed, reasons=reasons,
                            rationale="; ".join(reasons.values()) or
                            "telemetry in range: no change")


def _threshold(req: StrategistRequest, cfg: StrategistConfig, new: dict, why: dict) -> None:
    s, th = req.scores, new["score_threshold"]
    lo, med, hi = s.min, s.median, s.best
    if lo is None or hi is None:
        if th is not None:
            new["score_threshold"] = None
            why["score_threshold"] = "no passed programs this phase: threshold cleared"
        return
    if th is None:
        if (med is not None and s.passed >= cfg.threshold_min_passed and lo < med < hi):
            new["score_threshold"] = med
            why["score_threshold"] = (f"{s.passed} passed programs spread {lo:.4g}..{hi:.4g}: "
                                      f"threshold set at the median {med:.4g} so only the "
                                      "better half is chosen")
        return
    pairs = req.pairs_built
    if pairs is not None and pairs < cfg.min_pairs and th > lo:
        new["score_threshold"] = lo
        why["score_threshold"] = (f"only {pairs} pairs last phase (< {cfg.min_pairs}): "
                                  f"threshold lowered to the passed minimum {lo:.4g}")
    elif (pairs is not None and pairs >= 2 * cfg.min_pairs and med is not None and th < med
          and s.passed >= cfg.threshold_min_passed):
        new["score_threshold"] = med
        why["score_threshold"] = (f"{pairs} pairs last phase and scores moved up: threshold "
                                  f"raised from {th:.4g} to the median {med:.4g}")
    elif not lo <= th <= hi:
        new["score_threshold"] = min(max(th, lo), hi)
        why["score_threshold"] = (f"threshold {th:.4g} outside this phase's passed scores "
                                  f"{lo:.4g}..{hi:.4g}: clamped")


def _beta(req: StrategistRequest, cfg: StrategistConfig, new: dict, why: dict) -> None:
    hi = req.bounds.beta[1]
    acc = req.dpo.accuracy
    if req.diversity < cfg.low_diversity and new["beta"] < hi:
        new["beta"] = min(new["beta"] * 2.0, hi)
        why["beta"] = (f"agent code diversity {req.diversity:.2f} < {cfg.low_diversity:g} "
                       "(repetitive programs): beta doubled to stay nearer the reference")
    elif (acc is not None and acc >= cfg.high_accuracy and new["epochs"] <= req.bounds.epochs[0]
          and new["beta"] < hi):
        new["beta"] = min(new["beta"] * 1.5, hi)
        why["beta"] = (f"DPO accuracy {acc:.2f} saturated at the minimum epochs: beta x1.5 "
                       "to damp the drift from the reference")


def _lr(req: StrategistRequest, cfg: StrategistConfig, new: dict, why: dict) -> None:
    lo, hi = req.bounds.lr
    gates, delta, acc = req.gate_decisions, req.gate_delta, req.dpo.accuracy
    last = gates[0] if gates else None
    streak = gates[: cfg.reject_streak]
    if (last is not None and not last.accepted and delta is not None
            and last.kl > delta and new["lr"] > lo):  # an unmeasured (NaN) KL is never > delta
        new["lr"] = max(new["lr"] * 0.5, lo)
        why["lr"] = f"last gate rejected for KL {last.kl:.3g} > delta {delta:.3g}: lr halved"
    elif acc is not None and acc < cfg.collapse_accuracy and new["lr"] > lo:
        new["lr"] = max(new["lr"] * 0.5, lo)
        why["lr"] = (f"DPO accuracy {acc:.2f} < {cfg.collapse_accuracy:g} (the policy prefers "
                     "the rejected programs): lr halved")
    elif (cfg.reject_streak > 0 and len(streak) == cfg.reject_streak and delta is not None
          and all(not g.accepted and g.kl <= delta / 2  # NaN: False
                  and g.reason == NO_GAIN for g in streak)
          and new["lr"] < hi):
        new["lr"] = min(new["lr"] * 2.0, hi)
        why["lr"] = (f"last {cfg.reject_streak} gates rejected for no gain with KL <= delta/2 "
                     "(the policy hardly moves): lr doubled")


def _epochs(req: StrategistRequest, cfg: StrategistConfig, new: dict, why: dict) -> None:
    acc, (lo, hi) = req.dpo.accuracy, req.bounds.epochs
    if acc is None:
        return
    if acc >= cfg.high_accuracy and new["epochs"] > lo:
        new["epochs"] -= 1
        why["epochs"] = f"DPO accuracy {acc:.2f} saturated: one epoch fewer (over-fitting D_k)"
    elif cfg.collapse_accuracy <= acc < cfg.low_accuracy and new["epochs"] < hi:
        new["epochs"] += 1
        why["epochs"] = f"DPO accuracy {acc:.2f} < {cfg.low_accuracy:g}: one epoch more"


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
