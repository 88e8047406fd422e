"""The Lightning callback of a DPO phase that keeps the policy snapshots of C_k.

``PolicySnapshotCallback`` keeps in memory (never on disk) copies of the policy adapter at
evenly spaced optimiser steps: the intermediate checkpoints of C_k (paper Eq. 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from atlas.agent.adapters import POLICY, get_adapter_state


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
