"""The attention kernel of a phase's training forwards (``dpo.attention``), and the model's own.

Why two: which kernel is faster depends on the pass. On the CPU, SDPA's flash kernel is the
fastest forward and a slow backward (``docs/bench/attention_backward_cpu_xeon.txt``), so a
training step may be faster on transformers' eager attention while a forward-only pass is
faster on SDPA. The reference table runs on the steps' kernel (DPO subtracts the two, so they
must round alike); the gate's passes compare policies among themselves and run on the
model's own kernel (``own_attention_kernel``), as generation does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the kernels ``dpo.attention`` names (``blocked`` is registered with transformers as
#: ``atlas.dpo.blocked_attention.NAME`` when first used)
KERNELS = ("sdpa", "eager", "blocked")


#: model families whose attention is plain causal softmax attention, as ``blocked`` computes
#: it (no sliding window, no logit soft-capping, no attention sinks)
BLOCKED_FAMILIES = frozenset({"llama"})


def resolve_attention(setting: str, model: Any) -> str:
    """``dpo.attention``: ``sdpa``, ``eager`` or ``blocked`` as given; ``auto``: ``blocked``
    on a CPU in bf16 for a Llama-family model, where SDPA's flash backward is the slow part
    of a step (the main command's first phase: DPO 52.9 s on SDPA, 41.2 s blocked), ``sdpa``
    elsewhere (in float32 on the CPU eager's gain did not survive a whole run; on CUDA flash
    is the faster backward too). docs/results.md, "Blocked attention for the steps"."""
    if setting not in (*KERNELS, "auto"):
        raise ValueError(f"dpo.attention must be sdpa, eager, blocked or auto, got {setting!r}")
    family = getattr(_base(model).config, "model_type", None)
    if setting == "blocked" and family not in BLOCKED_FAMILIES:
        raise ValueError(f"dpo.attention=blocked computes plain causal attention, which a "
                         f"{family!r} model may not use (it serves {sorted(BLOCKED_FAMILIES)}); "
                         f"set dpo.attention=auto, sdpa or eager")
    if setting != "auto":
        return setting
    weight = next(p for p in model.parameters())
    cpu_bf16 = weight.device.type == "cpu" and str(weight.dtype) == "torch.bfloat16"
    return "blocked" if cpu_bf16 and family in BLOCKED_FAMILIES else "sdpa"


#: where ``attention_kernel`` keeps the model's own kernel while another one is in force
_OWN = "_atlas_own_attention"


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def attention_kernel(model: Any, kind: str) -> Iterator[None]:
    """Run a block on the attention kernel ``kind`` (a transformers implementation, or a
    ``dpo.attention`` name), then put the one before it back."""
    if kind == "blocked":
        from atlas.dpo import blocked_attention  # registers the kernel with transformers

        kind = blocked_attention.NAME
    base = _base(model)
    before = base.config._attn_implementation
    if kind == before:
        yield
        return
    own = base.__dict__.get(_OWN)
    base.__dict__[_OWN] = before if own is None else own
    base.set_attn_implementation(kind)
    try:
        yield
    finally:
        base.set_attn_implementation(before)
        if own is None:
            base.__dict__.pop(_OWN, None)
        else:
            base.__dict__[_OWN] = own


@contextlib.contextmanager
def own_attention_kernel(model: Any) -> Iterator[None]:
    """Run a block on the model's own kernel even inside a phase on another one."""
    own = _base(model).__dict__.get(_OWN)
    with attention_kernel(model, own) if own is not None else contextlib.nullcontext():
        yield
