"""One fine-tuning phase k: DPO on D_k through a Lightning Trainer, returning C_k.

The phase loop calls ``train_phase``; it trains only the ``policy`` adapter against the
reference as it stands, snapshots the policy ``cfg.checkpoints`` times in memory, and returns
those snapshots plus the phase-final policy as the candidate set C_k. With the adaptive
reference, the Trainer carries the ``ReferenceCallback``, which decides on C_k and moves
``ref`` at the end of the fit (``atlas.dpo.reference``); nothing else here writes ``ref``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader

from atlas.agent.adapters import POLICY, get_adapter_state
from atlas.dpo.attention import attention_kernel, resolve_attention
from atlas.dpo.batching import IndexedPairCollator, PromptBatches, SharedPromptCollator
from atlas.dpo.callbacks import PolicySnapshotCallback, snapshot_steps
from atlas.dpo.config import DPOConfig
from atlas.dpo.module import DPOModule
from atlas.dpo.prefix import PromptGroup, encode_group, resolve_padded
from atlas.dpo.reference import ReferenceCallback, ReferenceOutcome
from atlas.types import PolicyCandidate, PreferencePair, ReferenceMode

#: where a phase's per-step DPO records go: a Lightning logger, a callable taking each record,
#: or nowhere
PhaseLogger = pl.loggers.Logger | Callable[[dict[str, Any]], Any] | None


@dataclass
class PhaseResult:
    """What one phase produced: C_k (final last), summary metrics and per-step records."""

    candidates: list[PolicyCandidate]
    metrics: dict[str, float]
    history: list[dict]
    optimizer_state: dict | None = None  # AdamW state, for resume (pass back to train_phase)
    reference: ReferenceOutcome | None = None  # the reference callback's decision, if attached


def _margin(pair: PreferencePair) -> float:
    gap = pair.chosen_score - pair.rejected_score
    return gap if not math.isnan(gap) else -math.inf


def select_pairs(pairs: Sequence[PreferencePair], max_pairs: int) -> list[PreferencePair]:
    """Keep at most ``max_pairs``, highest score margin first (a failed rejected = +inf)."""
    for i, p in enumerate(pairs):
        if not isinstance(p, PreferencePair):
            raise TypeError(f"pairs[{i}] must be an atlas.types.PreferencePair, got {type(p).__name__}")
    if len(pairs) <= max_pairs:
        return list(pairs)
    order = sorted(range(len(pairs)), key=lambda i: (-_margin(pairs[i]), i))
    return [pairs[i] for i in sorted(order[:max_pairs])]


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-fit banners ("GPU available", "few workers") for this call."""
    names = ["lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
             "lightning.fabric.utilities.rank_zero", "pytorch_lightning.utilities.rank_zero"]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*isn't a Lightning logger.*")
            warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            warnings.filterwarnings("ignore", message=".*`srun` command is available.*")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class StayOnDevice(SingleDeviceStrategy):
    """Lightning's teardown moves the LightningModule to the CPU after ``fit``; the agent's
    model inside it is shared with sampling and the gate, so here it stays where it was
    (the optimizer state still goes to the CPU, as Lightning does)."""

    def teardown(self) -> None:
        module, self._lightning_module = self._lightning_module, None
        try:
            super().teardown()
        finally:
            self._lightning_module = module


def _summary(history: list[dict], steps: int, seconds: float, n_pairs: int) -> dict[str, float]:
    keys = ("loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "grad_norm")
    out: dict[str, float] = {}
    for key in keys:
        vals = [float(r[key]) for r in history if key in r]
        out[key] = sum(vals) / len(vals) if vals else math.nan
        out[f"{key}_first"] = vals[0] if vals else math.nan
        out[f"{key}_last"] = vals[-1] if vals else math.nan
    out.update(steps=float(steps), seconds=seconds, pairs=float(n_pairs),
               tokens=float(sum(r.get("tokens", 0) for r in history)),
               scored_tokens=float(sum(r.get("scored_tokens", 0) for r in history)),
               attended=float(sum(r.get("attended", 0) for r in history)))
    return out


def train_phase(model, tokenizer, pairs: list[PreferencePair], cfg: DPOConfig,
                reference: ReferenceMode | str, *,
                seed: int = 0, logger: PhaseLogger = None, optimizer_state: dict | None = None,
                reference_callback: ReferenceCallback | None = None) -> PhaseResult:
    """Train the policy adapter on ``pairs`` for ``cfg.epochs`` epochs; return C_k and metrics.

    ``reference``: "fixed" (adapters off, EvoTune) or "adaptive" (the ``ref`` adapter).
    ``logger``: None, a Lightning logger (each step's record goes to ``log_metrics`` under
    ``dpo_step/``, after the fit), or a callable taking each per-step record (a dict). ``optimizer_state``: a previous ``PhaseResult.optimizer_state``
    to resume AdamW moments (lr is reset to ``cfg.lr``). Global RNG state is left as it was.
    ``reference_callback``: the adaptive reference's owner (``atlas.dpo.reference``); it takes
    C_k's snapshots and, at the end of the fit, decides and promotes. Without it (EvoTune, or
    a caller that gates by itself) a plain snapshot callback builds C_k.
    """
    reference = _check_phase_args(pairs, cfg, reference, logger)
    cfg = dataclasses.replace(cfg.clamped(), attention=resolve_attention(cfg.attention, model))
    with attention_kernel(model, cfg.attention):
        return _train_phase(model, tokenizer, pairs, cfg, reference, seed=seed, logger=logger,
                            optimizer_state=optimizer_state,
                            reference_callback=reference_callback)


def _train_phase(model, tokenizer, pairs: list[PreferencePair], cfg: DPOConfig,
                 reference: ReferenceMode, *, seed: int, logger: PhaseLogger,
                 optimizer_state: dict | None,
                 reference_callback: ReferenceCallback | None) -> PhaseResult:
    chosen = select_pairs(pairs, cfg.max_pairs)
    total_steps = math.ceil(len(chosen) / cfg.batch_size) * cfg.epochs
    device = next(model.parameters()).device
    encoded, collate, step_gb = _collation(model, tokenizer, chosen, cfg)
    budget_gb = resolve_memory_budget(cfg.memory_budget_gb, device)
    recompute = (cfg.gradient_checkpointing is True
                 or (cfg.gradient_checkpointing == "auto" and step_gb > budget_gb))
    padded = cfg.shared_prompt and resolve_padded(cfg.padded, device)
    module = DPOModule(model, cfg, reference, optimizer_state=optimizer_state, encoded=encoded,
                       recompute=recompute and cfg.shared_prompt, padded=padded)
    snaps = reference_callback if reference_callback is not None else PolicySnapshotCallback([])
    snaps.steps = snapshot_steps(total_steps, cfg.checkpoints)
    was_training = model.training
    t0 = time.perf_counter()
    # the per-row path recomputes through transformers; the shared-prompt path per prompt
    # group (transformers' checkpointing drops the prompt's KV cache in training)
    trainer = _fit(model, module, collate, len(chosen), cfg, seed=seed, device=device,
                   callbacks=[snaps], was_training=was_training,
                   hf_checkpointing=recompute and not cfg.shared_prompt, encoded=encoded)
    outcome = reference_callback.outcome if reference_callback is not None else None
    # DPO's own time: the reference's decision at the end of the fit is the gate's
    seconds = time.perf_counter() - t0 - (outcome.seconds if outcome is not None else 0.0)
    history = module.history
    _emit(logger, history)
    candidates = _candidates(model, trainer, snaps, reference_callback)
    metrics = _summary(history, trainer.global_step, seconds, len(chosen))
    gate_padded = (resolve_padded(reference_callback.promoter.judge.gate.padded, device)
                   if reference_callback is not None else math.nan)
    metrics.update(shared_prompt=float(cfg.shared_prompt), padded=float(padded),
                   eager_attention=float(cfg.attention == "eager"),
                   blocked_attention=float(cfg.attention == "blocked"),
                   gate_padded=float(gate_padded), recompute=float(recompute),
                   step_gb_estimate=step_gb, memory_budget_gb=budget_gb,
                   reference_table_seconds=module.ref_seconds,
                   **{f"{part}_seconds": v for part, v in module.part_seconds.items()})
    opt_state = _cpu_state(trainer.optimizers[0].state_dict()) if trainer.optimizers else None
    return PhaseResult(candidates=candidates, metrics=metrics, history=history,
                       optimizer_state=opt_state, reference=outcome)


def _check_phase_args(pairs: list[PreferencePair], cfg: DPOConfig,
                      reference: ReferenceMode | str, logger: PhaseLogger) -> ReferenceMode:
    """``train_phase``'s arguments, each wrong one named; the parsed reference mode."""
    reference = ReferenceMode.parse(reference)
    if not isinstance(cfg, DPOConfig):
        raise TypeError(f"cfg must be a DPOConfig (DPOConfig.from_cfg(cfg.dpo)), got {type(cfg).__name__}")
    if not pairs:
        raise ValueError("pairs: train_phase needs at least one PreferencePair (skip the phase instead)")
    if logger is not None and not (isinstance(logger, pl.loggers.Logger) or callable(logger)):
        raise TypeError(f"logger must be None, a Lightning logger or a callable taking a dict, "
                        f"got {type(logger).__name__}")
    return reference


def _collation(model, tokenizer, chosen: list[PreferencePair], cfg: DPOConfig
               ) -> tuple[list | None, Any, float]:
    """The batches' collator: shared-prompt groups (encoded once, with the estimate of the
    largest step any shuffle can make, in GB) or plain pair rows (no estimate: NaN)."""
    if not cfg.shared_prompt:
        return None, IndexedPairCollator(tokenizer, cfg.max_length, chosen), math.nan
    encoded = [encode_group(tokenizer, p.prompt, [p.chosen, p.rejected], cfg.max_length)
               for p in chosen]
    collate = SharedPromptCollator(encoded)
    # the largest step any shuffle can make: the batch_size largest pairs, unshared
    per_pair = sorted((estimate_step_gb(model, collate([i]), cfg.attention in ("eager", "blocked"))
                       for i in range(len(chosen))), reverse=True)
    return encoded, collate, sum(per_pair[:cfg.batch_size])


def _fit(model, module: DPOModule, collate: Any, n_pairs: int, cfg: DPOConfig, *, seed: int,
         device: torch.device, callbacks: list[pl.Callback], was_training: bool,
         hf_checkpointing: bool, encoded: list | None = None) -> pl.Trainer:
    """One Lightning fit of ``cfg.epochs`` epochs, seeded with ``seed`` under a forked RNG
    (the caller's global RNG state is left as it was); the model ends where it started."""
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    fork_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices), _quiet_lightning():
        torch.manual_seed(seed)
        # a dataset of pair indices: the same shuffle, so the same batches, on either path
        # (grouped by prompt: the shared-prompt path's own batches)
        generator = torch.Generator().manual_seed(seed)
        if encoded is not None and cfg.group_by_prompt:
            loader = DataLoader(list(range(n_pairs)), collate_fn=collate, batch_sampler=
                                PromptBatches([g.prompt for g in encoded], cfg.batch_size,
                                              generator))
        else:
            loader = DataLoader(list(range(n_pairs)), batch_size=cfg.batch_size, shuffle=True,
                                collate_fn=collate, generator=generator)
        trainer = pl.Trainer(
            accelerator=accelerator, devices=[device.index or 0] if accelerator == "gpu" else 1,
            strategy=StayOnDevice(device=device),
            max_epochs=cfg.epochs, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            log_every_n_steps=1, callbacks=callbacks, default_root_dir=None,
        )
        model.train()  # LoRA dropout on; the reference forward switches to eval itself
        if hf_checkpointing:
            set_checkpointing(model, True)
        try:
            trainer.fit(module, train_dataloaders=loader)
        finally:
            if hf_checkpointing:
                set_checkpointing(model, False)
            model.train(was_training)
            if next(model.parameters()).device != device:  # never silently elsewhere
                model.to(device)
    return trainer


def _candidates(model, trainer: pl.Trainer, snaps: PolicySnapshotCallback,
                reference_callback: ReferenceCallback | None) -> list[PolicyCandidate]:
    """C_k: the reference callback's, or the snapshots and the phase-final policy."""
    if reference_callback is not None:
        return list(reference_callback.candidates)
    candidates = [PolicyCandidate(name=f"step_{s}", state=st, step=s) for s, st in snaps.snapshots]
    candidates.append(PolicyCandidate(name="final", state=get_adapter_state(model, POLICY),
                                      step=trainer.global_step))
    return candidates


#: ``dpo.memory_budget_gb: auto`` on the CPU, in GB
CPU_MEMORY_BUDGET_GB = 6.0
#: ``dpo.memory_budget_gb: auto`` on CUDA: this share of the device's free memory
CUDA_MEMORY_SHARE = 0.5


def resolve_memory_budget(setting: float | str, device: torch.device | str,
                          free_bytes: int | None = None) -> float:
    """``dpo.memory_budget_gb`` in GB. A number is itself; ``auto`` is 6 GB on the CPU and on
    CUDA half the device's free memory (``free_bytes``, read from the device unless given):
    a fixed 6 GB would have an 80 GB GPU recompute every activation of the 1B's phase (an
    extra forward pass a step) to save memory it does not need."""
    if setting != "auto":
        return float(setting)
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_MEMORY_BUDGET_GB
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return CUDA_MEMORY_SHARE * free_bytes / 1e9


def estimate_step_gb(model: Any, batch: dict[str, Any], eager: bool = False) -> float:
    """Activation memory a shared-prompt step keeps for its backward pass, in GB: per token
    and decoder layer ~14 hidden-sized and 4 MLP-sized tensors, plus float32 logits over the
    vocabulary for the completion tokens, plus with ``eager`` attention each layer's
    attention weights (a head's queries by the keys they see, twice: weights and their
    softmax) (``python -m atlas.bench dpo`` prints it beside the measured peak RSS)."""
    cfg = model.config
    groups: list[PromptGroup] = batch["groups"]
    tokens = sum(len(g.prompt) + sum(len(c) for c in g.completions) for g in groups)
    scored = sum(len(c) for g in groups for c in g.completions)
    size = next(model.parameters()).element_size()
    per_token = cfg.num_hidden_layers * (14 * cfg.hidden_size + 4 * cfg.intermediate_size) * size
    attention = 0
    if eager:
        pairs = sum(len(g.prompt) ** 2 + sum(len(c) * (len(g.prompt) + len(c))
                                             for c in g.completions) for g in groups)
        attention = 2 * pairs * cfg.num_attention_heads * cfg.num_hidden_layers * size
    return (tokens * per_token + scored * cfg.vocab_size * 4 * 3 + attention) / 1e9


def set_checkpointing(model: Any, on: bool) -> None:
    """Recompute decoder layers in backward (non-reentrant: the frozen base needs no input
    grads). transformers 5 calls it activation checkpointing; older releases gradient
    checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_disable()


def _emit(logger: PhaseLogger, history: list[dict]) -> None:
    """Hand per-step records to the caller's logger.

    A Lightning logger is not given to the phase's Trainer: every phase starts a new Trainer
    at step 0 and would finalize the logger; the run's logger outlives the phases.
    """
    if logger is None:
        return
    if isinstance(logger, pl.loggers.Logger):
        for record in history:
            logger.log_metrics({f"dpo_step/{k}": float(v) for k, v in record.items()})
    elif callable(logger):
        for record in history:
            logger(dict(record))


def _cpu_state(obj: Any) -> Any:
    """Deep-copy an optimizer state to CPU tensors (safe to keep while training continues)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cpu_state(v) for v in obj]
    return obj
