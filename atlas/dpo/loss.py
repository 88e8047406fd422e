"""The sigmoid DPO loss (paper Eq. 1/2) and the reference forward it is anchored at.

Kept apart from the LightningModule so that the loss can be checked against TRL on bare
numbers and reused for diagnostics (``evaluate_pairs``) without a Trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from atlas.agent.adapters import POLICY, REF, adapter
from atlas.dpo.batching import PairCollator
from atlas.dpo.logprobs import sequence_logps
from atlas.types import PreferencePair, ReferenceMode


@contextlib.contextmanager
def reference_forward(model, reference: str) -> Iterator[None]:
    """No-grad, eval-mode (no dropout) context in which ``model`` is the reference policy."""
    name = None if ReferenceMode.parse(reference) == ReferenceMode.FIXED else REF
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), adapter(model, name):
            yield
    finally:
        model.train(was_training)


@dataclass
class DPOTerms:
    """Per-pair loss and implicit rewards of one batch."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor  # beta * (log pi - log ref) on chosen, detached
    rejected_rewards: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        return self.losses.mean()

    def stats(self) -> dict[str, float]:
        """Batch means: loss, accuracy (chosen reward > rejected), margin, rewards."""
        margin = self.chosen_rewards - self.rejected_rewards
        return {"loss": float(self.losses.detach().mean()),
                "accuracy": float((margin > 0).float().mean()),
                "margin": float(margin.mean()),
                "chosen_reward": float(self.chosen_rewards.mean()),
                "rejected_reward": float(self.rejected_rewards.mean())}


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float) -> DPOTerms:
    """-log sigmoid(beta * [(log pi_w - log ref_w) - (log pi_l - log ref_l)]) per pair."""
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    return DPOTerms(losses=losses, chosen_rewards=beta * chosen_ratio.detach(),
                    rejected_rewards=beta * rejected_ratio.detach())


def dpo_terms(model, batch: dict[str, torch.Tensor], beta: float, reference: str) -> DPOTerms:
    """Policy forward (with grad) and reference forward on a [chosen; rejected] batch."""
    with adapter(model, POLICY):
        policy = sequence_logps(model, batch, "sum")
    with reference_forward(model, reference):
        ref = sequence_logps(model, batch, "sum")
    pc, pr = policy.chunk(2)
    rc, rr = ref.chunk(2)
    return dpo_loss(pc, pr, rc, rr, beta)


@torch.no_grad()
def evaluate_pairs(model, tokenizer, pairs: Sequence[PreferencePair], beta: float,
                   reference: str, *, max_length: int = 768, batch_size: int = 8) -> dict[str, float]:
    """DPO loss/accuracy/margin of the current policy on ``pairs`` (no update): a diagnostic."""
    if not pairs:
        raise ValueError("pairs: evaluate_pairs needs at least one PreferencePair")
    collator = PairCollator(tokenizer, max_length)
    losses, margins, chosen, rejected = [], [], [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(pairs), batch_size):
            terms = dpo_terms(model, collator(pairs[start:start + batch_size]), beta, reference)
            losses.append(terms.losses)
            chosen.append(terms.chosen_rewards)
            rejected.append(terms.rejected_rewards)
            margins.append(terms.chosen_rewards - terms.rejected_rewards)
    finally:
        model.train(was_training)
    margin = torch.cat(margins)
    return {"loss": float(torch.cat(losses).mean()), "accuracy": float((margin > 0).float().mean()),
            "margin": float(margin.mean()), "chosen_reward": float(torch.cat(chosen).mean()),
            "rejected_reward": float(torch.cat(rejected).mean()), "pairs": float(len(pairs))}
