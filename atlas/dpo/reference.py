"""The one owner of the reference during a phase (paper 2.2, Eq. 3-5), in three parts.

Evolving DPO moves the reference ``ref`` forward only through the Policy Inspector's gate.

- ``GateJudge``: the decision on C_k, Eq. 4's choice of c* and the gate's rule on the
  phase's evidence G_k (``select_and_gate``); gated off (EvoDPO) the phase-final policy is
  accepted every phase and the gate's numbers are only recorded;
- ``Promoter``: runs the judge on a complete C_k, asks the inspector's review of an accepted
  c* (ATLAS) and copies an accepted, unvetoed c* into ``ref``; a plain object, so Eq. 4/5 and
  the promotion run without a Trainer;
- ``ReferenceCallback``: the Lightning hooks, attached to the phase's ``Trainer`` when the
  method's reference is adaptive (EvoDPO, ATLAS; EvoTune attaches none).
  ``on_train_start`` fingerprints ``ref`` (the DPO module's reference log-prob table, built
  in its own ``on_train_start``, Lightning calling callbacks first, depends on ``ref``
  staying put for the whole ``fit``); ``on_train_batch_end`` keeps C_k's intermediate
  snapshots (``PolicySnapshotCallback``; the phase trainer sets their steps) and checks that
  nothing wrote ``ref`` during the step; ``on_train_end``, C_k complete (the policy is the
  phase-final one), hands C_k to the promoter.

The promotion lands inside the phase, before its checkpoint, so a resumed run never holds a
pending promotion. What the reference has been through (``ReferenceState``: which phase's
candidate it is, every decision's outcome) persists across phases in the run checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch

from atlas.agent.adapters import POLICY, REF, adapter_params, get_adapter_state, promote
from atlas.dpo.attention import own_attention_kernel
from atlas.dpo.callbacks import PolicySnapshotCallback
from atlas.dpo.config import GateConfig
from atlas.dpo.gate import decide, select_and_gate
from atlas.dpo.rules import INSUFFICIENT
from atlas.types import GateDecision, GateItem, PolicyCandidate, ReferenceMode


class ReferenceMoved(RuntimeError):
    """``ref`` changed inside a ``fit``: the DPO loss of that phase used a stale table."""


@dataclass
class ReferenceState:
    """What the reference is, across phases: ``base`` until a promotion, then the phase and
    candidate it was copied from. Goes into the run checkpoint with the fine-tuner's state."""

    current: str = "base"  # "base" (the start adapter) | "phase <k> <candidate>"
    promotions: list[dict[str, Any]] = field(default_factory=list)  # {phase, candidate, step}

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> "ReferenceState":
        return cls(**state) if state else cls()


@dataclass
class ReferenceOutcome:
    """What the promoter decided in one phase (read by the phase's record)."""

    decision: GateDecision
    promoted: bool
    vetoed: bool
    verdict: dict[str, Any] | None
    candidate: str | None  # the promoted candidate's name (None: the reference stayed)
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # pass, estimate, review, other


@dataclass
class GateJudge:
    """How a phase's c* is chosen and tested: Eq. 4 and the gate's rule on the phase's
    evidence G_k (``select_and_gate``).

    ``items``: G_k (held out of D_k by the caller when ``gated``). ``gated``: the rule decides
    (ATLAS); False: the phase-final policy is accepted every phase (EvoDPO) and the numbers
    are recorded. ``sufficient``: False when G_k is too thin to decide on
    (``gate.min_completions``): gated, the decision is then "insufficient evidence" and
    nothing is measured. ``online_score`` and ``keep_pass``: as ``select_and_gate``.
    """

    tokenizer: Any
    items: list[GateItem]
    gate: GateConfig
    gated: bool
    seed: int
    online_score: Callable[..., float] | None = None
    keep_pass: list | None = None
    sufficient: bool = True

    def __call__(self, model: torch.nn.Module, candidates: list[PolicyCandidate],
                 timings: dict[str, float]) -> GateDecision:
        """The decision on C_k (``timings`` receives the seconds of its parts)."""
        if self.gated and not self.sufficient:
            return no_decision(candidates, self.gate, INSUFFICIENT)
        return select_and_gate(model, self.tokenizer, candidates, self.items, self.gate,
                               enabled=self.gated, reference=ReferenceMode.ADAPTIVE,
                               online_score=self.online_score, seed=self.seed,
                               keep_pass=self.keep_pass, timings=timings)


Review = Callable[[GateDecision], Any]  # the inspector's review of an accepted decision


class Promoter:
    """The decision on a complete C_k, the inspector's review and the promotion, without a
    Trainer (``ReferenceCallback`` calls it when the fit ends).

    ``judge(model, C_k, timings)``: the decision (a ``GateJudge``). ``review(decision)``: the
    inspector's verdict on an accepted decision of an applied gate (its ``veto`` keeps the
    reference). An accepted, unvetoed c* is copied into ``ref`` and noted in ``state`` (the
    run's ``ReferenceState``); ``promote_accepted=False`` decides without writing ``ref``
    (the gate bench).
    """

    def __init__(self, judge: GateJudge, *, phase: int = 0,
                 state: ReferenceState | None = None, review: Review | None = None,
                 promote_accepted: bool = True) -> None:
        self.judge, self.phase, self.review = judge, phase, review
        self.state = state if state is not None else ReferenceState()
        self.promote_accepted = promote_accepted

    def run(self, model: torch.nn.Module, candidates: list[PolicyCandidate],
            started: float | None = None) -> ReferenceOutcome:
        """Decide on ``candidates`` (C_k, the phase-final policy last), review, promote.
        ``started``: when the caller began (its checks count in the outcome's seconds)."""
        t0 = time.perf_counter() if started is None else started
        was_training = model.training
        parts: dict[str, float] = {}
        try:
            decision = self.judge(model, candidates, parts)
        finally:
            model.train(was_training)
        promoted, vetoed, verdict = decision.accepted, False, None
        t_review = time.perf_counter()
        if decision.accepted and decision.enabled and self.review is not None:
            answer = self.review(decision)
            vetoed = bool(answer.veto)
            verdict = answer.model_dump() if hasattr(answer, "model_dump") else dict(answer)
            promoted = not vetoed
        parts["review"] = time.perf_counter() - t_review
        candidate = None
        if promoted and self.promote_accepted:
            state = decision.promoted_state(candidates)
            assert state is not None  # accepted
            promote(model, state)
            candidate = decision.chosen
            step = next(c.step for c in candidates if c.name == candidate)
            self.state.current = f"phase {self.phase} {candidate}"
            self.state.promotions.append({"phase": self.phase, "candidate": candidate,
                                          "step": step})
        seconds = time.perf_counter() - t0
        parts["other"] = seconds - sum(parts.values())  # C_k's list, checks, the promotion
        return ReferenceOutcome(decision=decision, promoted=promoted, vetoed=vetoed,
                                verdict=verdict, candidate=candidate, seconds=seconds,
                                parts=parts)


class ReferenceCallback(PolicySnapshotCallback):
    """The reference's owner in a phase's fit: C_k's snapshots, the check that nothing
    writes ``ref`` during the fit, and at its end the ``promoter``'s decision on C_k."""

    def __init__(self, promoter: Promoter) -> None:
        super().__init__([])
        self.promoter = promoter
        self.candidates: list[PolicyCandidate] = []
        self.outcome: ReferenceOutcome | None = None
        self._ref_start: dict[str, torch.Tensor] = {}
        self._ref_versions: dict[str, int] = {}
        self.prepare_seconds = 0.0  # the caller's time to gather G_k (part of the gate's cost)

    # -- Lightning's callback state (the run checkpoint holds it through FineTuner) -------
    def state_dict(self) -> dict[str, Any]:
        return self.promoter.state.to_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.promoter.state = ReferenceState.from_state(state_dict)

    # -- the invariant: ref never moves inside a fit --------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        params = adapter_params(pl_module.model, REF)
        self._ref_start = get_adapter_state(pl_module.model, REF)
        self._ref_versions = {k: p._version for k, p in params.items()}

    def _check_ref(self, model: torch.nn.Module, where: str, full: bool) -> None:
        params = adapter_params(model, REF)
        moved = [k for k, p in params.items() if p._version != self._ref_versions.get(k)]
        if full and not moved:
            moved = [k for k, p in params.items()
                     if not torch.equal(p.detach().cpu(), self._ref_start[k])]
        if moved:
            raise ReferenceMoved(f"the reference adapter changed during phase "
                                 f"{self.promoter.phase}'s fit ({where}: {moved[0]}); only the "
                                 f"reference's promoter writes `ref`, after the fit's last step")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._check_ref(pl_module.model, f"step {trainer.global_step}", full=False)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    # -- C_k complete: the promoter decides -----------------------------------------------
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        t0 = time.perf_counter()
        model = pl_module.model
        self._check_ref(model, "end of fit", full=True)
        self.candidates = [PolicyCandidate(name=f"step_{s}", state=st, step=s)
                           for s, st in self.snapshots]
        self.candidates.append(PolicyCandidate(name="final", state=get_adapter_state(model, POLICY),
                                               step=trainer.global_step))
        # the gate's passes are forward only: the model's own kernel (``atlas.dpo.attention``)
        with own_attention_kernel(model):
            self.outcome = self.promoter.run(model, self.candidates, started=t0)


def no_decision(candidates: list[PolicyCandidate], gate: GateConfig, reason: str,
                *, enabled: bool = True) -> GateDecision:
    """A decision that measured nothing (``reason`` says why): rejected when gated."""
    names = [c.name for c in candidates]
    nan = [math.nan] * len(names)
    d = decide(nan, nan, names, math.nan, gate, enabled=enabled, steps=[c.step for c in candidates])
    if enabled:
        d.reason = reason
    return d
