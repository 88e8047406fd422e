"""The one owner of the reference during a phase: a Lightning callback (paper 2.2, Eq. 3-5).

Evolving DPO moves the reference ``ref`` forward only through the Policy Inspector's gate.
``ReferenceCallback`` is attached to the phase's ``Trainer`` when the method's reference is
adaptive (EvoDPO, ATLAS; EvoTune attaches none) and does all of it:

- ``on_train_start``: fingerprints ``ref``. The DPO module's reference log-prob table, built
  in its own ``on_train_start`` (Lightning calls callbacks first), depends on ``ref`` staying
  put for the whole ``fit``;
- ``on_train_batch_end``: keeps C_k's intermediate snapshots (``PolicySnapshotCallback``; the
  phase trainer sets their steps) and checks that nothing wrote ``ref`` during the step;
- ``on_train_end``: C_k is complete (the policy is the phase-final one). Eq. 4 picks c* and
  Eq. 5 tests it on the phase's evidence G_k (``select_and_gate``); an accepted c* goes to the
  inspector's review (ATLAS), and an accepted, unvetoed c* is copied into ``ref``. Gated off
  (EvoDPO), the phase-final policy is promoted every phase and the gate's numbers are only
  recorded.

The promotion lands inside the phase, before its checkpoint, so a resumed run never holds a
pending promotion. What the reference has been through (``ReferenceState``: which phase's
candidate it is, every decision's outcome) persists across phases in the run checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch

from atlas.agent.adapters import POLICY, REF, adapter_params, get_adapter_state, promote
from atlas.dpo.callbacks import PolicySnapshotCallback
from atlas.dpo.config import GateConfig
from atlas.dpo.gate import decide, select_and_gate
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
    """What the callback decided in one phase (read by the phase's record)."""

    decision: GateDecision
    promoted: bool
    vetoed: bool
    verdict: dict[str, Any] | None
    candidate: str | None  # the promoted candidate's name (None: the reference stayed)
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # pass, estimate, review, other


Review = Callable[[GateDecision], Any]  # the inspector's review of an accepted decision


class ReferenceCallback(PolicySnapshotCallback):
    """Owns C_k's snapshots, Eq. 4/5, the inspector's review and the promotion of one phase.

    ``items``: the phase's evidence G_k (held out of D_k by the caller when ``gated``).
    ``gated``: Eq. 5 decides (ATLAS); False: the phase-final policy is promoted every phase
    (EvoDPO) and the numbers are recorded. ``decide``: replaces the gate's measurement with a
    decision of the caller's (``FineTuner`` records "insufficient evidence" this way).
    ``review(decision)``: the inspector's verdict on an accepted decision (its ``veto``
    keeps the reference). ``promote_accepted=False`` decides without writing ``ref`` (the
    gate bench). ``online_score`` and ``keep_pass``: as ``select_and_gate``.
    """

    def __init__(self, tokenizer: Any, items: Sequence[GateItem], gate: GateConfig, *,
                 gated: bool, seed: int, phase: int = 0,
                 reference: ReferenceMode = ReferenceMode.ADAPTIVE,
                 state: ReferenceState | None = None,
                 decide: Callable[[list[PolicyCandidate]], GateDecision] | None = None,
                 review: Review | None = None,
                 online_score: Callable[..., float] | None = None,
                 promote_accepted: bool = True, keep_pass: list | None = None) -> None:
        super().__init__([])
        if reference != ReferenceMode.ADAPTIVE:
            raise ValueError("ReferenceCallback moves the `ref` adapter: attach it for "
                             "method.reference=adaptive only (EvoTune's reference is fixed)")
        self.tokenizer = tokenizer
        self.items = list(items)
        self.gate = gate
        self.gated = gated
        self.seed = seed
        self.phase = phase
        self.reference = reference
        self.state = state if state is not None else ReferenceState()
        self._decide = decide
        self.review = review
        self.online_score = online_score
        self.promote_accepted = promote_accepted
        self.keep_pass = keep_pass
        self.candidates: list[PolicyCandidate] = []
        self.outcome: ReferenceOutcome | None = None
        self._ref_start: dict[str, torch.Tensor] = {}
        self._ref_versions: dict[str, int] = {}
        self.prepare_seconds = 0.0  # the caller's time to gather G_k (part of the gate's cost)

    # -- Lightning's callback state (the run checkpoint holds it through FineTuner) -------
    def state_dict(self) -> dict[str, Any]:
        return self.state.to_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = ReferenceState.from_state(state_dict)

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
            raise ReferenceMoved(f"the reference adapter changed during phase {self.phase}'s "
                                 f"fit ({where}: {moved[0]}); only ReferenceCallback writes "
                                 f"`ref`, after the fit's last step")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._check_ref(pl_module.model, f"step {trainer.global_step}", full=False)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    # -- C_k complete: Eq. 4, Eq. 5, the review, the promotion ----------------------------
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        t0 = time.perf_counter()
        model = pl_module.model
        self._check_ref(model, "end of fit", full=True)
        self.candidates = [PolicyCandidate(name=f"step_{s}", state=st, step=s)
                           for s, st in self.snapshots]
        self.candidates.append(PolicyCandidate(name="final", state=get_adapter_state(model, POLICY),
                                               step=trainer.global_step))
        was_training = model.training
        parts: dict[str, float] = {}
        try:
            decision = (self._decide(self.candidates) if self._decide is not None else
                        select_and_gate(model, self.tokenizer, self.candidates, self.items,
                                        self.gate, enabled=self.gated, reference=self.reference,
                                        online_score=self.online_score, seed=self.seed,
                                        keep_pass=self.keep_pass, timings=parts))
        finally:
            model.train(was_training)
        promoted, vetoed, verdict = decision.accepted, False, None
        t_review = time.perf_counter()
        if decision.accepted and self.gated and self.review is not None:
            answer = self.review(decision)
            vetoed = bool(answer.veto)
            verdict = answer.model_dump() if hasattr(answer, "model_dump") else dict(answer)
            promoted = not vetoed
        parts["review"] = time.perf_counter() - t_review
        candidate = None
        if promoted and self.promote_accepted:
            state = decision.promoted_state(self.candidates)
            assert state is not None  # accepted
            promote(model, state)
            candidate = decision.chosen
            step = next(c.step for c in self.candidates if c.name == candidate)
            self.state.current = f"phase {self.phase} {candidate}"
            self.state.promotions.append({"phase": self.phase, "candidate": candidate,
                                          "step": step})
        seconds = time.perf_counter() - t0
        parts["other"] = seconds - sum(parts.values())  # C_k's list, checks, the promotion
        self.outcome = ReferenceOutcome(decision=decision, promoted=promoted, vetoed=vetoed,
                                        verdict=verdict, candidate=candidate, seconds=seconds,
                                        parts=parts)


def no_decision(candidates: list[PolicyCandidate], gate: GateConfig, reason: str,
                *, enabled: bool = True) -> GateDecision:
    """A decision that measured nothing (``reason`` says why): rejected when gated."""
    names = [c.name for c in candidates]
    nan = [math.nan] * len(names)
    d = decide(nan, nan, names, math.nan, gate, enabled=enabled, steps=[c.step for c in candidates])
    if enabled:
        d.reason = reason
    return d
