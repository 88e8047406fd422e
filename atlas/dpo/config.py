"""Typed, validated mirrors of ``conf/dpo/default.yaml`` and ``conf/gate/default.yaml``.

The strategist (an LLM) and the command line both change these knobs, and the design notes
record that LLM answers were malformed or out of range; so every value is type-checked on
the way in, and ``DPOConfig.clamped`` pins the strategist-tunable knobs inside ``bounds``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from atlas.fields import check_known_fields, number, plain_mapping
from atlas.knobs import HARD_BOUNDS


@dataclass
class DPOConfig:
    """One phase of DPO on the ``policy`` LoRA adapter (paper Eq. 1/2)."""

    beta: float = 0.1
    """Inverse temperature of the preference margin (reward = beta * log-ratio)."""
    lr: float = 5.0e-5
    """AdamW learning rate of the policy adapter."""
    epochs: int = 1
    """Passes over D_k per phase."""
    batch_size: int = 2
    """Pairs per optimiser step (chosen and rejected go through one forward: 2x rows)."""
    max_length: int = 768
    """Prompt+completion tokens kept; the prompt is truncated from the left."""
    max_pairs: int = 24
    """Cap on |D_k|; ``train_phase`` keeps the highest-margin pairs if given more."""
    score_threshold: float | None = None
    """Passed candidates below this score are not used as "chosen" (pair builder); None = none."""
    top_k: int = 4
    """Count-based top-k passed candidates per island used as "chosen" (pair builder)."""
    grad_clip: float = 1.0
    """Max global L2 norm of the adapter gradient; 0 disables clipping."""
    checkpoints: int = 2
    """Intermediate policy snapshots per phase that join C_k (the phase-final is always added)."""
    gradient_checkpointing: bool | str = "auto"
    """Recompute activations in the backward pass instead of keeping them: same losses, less
    peak memory, one more forward pass. ``auto``: only when a step's estimated activations
    exceed ``memory_budget_gb`` (``python -m atlas.bench dpo`` measures both)."""
    memory_budget_gb: float = 6.0
    """``gradient_checkpointing=auto``: the activation memory a step may hold before it
    recomputes instead."""
    shared_prompt: bool = True
    """Run each prompt once per step for all its completions (chosen and rejected share it)
    and the reference once per phase (a table), instead of every (prompt, completion) row in
    full at every step; same losses (``atlas/dpo/prefix.py``). false: the per-row path."""
    bounds: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(HARD_BOUNDS))
    """Hard [low, high] limits that ``clamped`` applies to the named knobs."""

    def __post_init__(self) -> None:
        g = "dpo"
        self.beta = number(g, "beta", self.beta, low=0.0, low_open=True)
        self.lr = number(g, "lr", self.lr, low=0.0, low_open=True)
        self.epochs = number(g, "epochs", self.epochs, low=1, integer=True)
        self.batch_size = number(g, "batch_size", self.batch_size, low=1, integer=True)
        self.max_length = number(g, "max_length", self.max_length, low=2, integer=True)
        self.max_pairs = number(g, "max_pairs", self.max_pairs, low=1, integer=True)
        if self.score_threshold is not None:
            self.score_threshold = number(g, "score_threshold", self.score_threshold)
        self.top_k = number(g, "top_k", self.top_k, low=1, integer=True)
        self.grad_clip = number(g, "grad_clip", self.grad_clip, low=0.0)
        self.checkpoints = number(g, "checkpoints", self.checkpoints, low=0, integer=True)
        if self.gradient_checkpointing != "auto" and not isinstance(self.gradient_checkpointing,
                                                                     bool):
            raise TypeError(f"dpo.gradient_checkpointing must be true, false or auto, got "
                            f"{self.gradient_checkpointing!r}")
        self.memory_budget_gb = number(g, "memory_budget_gb", self.memory_budget_gb, low=0.0)
        if not isinstance(self.shared_prompt, bool):
            raise TypeError(f"dpo.shared_prompt must be true or false, got {self.shared_prompt!r}")
        self.bounds = self._check_bounds(self.bounds)

    @staticmethod
    def _check_bounds(bounds: Any) -> dict[str, tuple[float, float]]:
        if not isinstance(bounds, Mapping):
            raise TypeError(f"dpo.bounds must map a knob to [low, high], got {bounds!r}")
        numeric = {"beta", "lr", "epochs", "batch_size", "max_length", "max_pairs", "top_k",
                   "grad_clip", "checkpoints", "score_threshold"}
        out: dict[str, tuple[float, float]] = {}
        for name, pair in bounds.items():
            if name not in numeric:
                raise ValueError(f"dpo.bounds.{name} names no numeric DPO knob; use one of "
                                 f"{sorted(numeric)}")
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"dpo.bounds.{name} must be [low, high], got {pair!r}")
            low = number("dpo.bounds", f"{name}[0]", pair[0])
            high = number("dpo.bounds", f"{name}[1]", pair[1])
            if low > high:
                raise ValueError(f"dpo.bounds.{name}: low {low} exceeds high {high}; swap them")
            out[name] = (low, high)
        return out

    @classmethod
    def from_cfg(cls, cfg: Mapping) -> "DPOConfig":
        """Build from the Hydra ``dpo`` group (dict or DictConfig); unknown fields are errors."""
        data = plain_mapping(cfg, "dpo")
        check_known_fields((f.name for f in fields(cls)), data, "dpo")
        return cls(**data)

    def clamped(self) -> "DPOConfig":
        """A copy with every knob named in ``bounds`` pulled inside its [low, high]."""
        changes: dict[str, Any] = {}
        for name, (low, high) in self.bounds.items():
            value = getattr(self, name)
            if value is None:
                continue
            new = min(max(value, low), high)
            if isinstance(value, int):
                new = int(min(max(value, math.ceil(low)), math.floor(high)))
            if new != value:
                changes[name] = new
        return dataclasses.replace(self, **changes) if changes else dataclasses.replace(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for logging (bounds as lists, JSON friendly)."""
        d = dataclasses.asdict(self)
        d["bounds"] = {k: list(v) for k, v in self.bounds.items()}
        return d


SCORE_MODES = ("offline", "online")


@dataclass
class GateConfig:
    """The Policy Inspector's numbers: Eq. 4 selection and the Eq. 5 trust-region gate."""

    epsilon: float = 0.02
    """Minimum gain in normalised score units (share of each gate item's score range) that
    the paired lower confidence bound of S(c*) - S(ref) must reach to accept a promotion."""
    delta: float = 0.05
    """KL trust region: accept only if KL(cand || ref) <= delta (nats per completion token)."""
    lam: float = 1.0
    """lambda in Eq. 4: c* = argmax_c gain(c) / G - lam * KL(c || ref) / K, G and K the
    largest |gain| and KL over C_k (both terms span at most 1)."""
    subset_size: int = 8
    """Cap on |G_k|: gate prompts drawn afresh each phase among the held-out ones."""
    holdout: float = 0.25
    """Share of a phase's prompts held out of D_k for G_k (at least one when the phase has
    two or more prompts; with one prompt nothing is held out and the gate rejects)."""
    confidence: float = 0.9
    """One-sided level of the paired bootstrap lower bound on the gain."""
    resamples: int = 1000
    """Bootstrap resamples of each gate item's completions for that bound."""
    score_mode: str = "offline"
    """offline: re-weight already evaluated completions; online: each policy of C_k and the
    reference writes fresh programs for the gate prompts, scored in the sandbox."""
    online_samples: int = 2
    """online only: completions sampled per gate prompt and policy (same seeds for all)."""
    online_temperature: float = 0.5
    """online only: sampling temperature of those completions."""
    temperature: float = 1.0
    """Divides the sequence log-likelihood ratio log pi(y) - log ref(y) in the inspector
    score's importance weights (1: the exact ratio)."""
    batch_size: int = 8
    """Validated but no longer used: the gate's passes run each item's prompt once and each
    completion after it as its own unpadded row (``atlas.dpo.prefix``)."""
    max_length: int = 768
    """Prompt+completion tokens kept per gate sequence (prompt truncated from the left)."""

    def __post_init__(self) -> None:
        g = "gate"
        self.epsilon = number(g, "epsilon", self.epsilon)
        self.delta = number(g, "delta", self.delta, low=0.0)
        self.lam = number(g, "lam", self.lam, low=0.0)
        self.subset_size = number(g, "subset_size", self.subset_size, low=1, integer=True)
        self.holdout = number(g, "holdout", self.holdout, low=0.0, low_open=True)
        if not self.holdout < 1.0:
            raise ValueError(f"gate.holdout must be < 1 (D_k needs prompts too), got {self.holdout}")
        self.confidence = number(g, "confidence", self.confidence, low=0.0, low_open=True)
        if not self.confidence < 1.0:
            raise ValueError(f"gate.confidence must be < 1, got {self.confidence}; e.g. 0.9")
        self.resamples = number(g, "resamples", self.resamples, low=1, integer=True)
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"gate.score_mode must be one of {SCORE_MODES}, got {self.score_mode!r}")
        self.online_samples = number(g, "online_samples", self.online_samples, low=1,
                                      integer=True)
        self.online_temperature = number(g, "online_temperature", self.online_temperature,
                                          low=0.0, low_open=True)
        self.temperature = number(g, "temperature", self.temperature, low=0.0, low_open=True)
        self.batch_size = number(g, "batch_size", self.batch_size, low=1, integer=True)
        self.max_length = number(g, "max_length", self.max_length, low=2, integer=True)

    @classmethod
    def from_cfg(cls, cfg: Mapping) -> "GateConfig":
        """Build from the Hydra ``gate`` group (dict or DictConfig); unknown fields are errors."""
        data = plain_mapping(cfg, "gate")
        check_known_fields((f.name for f in fields(cls)), data, "gate")
        return cls(**data)
