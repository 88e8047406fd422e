"""DPO on LoRA adapters (paper Eq. 1/2), the phase trainer and the EvoDPO gate (Eq. 3-5),
with the gate's evidence G_k (``evidence``) and the on-line inspector (``online_inspection``).

The phase loop calls ``train_phase`` with, for the adaptive reference, a
``ReferenceCallback`` on its Trainer: the callback keeps C_k and, when the fit ends, hands it
to its ``Promoter``, which runs the ``GateJudge`` (``select_and_gate``: Eq. 4 and the gate's
rule), the inspector's review, and ``promote`` into ``ref``.

Dependencies run one way (no import circle): the shared records (``ReferenceMode``,
``PolicyCandidate``, ``GateDecision``) live in the leaf ``atlas.types``; ``promote`` in
``atlas.agent.adapters``; config <- loss <- module <- callbacks/phase, gate <- scoring. This
package sits above ``atlas.evolution`` (docs/architecture.md, "Layers"): G_k is read off the
phase's programs, and the on-line inspector samples through the explorer.

Names are imported on first use (PEP 562): ``atlas.config`` validates a command line with
``atlas.dpo.config`` alone, before torch and Lightning load, so a typo fails in a second.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "promote": "atlas.agent.adapters",
    "PolicySnapshotCallback": "atlas.dpo.callbacks",
    "ReferenceCallback": "atlas.dpo.reference", "ReferenceState": "atlas.dpo.reference",
    "GateJudge": "atlas.dpo.reference", "Promoter": "atlas.dpo.reference",
    "DPOConfig": "atlas.dpo.config", "GateConfig": "atlas.dpo.config",
    "decide": "atlas.dpo.gate",
    "select_and_gate": "atlas.dpo.gate",
    "dpo_loss": "atlas.dpo.loss", "evaluate_pairs": "atlas.dpo.loss",
    "DPOModule": "atlas.dpo.module",
    "PhaseResult": "atlas.dpo.phase", "train_phase": "atlas.dpo.phase",
    "GateDecision": "atlas.types", "PolicyCandidate": "atlas.types", "ReferenceMode": "atlas.types",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'atlas.dpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
