"""DPO on LoRA adapters (paper Eq. 1/2), the phase trainer and the EvoDPO gate (Eq. 3-5).

The phase loop calls ``train_phase`` (C_k and metrics), then ``select_and_gate`` (Eq. 4/5),
then queues the accepted candidate on a ``ReferenceSwapCallback`` (the owner of promotion),
which the next ``train_phase`` applies through Lightning, or ``flush`` at run end; both write
``ref`` with ``promote``.

Dependencies run one way (no import circle): the shared records (``ReferenceMode``,
``PolicyCandidate``, ``GateDecision``) live in the leaf ``atlas.types``; ``promote`` in
``atlas.agent.adapters``; config <- loss <- module <- callbacks/phase, gate <- scoring.
"""

from atlas.agent.adapters import promote
from atlas.dpo.callbacks import PolicySnapshotCallback, ReferenceSwapCallback
from atlas.dpo.config import DPOConfig, GateConfig
from atlas.dpo.gate import decide, hold_out_prompts, inspector_score, select_and_gate, token_kl
from atlas.dpo.loss import dpo_loss, evaluate_pairs
from atlas.dpo.module import DPOModule
from atlas.dpo.phase import PhaseResult, train_phase
from atlas.types import GateDecision, PolicyCandidate, ReferenceMode

__all__ = [
    "DPOConfig", "DPOModule", "GateConfig", "GateDecision", "PhaseResult", "PolicyCandidate",
    "PolicySnapshotCallback", "ReferenceMode", "ReferenceSwapCallback", "decide", "dpo_loss", "evaluate_pairs",
    "hold_out_prompts", "inspector_score", "promote", "select_and_gate", "token_kl", "train_phase",
]
