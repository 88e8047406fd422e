"""The Policy Inspector's numeric gate: Eq. 3 KL, inspector score, Eq. 4 choice, Eq. 5 test.

``select_and_gate`` scores every candidate of C_k and the current reference on the phase's
gate subset G_k (prompts held out of D_k by the caller), picks c* by Eq. 4 and judges it by
the rule ``gate.rule`` names (``atlas.dpo.rules``; the default, Eq. 5: accept the promotion
iff the paired lower confidence bound of S(c*) - S(ref) is >= epsilon and
KL(c* || ref) <= delta).

Units. S is in *normalised score units* (``gate.scale``): 0 is G_k's worst evaluated score
(a failure's floor when one failed) and 1 its best; S(pi) is the self-normalised
importance-sampling estimate of pi's expected normalised score over each item's
completions, with the sequence likelihood ratio pi(y) / ref(y) as weight
(``atlas.dpo.scoring.importance_gain``), so S(ref) is their plain mean and S(c) - S(ref) is
the share of the score range the candidate's re-weighting moves. epsilon is in these units;
the bound is a paired bootstrap over the items' completions, bias-corrected (``gate.bound``;
the plain percentile on a G_k thinner than ``gate.bc_min_completions``).

Eq. 4 with both terms on the same footing: c* = argmax_c gain(c) / G - lam * KL(c) / K,
where G = max_c |gain(c)| and K = max_c KL(c) over C_k (each term spans at most 1, so neither
dominates by construction; lam = 1 trades the largest gain against the largest KL).

With the gate disabled (EvoDPO, paper B.1) the phase-final policy is promoted every phase and
the numbers are still computed and recorded. The caller promotes an accepted decision with
``promote(model, decision.promoted_state(C_k))``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from atlas.dpo.config import GateConfig
from atlas.dpo.prefix import resolve_padded
from atlas.dpo.rules import DISABLED, NO_ITEMS, judge
from atlas.dpo.scoring import (
    GainEstimate,
    PolicySpec,
    gate_pass,
    importance_gain,
    mean_kl,
)
from atlas.types import (
    GateCandidate,
    GateDecision,
    GateItem,
    PolicyCandidate,
    ReferenceMode,
)


def offline_estimates(sum_logps: Sequence[list[list[float]]], ref_sum_logps: list[list[float]],
                      items: Sequence[GateItem], gate: GateConfig, seed: int
                      ) -> list[GainEstimate]:
    """The offline inspector score of each policy (``sum_logps[p]``) against the reference,
    with the gate's unit, bound and bootstrap settings (``importance_gain``)."""
    return [importance_gain(lp, ref_sum_logps, items, temperature=gate.temperature,
                            confidence=gate.confidence, resamples=gate.resamples, seed=seed,
                            scale=gate.scale, bound=gate.bound,
                            bc_min_completions=gate.bc_min_completions)
            for lp in sum_logps]


def _scale(values: Sequence[float]) -> float:
    finite = [abs(v) for v in values if math.isfinite(v)]
    top = max(finite, default=0.0)
    return top if top > 0 else 1.0


def decide(scores: Sequence[float], kls: Sequence[float], names: Sequence[str], ref_score: float,
           gate: GateConfig, *, enabled: bool = True, steps: Sequence[int] | None = None,
           lowers: Sequence[float] | None = None, ses: Sequence[float] | None = None,
           items: int = 0, bound: str | None = None) -> GateDecision:
    """Eq. 4 and Eq. 5 on numbers already computed (kept apart so they can be checked by hand).

    gain(c) = score(c) - ref_score; objective(c) = gain(c) / G - lam * KL(c) / K with
    G = max |gain|, K = max KL over C_k (1 when that is 0). Ties go to the earliest
    candidate. c* is then judged by the rule ``gate.rule`` names (``atlas.dpo.rules``; the
    default, Eq. 5: accept iff lower(c*) >= epsilon and KL(c*) <= delta), where lower is the
    gain's paired lower confidence bound (``lowers``; the gain itself when none is given,
    e.g. the on-line score). Disabled: the last candidate (the phase-final policy) is
    promoted regardless.
    """
    if not names:
        raise ValueError("candidates: C_k is empty; pass at least the phase-final policy")
    if not (len(scores) == len(kls) == len(names)):
        raise ValueError(f"{len(names)} names, {len(scores)} scores, {len(kls)} KLs: must align")
    gains = [s - ref_score for s in scores]
    lowers = list(gains) if lowers is None else [g if math.isnan(lo) else lo
                                                  for g, lo in zip(gains, lowers)]
    if len(lowers) != len(names):
        raise ValueError(f"{len(names)} names but {len(lowers)} lower bounds: must align")
    ses = [math.nan] * len(names) if ses is None else list(ses)
    g_scale, k_scale = _scale(gains), _scale(kls)
    objectives = [g / g_scale - gate.lam * k / k_scale for g, k in zip(gains, kls)]
    finite = [i for i, o in enumerate(objectives) if not math.isnan(o)]
    best = max(finite, key=lambda i: (objectives[i], -i)) if finite else len(names) - 1
    rows = [GateCandidate(name=n, step=None if steps is None else int(steps[i]),
                          score=scores[i], gain=gains[i], lower=lowers[i], se=ses[i],
                          kl=kls[i], objective=objectives[i]) for i, n in enumerate(names)]
    pick = len(names) - 1 if not enabled else best
    gain, kl, lower = gains[pick], kls[pick], lowers[pick]
    if not enabled:
        accepted, reason = True, DISABLED
    else:
        verdict = judge(gate, gain=gain, lower=lower, kl=kl)
        accepted, reason = verdict.accepted, verdict.reason
    return GateDecision(accepted=accepted, reason=reason, chosen=names[pick], gain=gain, kl=kl,
                        candidates=rows, ref_score=ref_score, epsilon=gate.epsilon,
                        delta=gate.delta, lam=gate.lam, score=scores[pick], enabled=enabled,
                        argmax=names[best], lower_bound=lower, se=ses[pick],
                        confidence=gate.confidence, gain_scale=g_scale, kl_scale=k_scale,
                        items=items, scale=gate.scale,
                        bound=gate.bound if bound is None else bound)


def select_and_gate(model, tokenizer, candidates: list[PolicyCandidate], items: list[GateItem],
                    gate: GateConfig, *, enabled: bool = True,
                    reference: ReferenceMode | str = ReferenceMode.ADAPTIVE,
                    online_score: Callable[[PolicySpec, str], float] | None = None,
                    seed: int = 0, keep_pass: list | None = None,
                    timings: dict[str, float] | None = None) -> GateDecision:
    """Score C_k and the reference on G_k, choose c* (Eq. 4), test it (Eq. 5).

    ``items`` must be held out of the phase's D_k (the caller's duty; ``FineTuner`` does it).
    ``seed``: the bootstrap's generator (pass the phase's seed: decisions are reproducible).
    Without items and with the gate enabled nothing can be measured: rejected, NO_ITEMS.

    ``reference``: "adaptive" (the ``ref`` adapter) or "fixed" (adapters disabled). Leaves the
    policy adapter as it was on entry (the phase-final state) and never writes ``ref``.
    ``online_score(spec, name)``: S for ``gate.score_mode=online`` (sample and evaluate, e.g.
    ``atlas.dpo.online_inspection.OnlineInspector``); KL stays teacher-forced on G_k.
    ``keep_pass``: a list the forward passes' ``GatePass`` is appended to (the gate bench
    records the raw log-probs so other statistics can be recomputed without re-training).
    ``timings``: a dict that receives the seconds of the forward passes (``pass``) and of the
    scores, bounds and decision (``estimate``; on-line sampling and scoring included), so a
    run can say which part costs what.
    """
    if not isinstance(gate, GateConfig):
        raise TypeError(f"gate must be a GateConfig (GateConfig.from_cfg(cfg.gate)), got {type(gate).__name__}")
    reference = ReferenceMode.parse(reference)
    if gate.score_mode == "online" and online_score is None:
        raise ValueError("gate.score_mode=online needs online_score (a sampler and the sandbox: "
                         "the phase loop passes an OnlineInspector); or use gate.score_mode=offline")
    if not candidates:
        raise ValueError("candidates: C_k is empty; pass at least the phase-final policy")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidates: names must be unique, got {names}")
    if not items:  # nothing held out: EvoDPO promotes anyway, the gate cannot measure
        d = decide([math.nan] * len(names), [math.nan] * len(names), names, math.nan, gate,
                   enabled=enabled, steps=[c.step for c in candidates])
        if enabled:
            d.reason = NO_ITEMS
        return d
    t0 = time.perf_counter()
    res = gate_pass(model, tokenizer, items, [PolicySpec.of(c.state) for c in candidates],
                    kl_reference=PolicySpec.reference(reference), need_scores=True,
                    max_length=gate.max_length,
                    padded=resolve_padded(gate.padded, next(model.parameters()).device))
    t1 = time.perf_counter()
    if keep_pass is not None:
        keep_pass.append(res)
    kls = [mean_kl(k) for k in res.kl]
    lowers: list[float] | None = None
    ses: list[float] | None = None
    n_items = len(items)
    bound = "none (online)"
    if gate.score_mode == "online":
        scores = [online_score(PolicySpec.of(c.state), c.name) for c in candidates]
        ref_score = online_score(PolicySpec.reference(reference), "reference")
    else:
        est = offline_estimates(res.sum_logps, res.ref_sum_logps, items, gate, seed)
        scores, lowers, ses = [e.score for e in est], [e.lower for e in est], [e.se for e in est]
        ref_score, n_items, bound = est[0].ref_score, est[0].items, est[0].bound
    decision = decide(scores, kls, names, ref_score, gate, enabled=enabled,
                      steps=[c.step for c in candidates], lowers=lowers, ses=ses, items=n_items,
                      bound=bound)
    chosen = names.index(decision.chosen)
    decision.candidate_preferred = [_argmax(lp) for lp in res.mean_logps[chosen]]
    decision.reference_preferred = [_argmax(lp) for lp in res.ref_mean_logps]
    if timings is not None:
        timings.update({"pass": t1 - t0, "estimate": time.perf_counter() - t1})
    return decision


def _argmax(values: Sequence[float]) -> int:
    finite = [i for i, v in enumerate(values) if not math.isnan(v)]
    return max(finite, key=lambda i: values[i]) if finite else 0
