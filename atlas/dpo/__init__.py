"""DPO on LoRA adapters (paper Eq. 1/2), the phase trainer and the EvoDPO gate (Eq. 3-5).

The phase loop calls ``train_phase`` (C_k and metrics), then ``select_and_gate`` (Eq. 4/5),
then promotes the accepted candidate with ``promote`` or, through Lightning, with a
``ReferenceSwapCallback`` handed to the next ``train_phase``.
"""

from atlas.dpo.callbacks import PolicySnapshotCallback, ReferenceSwapCallback
from atlas.dpo.config import DPOConfig, GateConfig
from atlas.dpo.gate import (
    GateDecision,
    decide,
    hold_out_prompts,
    inspector_score,
    promote,
    select_and_gate,
    token_kl,
)
from atlas.dpo.loss import dpo_loss, evaluate_pairs
from atlas.dpo.module import DPOModule
from atlas.dpo.phase import PhaseResult, PolicyCandidate, train_phase

__all__ = [
    "DPOConfig", "DPOModule", "GateConfig", "GateDecision", "PhaseResult", "PolicyCandidate",
    "PolicySnapshotCallback", "ReferenceSwapCallback", "decide", "dpo_loss", "evaluate_pairs",
    "hold_out_prompts", "inspector_score", "promote", "select_and_gate", "token_kl", "train_phase",
]
