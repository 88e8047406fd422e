"""The Policy Inspector's numeric gate: Eq. 3 KL, inspector score, Eq. 4 choice, Eq. 5 test.

``select_and_gate`` scores every candidate of C_k and the current reference on the phase's
gate subset G_k, picks c* = argmax_c S(c) - lam * KL(c || ref) (Eq. 4) and accepts the
promotion iff S(c*) - S(ref) >= epsilon and KL(c* || ref) <= delta (Eq. 5). With the gate
disabled (EvoDPO, paper B.1) the phase-final policy is promoted every phase and the numbers
are still computed and recorded. The decision reaches the reference either directly
(``promote``) or through Lightning: ``ReferenceSwapCallback.queue_decision(decision, C_k)``
and the next ``train_phase(..., pending_reference=callback)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from atlas.agent.adapters import REF, set_adapter_state
from atlas.dpo.config import GateConfig
from atlas.dpo.scoring import PolicySpec, gate_pass, mean_kl, weighted_score
from atlas.types import GateItem

if TYPE_CHECKING:  # pragma: no cover
    from atlas.dpo.phase import PolicyCandidate

ACCEPTED = "accepted"
NO_GAIN = "rejected: no gain"
KL_TOO_LARGE = "rejected: KL too large"
DISABLED = "accepted: gate disabled"


def token_kl(model, tokenizer, items: list[GateItem], candidate_state: PolicySpec,
             reference: PolicySpec, batch_size: int = 8, *, max_length: int = 768) -> float:
    """Eq. 3: mean over items of the token-average full-vocabulary KL(cand || ref) on the
    item's preferred completion, teacher-forced after its prompt (prompt tokens masked).

    ``reference``: "fixed" (adapters disabled), "ref"/"adaptive" (the ``ref`` adapter) or an
    adapter state dict. The ``ref`` adapter is never written; the policy adapter is restored.
    """
    res = gate_pass(model, tokenizer, items, [candidate_state], kl_reference=reference,
                    need_scores=False, batch_size=batch_size, max_length=max_length)
    return mean_kl(res.kl[0])


def inspector_score(model, tokenizer, items: list[GateItem], state_or_reference: PolicySpec, *,
                    temperature: float = 1.0, batch_size: int = 8, max_length: int = 768) -> float:
    """S(pi) on G_k (DESIGN.md): per item, weight its evaluated completions by the softmax of
    pi's length-normalised log-probs, take the weighted mean task score; mean over items."""
    res = gate_pass(model, tokenizer, items, [state_or_reference], kl_reference=None,
                    need_scores=True, batch_size=batch_size, max_length=max_length)
    return weighted_score(res.mean_logps[0], items, temperature)


@dataclass
class GateDecision:
    """The inspector's verdict for phase k, with every number that led to it."""

    accepted: bool
    reason: str  # "accepted" | "rejected: no gain" | "rejected: KL too large" | "accepted: gate disabled"
    chosen: str  # name of c* (the promoted candidate when accepted)
    gain: float  # S(c*) - S(ref)
    kl: float  # KL(c* || ref)
    candidates: list[dict] = field(default_factory=list)  # name, step, score, kl, objective
    ref_score: float = math.nan
    epsilon: float = 0.0
    delta: float = 0.0
    lam: float = 0.0
    score: float = math.nan  # S(c*)
    enabled: bool = True
    argmax: str = ""  # Eq. 4's choice (== chosen unless the gate is disabled)
    # per gate item, the index of the completion each policy ranks highest (the programs it
    # "prefers"): the Policy Inspector compares their per-component metrics (paper B.3.2)
    candidate_preferred: list[int] = field(default_factory=list)
    reference_preferred: list[int] = field(default_factory=list)

    def promoted_state(self, candidates: Sequence["PolicyCandidate"]) -> dict[str, torch.Tensor] | None:
        """The tensors to promote (the chosen candidate's), or None when rejected."""
        if not self.accepted:
            return None
        for c in candidates:
            if c.name == self.chosen:
                return c.state
        raise KeyError(f"chosen candidate {self.chosen!r} is not in the given candidates "
                       f"{[c.name for c in candidates]}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record for telemetry (NaN -> None)."""
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        return clean(asdict(self))


def decide(scores: Sequence[float], kls: Sequence[float], names: Sequence[str], ref_score: float,
           gate: GateConfig, *, enabled: bool = True, steps: Sequence[int] | None = None
           ) -> GateDecision:
    """Eq. 4 and Eq. 5 on numbers already computed (kept apart so they can be checked by hand).

    Ties in Eq. 4 go to the earliest candidate. If both tests fail the reason is "no gain".
    Disabled: the last candidate (the phase-final policy) is promoted regardless.
    """
    if not names:
        raise ValueError("candidates: C_k is empty; pass at least the phase-final policy")
    if not (len(scores) == len(kls) == len(names)):
        raise ValueError(f"{len(names)} names, {len(scores)} scores, {len(kls)} KLs: must align")
    objectives = [s - gate.lam * k for s, k in zip(scores, kls)]
    finite = [i for i, o in enumerate(objectives) if not math.isnan(o)]
    best = max(finite, key=lambda i: (objectives[i], -i)) if finite else len(names) - 1
    rows = [{"name": n, "step": None if steps is None else int(steps[i]), "score": s, "kl": k,
             "objective": o} for i, (n, s, k, o) in enumerate(zip(names, scores, kls, objectives))]
    pick = len(names) - 1 if not enabled else best
    gain = scores[pick] - ref_score
    kl = kls[pick]
    if not enabled:
        accepted, reason = True, DISABLED
    elif not gain >= gate.epsilon:  # NaN gain fails too
        accepted, reason = False, NO_GAIN
    elif not kl <= gate.delta:
        accepted, reason = False, KL_TOO_LARGE
    else:
        accepted, reason = True, ACCEPTED
    return GateDecision(accepted=accepted, reason=reason, chosen=names[pick], gain=gain, kl=kl,
                        candidates=rows, ref_score=ref_score, epsilon=gate.epsilon,
                        delta=gate.delta, lam=gate.lam, score=scores[pick], enabled=enabled,
                        argmax=names[best])


def select_and_gate(model, tokenizer, candidates: list["PolicyCandidate"], items: list[GateItem],
                    gate: GateConfig, *, enabled: bool = True, reference: str = "adaptive",
                    online_score: Callable[[PolicySpec, str], float] | None = None
                    ) -> GateDecision:
    """Score C_k and the reference on G_k, choose c* (Eq. 4), test it (Eq. 5).

    ``reference``: "adaptive" (the ``ref`` adapter) or "fixed" (adapters disabled). Leaves the
    policy adapter as it was on entry (the phase-final state) and never writes ``ref``.
    ``online_score(spec, name)``: S for ``gate.score_mode=online`` (sample and evaluate, e.g.
    ``atlas.evolution.online_inspection.OnlineInspector``); KL stays teacher-forced on G_k.
    """
    if not isinstance(gate, GateConfig):
        raise TypeError(f"gate must be a GateConfig (GateConfig.from_cfg(cfg.gate)), got {type(gate).__name__}")
    if reference not in ("adaptive", "fixed"):
        raise ValueError(f"reference must be 'adaptive' or 'fixed' (method.reference), got {reference!r}")
    if gate.score_mode == "online" and online_score is None:
        raise ValueError("gate.score_mode=online needs online_score (a sampler and the sandbox: "
                         "the phase loop passes an OnlineInspector); or use gate.score_mode=offline")
    if not candidates:
        raise ValueError("candidates: C_k is empty; pass at least the phase-final policy")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidates: names must be unique, got {names}")
    if not items and not enabled:  # EvoDPO without a gate subset: promote, record nothing
        return decide([math.nan] * len(names), [math.nan] * len(names), names, math.nan, gate,
                      enabled=False, steps=[c.step for c in candidates])
    res = gate_pass(model, tokenizer, items, [c.state for c in candidates],
                    kl_reference="ref" if reference == "adaptive" else "fixed", need_scores=True,
                    batch_size=gate.batch_size, max_length=gate.max_length)
    kls = [mean_kl(k) for k in res.kl]
    if gate.score_mode == "online":
        scores = [online_score(c.state, c.name) for c in candidates]
        ref_score = online_score("ref" if reference == "adaptive" else "fixed", "reference")
    else:
        scores = [weighted_score(m, items, gate.temperature) for m in res.mean_logps]
        ref_score = weighted_score(res.ref_mean_logps, items, gate.temperature)
    decision = decide(scores, kls, names, ref_score, gate, enabled=enabled,
                      steps=[c.step for c in candidates])
    chosen = names.index(decision.chosen)
    decision.candidate_preferred = [_argmax(lp) for lp in res.mean_logps[chosen]]
    decision.reference_preferred = [_argmax(lp) for lp in res.ref_mean_logps]
    return decision


def _argmax(values: Sequence[float]) -> int:
    finite = [i for i, v in enumerate(values) if not math.isnan(v)]
    return max(finite, key=lambda i: values[i]) if finite else 0


def promote(model, state: dict[str, torch.Tensor]) -> None:
    """ref <- ``state`` (tensors copied; the policy adapter is not touched)."""
    if not isinstance(state, dict) or not state:
        raise TypeError("state: promote needs a non-empty adapter state dict "
                        "(GateDecision.promoted_state(C_k) or PolicyCandidate.state)")
    set_adapter_state(model, REF, state)
