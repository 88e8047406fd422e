"""Lightning callbacks of a DPO phase: policy snapshots for C_k and the reference swap.

``PolicySnapshotCallback`` keeps in memory (never on disk) copies of the policy adapter at
evenly spaced optimiser steps: the intermediate checkpoints of C_k (paper Eq. 4).

``ReferenceSwapCallback`` is how a gate decision reaches the LightningModule: the gate's
accepted candidate is queued (``queue`` / ``queue_decision``) and the callback calls
``DPOModule.swap_reference`` at the next phase boundary (``on_train_start``), i.e. before the
first step of the phase that must train against the new reference; a swap still queued when
the run ends is applied by ``flush``. It owns promotion: nothing else decides when ``ref``
moves, and both paths write it through ``atlas.agent.adapters.promote``. A queued swap is
part of the callback's checkpoint state, so it survives a save/load between the gate and the
next phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from atlas.agent.adapters import POLICY, get_adapter_state, promote
from atlas.types import GateDecision, PolicyCandidate


def snapshot_steps(total_steps: int, checkpoints: int) -> list[int]:
    """``checkpoints`` distinct steps spread evenly inside (0, total_steps), final excluded.

    Fewer come back when the phase has too few steps to hold them apart.
    """
    if checkpoints <= 0 or total_steps <= 1:
        return []
    steps = {round(i * total_steps / (checkpoints + 1)) for i in range(1, checkpoints + 1)}
    return sorted(s for s in steps if 0 < s < total_steps)


class PolicySnapshotCallback(pl.Callback):
    """Copy the policy adapter after the optimiser steps listed in ``steps``."""

    def __init__(self, steps: Sequence[int]) -> None:
        self.steps = sorted(set(int(s) for s in steps))
        self.snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        taken = {s for s, _ in self.snapshots}
        if step in self.steps and step not in taken:
            self.snapshots.append((step, get_adapter_state(pl_module.model, POLICY)))


class ReferenceSwapCallback(pl.Callback):
    """Apply a queued reference promotion at the start of the next training phase."""

    def __init__(self, state: dict[str, torch.Tensor] | None = None, name: str = "") -> None:
        self.pending: dict[str, torch.Tensor] | None = None
        self.pending_name = ""
        self.applied: list[str] = []
        if state is not None:
            self.queue(state, name)

    def queue(self, state: dict[str, torch.Tensor], name: str = "") -> None:
        """Schedule ``ref <- state`` (copied now, so later policy updates cannot leak in)."""
        self.pending = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self.pending_name = name

    def queue_decision(self, decision: GateDecision,
                       candidates: Sequence[PolicyCandidate]) -> bool:
        """Queue the gate's chosen candidate if the gate accepted it; return whether queued."""
        state = decision.promoted_state(candidates)
        if state is None:
            return False
        self.queue(state, decision.chosen)
        return True

    def _take(self) -> dict[str, torch.Tensor]:
        """The queued tensors, now recorded as applied and no longer pending."""
        state = self.pending
        self.applied.append(self.pending_name)
        self.pending, self.pending_name = None, ""
        return state

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.pending is None:
            return
        pl_module.swap_reference(self._take())

    def flush(self, model: torch.nn.Module) -> bool:
        """Apply a swap still queued when no phase follows (run end); return whether one was."""
        if self.pending is None:
            return False
        promote(model, self._take())
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "pending_name": self.pending_name,
                "applied": list(self.applied)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pending = state_dict.get("pending")
        self.pending_name = state_dict.get("pending_name", "")
        self.applied = list(state_dict.get("applied", []))
