"""The typed schemas of ``conf/dpo/default.yaml`` and ``conf/gate/default.yaml``.

The strategist (an LLM) and the command line both change these knobs, and LLM answers can be
malformed or out of range (docs/design.md); so every value is type-checked on the way in
(``atlas.schema``: one validation style and one error format for every group),
and ``DPOConfig.clamped`` pins the strategist-tunable knobs inside ``bounds``. The defaults
are the YAML's values (``tests/test_schema.py`` keeps them equal), for use from Python.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from atlas.dpo.rules import DEFAULT_RULE, Bound, RuleName, Scale
from atlas.knobs import DEFAULT_BOUNDS
from atlas.schema import Bool, Int, Num, NumOrAuto, group


def _bool_or_auto(value: Any) -> bool | str:
    if value != "auto" and not isinstance(value, bool):
        raise PydanticCustomError("atlas_type", "must be {kind}",
                                  {"kind": "true, false or auto", "example": "auto"})
    return value


#: DPO fields a ``dpo.bounds`` entry may name
BOUNDABLE = frozenset({"beta", "lr", "epochs", "batch_size", "max_length", "max_pairs", "top_k",
                       "grad_clip", "checkpoints", "score_threshold"})


@group("dpo")
class DPOConfig:
    """One phase of DPO on the ``policy`` LoRA adapter (paper Eq. 1/2)."""

    beta: Num = Field(0.1, gt=0.0)
    """Inverse temperature of the preference margin (reward = beta * log-ratio)."""
    lr: Num = Field(2.5e-4, gt=0.0)
    """AdamW learning rate of the policy adapter."""
    epochs: Int = Field(1, ge=1)
    """Passes over D_k per phase."""
    batch_size: Int = Field(2, ge=1)
    """Pairs per optimiser step (chosen and rejected go through one forward: 2x rows)."""
    max_length: Int = Field(768, ge=2)
    """Prompt+completion tokens kept; the prompt is truncated from the left."""
    max_pairs: Int = Field(24, ge=1)
    """Cap on |D_k|; ``train_phase`` keeps the highest-margin pairs if given more."""
    score_threshold: Num | None = None
    """Passed candidates below this score are not used as "chosen" (pair builder); None = none."""
    top_k: Int = Field(4, ge=1)
    """Count-based top-k passed candidates per island used as "chosen" (pair builder)."""
    lazy_pairs: Bool = True
    """Pair each copy (``atlas.novelty``) as the rejected side against the best new valid
    program of the same prompt (``new_vs_copy``: ThetaEvolve's lazy-output penalty)."""
    grad_clip: Num = Field(1.0, ge=0.0)
    """Max global L2 norm of the adapter gradient; 0 disables clipping."""
    checkpoints: Int = Field(1, ge=0)
    """Intermediate policy snapshots per phase that join C_k (the phase-final is always added)."""
    gradient_checkpointing: Annotated[bool | str, BeforeValidator(_bool_or_auto)] = "auto"
    """Recompute activations in the backward pass instead of keeping them: same losses, less
    peak memory, one more forward pass. ``auto``: only when a step's estimated activations
    exceed ``memory_budget_gb`` (``python -m atlas.bench dpo`` measures both)."""
    memory_budget_gb: NumOrAuto = "auto"
    """``gradient_checkpointing=auto``: the activation memory (GB) a step may hold before it
    recomputes instead. ``auto``: 6 GB on the CPU (a 2-core SLURM job's 8 GB holds it); on
    CUDA half the device's free memory when the phase starts (``resolve_memory_budget``)."""
    shared_prompt: Bool = True
    """Run each prompt once per step for all its completions (chosen and rejected share it)
    and the reference once per phase (a table), instead of every (prompt, completion) row in
    full at every step; same losses (``atlas/dpo/prefix.py``). false: the per-row path."""
    group_by_prompt: Bool = True
    """Shared-prompt path: batch pairs of one prompt together where possible (then the
    prompt runs once a step, not once per pair); every pair once an epoch, the same number
    of steps; false: a plain shuffle (``atlas.dpo.batching.PromptBatches``)."""
    padded: Annotated[bool | str, BeforeValidator(_bool_or_auto)] = "auto"
    """Shared-prompt path: a prompt's completions run as one right-padded batch after it
    instead of one unpadded row each; the same log-probs within float rounding, fewer and
    wider passes. ``auto``: padded on CUDA, rows on the CPU (``python -m atlas.bench dpo``
    measures both; docs/results.md). Each phase records the path it ran."""
    attention: Literal["sdpa", "eager", "blocked", "auto"] = "auto"
    """The attention kernel of the phase's training forwards (the reference table and the
    steps): ``sdpa`` (the model's own, PyTorch's fused kernel), ``eager`` (transformers'
    products and softmax; keeps each layer's attention weights for the backward),
    ``blocked`` (eager's products in blocks of queries, each over the keys it can see:
    ``atlas.dpo.blocked_attention``) or ``auto`` (blocked on a CPU in bf16, sdpa elsewhere:
    ``atlas.dpo.attention.resolve_attention``). The same log-probs within float rounding.
    The gate's passes are forward only and run on the model's own kernel either way
    (``atlas.dpo.attention``). Each phase records the kernel its steps ran on
    (``eager_attention``, ``blocked_attention``); docs/results.md ("Blocked attention for the
    steps") times them."""
    bounds: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_BOUNDS),
                                   validate_default=True)
    """Hard [low, high] limits that ``clamped`` applies to the named knobs."""

    @field_validator("bounds", mode="before")
    @classmethod
    def _check_bounds(cls, bounds: Any) -> dict[str, tuple[float, float]]:
        if hasattr(bounds, "items") and not isinstance(bounds, dict):
            bounds = dict(bounds.items())
        if not isinstance(bounds, dict):
            raise ValueError(f"dpo.bounds must map a knob to [low, high], got {bounds!r}")
        out: dict[str, tuple[float, float]] = {}
        for name, pair in bounds.items():
            if name not in BOUNDABLE:
                raise ValueError(f"dpo.bounds.{name} names no numeric DPO knob; use one of "
                                 f"{sorted(BOUNDABLE)}")
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"dpo.bounds.{name} must be [low, high], got {pair!r}")
            for i, v in enumerate(pair):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"dpo.bounds.{name}[{i}] must be a finite number, got {v!r}")
            low, high = float(pair[0]), float(pair[1])
            if low > high:
                raise ValueError(f"dpo.bounds.{name}: low {low} exceeds high {high}; swap them")
            out[name] = (low, high)
        return out

    def clamped(self) -> DPOConfig:
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




@group("gate", fixes={"holdout": "D_k needs prompts too", "confidence": "e.g. 0.9"})
class GateConfig:
    """The Policy Inspector's numbers: Eq. 4 selection and the Eq. 5 trust-region gate."""

    rule: RuleName = DEFAULT_RULE
    """Which test accepts c* (``atlas.dpo.rules``, where each rule says what it tests and
    which of these fields it reads). eq5: paper Eq. 5 with a confidence bound, the gain's
    paired lower bound >= epsilon and KL <= delta."""
    epsilon: Num = 0.01
    """Minimum gain in normalised score units (``scale``; 0.01 = 1% of G_k's score range) that
    the paired lower confidence bound of S(c*) - S(ref) must reach to accept a promotion. A
    margin over the bound: a policy with no effect clears a 90% bound 10% of the time by
    construction, and the gate bench asks for at most 1 false promotion in 10."""
    delta: Num = Field(0.05, ge=0.0)
    """KL trust region: accept only if KL(cand || ref) <= delta (nats per completion token)."""
    lam: Num = Field(1.0, ge=0.0)
    """lambda in Eq. 4: c* = argmax_c gain(c) / G - lam * KL(c || ref) / K, G and K the
    largest |gain| and KL over C_k (both terms span at most 1)."""
    subset_size: Int = Field(8, ge=1)
    """Cap on |G_k|: gate prompts drawn afresh each phase, informative ones first."""
    evidence: Literal["auto", "holdout", "buffer"] = "auto"
    """What G_k is. holdout: prompts held out of D_k (the gate never scores a policy on what
    it was trained on); buffer: the paper's rule, prompts drawn from the phase buffer that D_k
    is built from (in-sample; nothing held out); auto: holdout when the held-out prompts carry
    at least ``min_holdout_completions`` informative completions, else buffer. Each phase
    records the mode it used."""
    min_holdout_completions: Int = Field(32, ge=0)
    """auto: fewest informative completions a held-out G_k needs to be used. Below it a
    correctly trained policy clears the held-out gate about 1 time in 4 or less (the gate
    bench's trials subsampled, ``python -m atlas.bench gate --power``): the decision would
    be noise, so the phase decides on the buffer instead."""
    min_completions: Int = Field(4, ge=1)
    """Fewest informative completions (of gate items whose scores differ) any G_k needs for a
    decision; below it the phase is recorded as "insufficient evidence", not as a rejection.
    At 1 item x 2 completions the bootstrap has three distinct resamples; from 1 x 4 a policy
    with no effect clears the (percentile) bound 3% of the time (``--null``)."""
    holdout: Num = Field(0.5, gt=0.0, lt=1.0)
    """Share of a phase's prompts held out of D_k for a held-out G_k (at least one when the
    phase has two or more prompts; none with one prompt). 0.5: with
    a quarter, the gate bench's held-out evidence (4 prompts) was too thin to pass the
    correctly trained policies it should."""
    confidence: Num = Field(0.9, gt=0.0, lt=1.0)
    """One-sided level of the paired bootstrap lower bound on the gain."""
    resamples: Int = Field(1000, ge=1)
    """Bootstrap resamples of each gate item's completions for that bound."""
    scale: Scale = "subset"
    """The unit of the inspector score. subset: one scale for all of G_k, 0 = its worst
    score (a failure's floor when one failed), 1 = its best, so a near-tie between two valid
    programs weighs as little as it scores; item: each item's own worst-to-best range (a
    0.006 near-tie then counts as much as a failure against the best). The gate bench
    measures both (docs/results.md)."""
    bound: Bound = "bc"
    """How the lower confidence bound is read off the paired bootstrap. bc: bias-corrected
    percentile (Efron), needed because resampling a handful of completions per item shrinks
    the re-weighting gain (a plug-in covariance, times (n-1)/n); percentile: the plain
    (1 - confidence) quantile, conservative on few completions; normal: gain - z * bootstrap
    SE."""
    bc_min_completions: Int = Field(32, ge=0)
    """Fewest informative completions in G_k for ``bound=bc``; below it the plain percentile
    bound is used. BC estimates the bootstrap's bias from the resamples, and with a handful
    of completions it over-corrects: simulated no-effect policies cleared epsilon 0.01 24% of
    the time with 4 items x 4 completions (percentile 7%), ~11% at 32 completions."""
    score_mode: Literal["offline", "online"] = "offline"
    """offline: re-weight already evaluated completions; online: each policy of C_k and the
    reference writes fresh programs for the gate prompts, scored in the sandbox."""
    online_samples: Int = Field(2, ge=1)
    """online only: completions sampled per gate prompt and policy (same seeds for all)."""
    online_temperature: Num = Field(0.5, gt=0.0)
    """online only: sampling temperature of those completions."""
    temperature: Num = Field(1.0, gt=0.0)
    """Divides the sequence log-likelihood ratio log pi(y) - log ref(y) in the inspector
    score's importance weights (1: the exact ratio)."""
    max_length: Int = Field(768, ge=2)
    """Prompt+completion tokens kept per gate sequence (prompt truncated from the left)."""
    padded: Annotated[bool | str, BeforeValidator(_bool_or_auto)] = "auto"
    """The gate's forward passes: an item's completions as one right-padded batch after its
    prompt instead of one unpadded row each (as ``dpo.padded``; ``auto``: padded on CUDA,
    rows on the CPU). Each phase records the path it ran."""
