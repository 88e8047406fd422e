"""DPO on the ``policy`` LoRA adapter as a LightningModule.

Only the ``policy`` adapter's tensors reach the optimiser. The reference is either the base
model (adapters disabled, EvoTune) or the frozen ``ref`` adapter (EvoDPO/ATLAS), which does
not move during a fit: its owner, ``atlas.dpo.reference.ReferenceCallback``, checks that and
promotes after the fit's last step. A run's state (adapters, optimiser) is saved by the
run's own checkpoint (``atlas.checkpoint``), not by Lightning's.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch

from atlas.agent.adapters import POLICY, adapter, adapter_params
from atlas.dpo.config import DPOConfig
from atlas.dpo.loss import dpo_loss, dpo_terms, reference_forward
from atlas.dpo.prefix import PromptGroup, grouped_logps, pair_logps_table
from atlas.types import ReferenceMode


class DPOModule(pl.LightningModule):
    """Trains ``model``'s policy adapter with the sigmoid DPO loss against ``reference``."""

    def __init__(self, model: torch.nn.Module, cfg: DPOConfig, reference: ReferenceMode | str,
                 optimizer_state: dict | None = None,
                 encoded: list[PromptGroup] | None = None, recompute: bool = False,
                 padded: bool = False) -> None:
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.reference = ReferenceMode.parse(reference)
        self.optimizer_state = optimizer_state
        # shared-prompt path: the phase's pairs, cut once, and their reference log-probs,
        # computed once at train start
        self.encoded = encoded
        self.recompute = recompute
        self.padded = padded  # a prompt's completions in one padded batch (dpo.padded)
        self.ref_table: torch.Tensor | None = None
        self.ref_seconds = 0.0
        self.history: list[dict[str, float]] = []
        self._last_grad_norm = float("nan")
        self._t0 = time.perf_counter()
        #: seconds of the fit's steps by part: the forward (policy, LM head, log-probs, loss,
        #: the padded path's reference), the backward, the optimiser (clipping, AdamW);
        #: where a phase's time goes (``python -m atlas.bench dpo --parts``)
        self.part_seconds = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        self._mark = 0.0

    def _clock(self) -> float:
        """Now, after the device finished what was queued (CUDA runs asynchronously)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # -- training ---------------------------------------------------------------------------
    def policy_parameters(self) -> list[torch.nn.Parameter]:
        """The only tensors the optimiser sees (sorted by name: a stable order for resume)."""
        params = adapter_params(self.model, POLICY)
        return [params[k] for k in sorted(params)]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = self.policy_parameters()
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.0)
        if self.optimizer_state is not None:
            opt.load_state_dict(self.optimizer_state)
            for group in opt.param_groups:  # the strategist may have changed lr since
                group["lr"] = self.cfg.lr
        return opt

    def on_train_start(self) -> None:
        if self.encoded is not None and not self.padded:
            t0 = time.perf_counter()
            with reference_forward(self.model, self.reference):
                self.ref_table = pair_logps_table(self.model, self.encoded)
            self.ref_seconds = time.perf_counter() - t0
        self._t0 = time.perf_counter()

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Any = None) -> None:
        start = self._clock()
        before = self.part_seconds["forward"] + self.part_seconds["backward"]
        optimizer.step(closure=optimizer_closure)  # the closure runs the forward and backward
        inside = self.part_seconds["forward"] + self.part_seconds["backward"] - before
        self.part_seconds["optimizer"] += self._clock() - start - inside

    def on_before_backward(self, loss: torch.Tensor) -> None:
        now = self._clock()
        self.part_seconds["forward"] += now - self._mark
        self._mark = now

    def on_after_backward(self) -> None:
        now = self._clock()
        self.part_seconds["backward"] += now - self._mark
        self._mark = now

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self._mark = self._clock()
        if "groups" in batch:  # shared-prompt path
            with adapter(self.model, POLICY):
                flat = torch.cat(grouped_logps(self.model, batch["groups"], "sum",
                                               recompute=self.recompute,
                                               padded=self.padded))
            policy = flat[batch["slots"].to(flat.device)]
            ref = self._reference(batch)
            terms = dpo_loss(policy[:, 0], policy[:, 1], ref[:, 0], ref[:, 1], self.cfg.beta)
            tokens, scored = int(batch["tokens"]), int(batch["scored"])
            extra = {"attended": int(batch["attended"])}  # attention's work (atlas.bench.parts)
        else:
            terms = dpo_terms(self.model, batch, self.cfg.beta, self.reference)
            tokens = int(batch["attention_mask"].sum())
            scored = int(batch["completion_mask"].sum())
            extra = {}
        record: dict[str, Any] = {"step": self.global_step + 1, "epoch": self.current_epoch,
                                  **terms.stats(), "tokens": tokens, "scored_tokens": scored, **extra}
        self.history.append(record)
        self.log("dpo/loss", record["loss"], on_step=True, batch_size=len(terms.losses))
        return terms.loss

    def _reference(self, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's (chosen, rejected) reference log-probs. Rows: from the phase's table.
        Padded: run on the step's own groups, since a padded batch's shape (its rows and
        width) changes the kernels' rounding, and in bf16 a table padded another way started
        the log-ratios ~1 nat off zero; the same shapes give the same numbers."""
        if not self.padded:
            return self.ref_table[batch["index"].to(self.ref_table.device)]
        t0 = time.perf_counter()
        with reference_forward(self.model, self.reference):
            flat = torch.cat(grouped_logps(self.model, batch["groups"], "sum", padded=True))
        self.ref_seconds += time.perf_counter() - t0
        return flat[batch["slots"].to(flat.device)]

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer,
                                    gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip (when ``cfg.grad_clip`` > 0) and record the pre-clip gradient norm."""
        params = [p for p in self.policy_parameters() if p.grad is not None]
        limit = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit) if params else torch.tensor(0.0)
        self._last_grad_norm = float(norm)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.history:
            rec = self.history[-1]
            rec["grad_norm"] = self._last_grad_norm
            rec["lr"] = float(self.trainer.optimizers[0].param_groups[0]["lr"])
            rec["seconds"] = time.perf_counter() - self._t0
