"""Inference linear layers for generation: LoRA merged into a weight copy, oneDNN-packed on CPU bf16.

On CPU, ``F.linear`` in bf16 re-packs the weight into oneDNN's blocked (AMX) layout on every
call; for a 135M model decoding a few rows at a time that re-packing costs as much as the
matmul itself. Packing once (``torch.ops.mkldnn._reorder_linear_weight``) and calling
``_linear_pointwise`` gives the same outputs up to bf16 rounding about 1.5x faster. LoRA layers are run with
their active adapter merged into the packed weight (no per-token LoRA matmuls in fp32).

On every other device and dtype, ``merged_lora`` runs each LoRA layer as one plain linear
layer over a merged copy of its weight. Only used inside these blocks (generation, no
grad): training keeps peft's layers.
Packed copies are cached on the module and rebuilt when a weight changes (``Tensor._version``
moves on every in-place update: optimiser steps, ``set_adapter_state``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

_CACHE_ATTR = "_atlas_packed"
_SUPPORTED: bool | None = None


def packing_supported() -> bool:
    """True when this torch build runs oneDNN's packed bf16 linear (checked once, by trying it)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        try:
            w = torch.randn(8, 16, dtype=torch.bfloat16)
            x = torch.randn(2, 16, dtype=torch.bfloat16)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            _SUPPORTED = bool(torch.allclose(y.float(), nn.functional.linear(x, w).float(),
                                             atol=1e-2, rtol=1e-2))
        except (RuntimeError, AttributeError):
            _SUPPORTED = False
    return _SUPPORTED


def _stamp(*tensors: torch.Tensor) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in tensors)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 16)


def _cached(module: nn.Module, key: object, stamp: tuple, build, pack: bool = True
            ) -> torch.Tensor:
    cache: dict = module.__dict__.setdefault(_CACHE_ATTR, {})
    hit = cache.get(key)
    if hit is None or hit[0] != stamp:
        weight = build()
        hit = (stamp, _pack(weight) if pack else weight)
        cache[key] = hit
    return hit[1]


def _plain_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed = _cached(module, "base", _stamp(module.weight), lambda: module.weight)
    bias = None if module.bias is None else module.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x.to(module.weight.dtype), packed, bias, "none", [], "")


def _active(module: nn.Module) -> tuple[str, ...] | None:
    """The LoRA adapters a layer's forward would apply, or None when only peft's own forward
    is right (extra arguments, merged by peft, a LoRA variant, dropout in training)."""
    if module.merged or getattr(module, "lora_variant", None):
        return None
    if module.disable_adapters:
        return ()
    names = tuple(a for a in module.active_adapters if a in module.lora_A)
    if module.training and any(module.lora_dropout[a].p > 0 for a in names
                               if hasattr(module.lora_dropout[a], "p")):
        return None
    return names


def _merged_weight(module: nn.Module, names: tuple[str, ...], pack: bool) -> torch.Tensor:
    """The layer's weight with ``names`` folded in, built once per change of any of them."""
    base = module.base_layer
    tensors = [base.weight] + [t for a in names
                               for t in (module.lora_A[a].weight, module.lora_B[a].weight)]

    def merged() -> torch.Tensor:
        w = base.weight.detach().float()
        for a in names:
            w = w + module.get_delta_weight(a).float()
        return w.to(base.weight.dtype)

    return _cached(module, (pack, names), _stamp(*tensors), merged, pack=pack)


def _lora_forward(module: nn.Module, original, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A peft LoRA Linear with its active adapters merged into one packed weight."""
    names = None if args or kwargs else _active(module)
    if names is None:
        return original(x, *args, **kwargs)
    base = module.base_layer
    packed = _merged_weight(module, names, pack=True)
    bias = None if base.bias is None else base.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x.to(base.weight.dtype), packed, bias, "none", [], "")


def _merged_forward(module: nn.Module, original, x: torch.Tensor, *args, **kwargs
                    ) -> torch.Tensor:
    """A peft LoRA Linear as one plain linear layer over its merged weight (any device)."""
    names = None if args or kwargs else _active(module)
    if not names:  # no adapter to fold in (or peft's own forward is the right one)
        return original(x, *args, **kwargs)
    base = module.base_layer
    weight = _merged_weight(module, names, pack=False)
    return nn.functional.linear(x.to(base.weight.dtype), weight, base.bias)


def _is_lora_linear(module: nn.Module) -> bool:
    return (hasattr(module, "base_layer") and hasattr(module, "lora_A")
            and isinstance(getattr(module, "base_layer", None), nn.Linear))


@contextmanager
def packed_linears(model: nn.Module, enabled: bool = True, merge_lora: bool = True
                   ) -> Iterator[bool]:
    """Run bf16 CPU linear layers of ``model`` on packed weights inside the block.

    ``merge_lora=False`` packs only the frozen base weights and leaves peft's LoRA terms as
    they are (the gate, whose likelihood ratios a bf16-rounded merged weight would blur).
    Outputs equal the unpatched model's bit for bit on small shapes, not over long bf16
    prefills (SmolLM2, 700-token prompts: up to ~1.4 nats in a sequence's log-prob), so both
    sides of a ratio must run on the same path (the gate packs all; DPO packs none). Yields whether packing is active (False: wrong
    device/dtype, unsupported build, or ``enabled=False``), so callers can report which path
    ran. Use only under no_grad.
    """
    patched: list[nn.Module] = []
    active = enabled and packing_supported()
    if active:
        lora_bases = set()
        for module in model.modules():
            if "forward" in module.__dict__:  # already patched by an enclosing block
                continue
            if _is_lora_linear(module) and merge_lora:
                w = module.base_layer.weight
                if w.device.type == "cpu" and w.dtype == torch.bfloat16:
                    module.forward = functools.partial(_lora_forward, module, module.forward)
                    patched.append(module)
                lora_bases.add(id(module.base_layer))
        for module in model.modules():
            if (type(module) is nn.Linear and id(module) not in lora_bases
                    and "forward" not in module.__dict__
                    and module.weight.device.type == "cpu" and module.weight.dtype == torch.bfloat16):
                module.forward = functools.partial(_plain_forward, module)
                patched.append(module)
        active = bool(patched)
    try:
        yield active
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)


@contextmanager
def merged_lora(model: nn.Module, enabled: bool = True) -> Iterator[bool]:
    """Run every LoRA layer of ``model`` not already patched (by ``packed_linears``) as one
    linear layer over a copy of its weight with the active adapter folded in.

    The copy is built when a layer first runs under an adapter and rebuilt only when a weight
    changes (a phase boundary), so decoding pays one matmul per layer instead of peft's three
    and its Python dispatch. A copy, not peft's in-place merge: unmerging a bf16 weight does
    not give the base weight back bit for bit. Yields whether any layer was patched.
    """
    patched: list[nn.Module] = []
    if enabled:
        for module in model.modules():
            if _is_lora_linear(module) and "forward" not in module.__dict__:
                module.forward = functools.partial(_merged_forward, module, module.forward)
                patched.append(module)
    try:
        yield bool(patched)
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)


def drop_packed(model: nn.Module) -> None:
    """Free every cached packed weight (they are rebuilt on the next packed call)."""
    for module in model.modules():
        module.__dict__.pop(_CACHE_ATTR, None)
