"""The decode step as one graph: fixed shapes, state in preallocated tensors, no host sync.

``sampling``'s default CPU loop compacts finished rows out of the batch and reads the sampled
tokens back every step (``.tolist()``): right for a CPU, where fewer rows is less work, but a
GPU then waits for the host once per token. Here one ``DecodeStep`` holds every tensor a
step touches (KV cache sized once, logits, tokens, uniforms, per-row temperature, a
``done`` mask) and its ``__call__`` samples one token per row from the last logits and runs
the model on it, updating that state in place:

- the batch keeps its shape: a finished row keeps decoding EOS and its output is ignored;
- uniforms come from a per (row, step) table drawn up front, so nothing is drawn inside;
- nothing reads a value back: the host looks at ``done`` and the new tokens every
  ``CHECK_EVERY`` steps (EOS, stop strings, callbacks) between steps.

So the very callable ``DecodeStep.__call__`` traces as one graph (``torch.compile(...,
fullgraph=True)`` in the CPU tests) and is what ``capture`` records as a CUDA graph. LoRA layers
run over merged weights held in fixed buffers (``static_weights``); a phase boundary copies the
new merged weights into them, so a captured graph replays with the new policy.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from atlas.agent.fastlinear import _active, _merged_weight, _stamp

CHECK_EVERY = 8  # decode steps between the host's looks at EOS and stop strings
#: how the step attends: "grouped" (each KV head's query heads folded into SDPA's query
#: length, so K and V are read once) or "layer" (the decoder layer's own forward, whose SDPA
#: call repeats K and V for every query head whenever a mask is given on CUDA: 4x the cache
#: traffic on the 1B). "grouped" needs a Llama-style layer; another runs "layer".
STEP_ATTENTION = "grouped"
#: on CUDA, record the step as a CUDA graph (``capture``); False runs the same step eagerly
#: there (``atlas.bench decode`` compares the two). Read at each call.
CUDA_GRAPH = True
_WEIGHTS_ATTR = "_atlas_static_weight"
#: how the CPU runs a ``DecodeStep`` (``step`` itself, eagerly, unless a test sets it, e.g. to
#: ``torch.compile(step.__call__, fullgraph=True)``)
CPU_RUNNER: Callable[[DecodeStep], Callable[[], None]] | None = None


class StepCache:
    """The KV cache the step writes: one buffer pair per layer, sized once per call, written
    at ``slot`` (a 0-d device tensor) with ``index_copy_``; attention reads whole buffers."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                 slot: torch.Tensor) -> None:
        self.keys, self.values, self.slot = keys, values, slot

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.slot.view(1), key_states.to(k.dtype))
        v.index_copy_(2, self.slot.view(1), value_states.to(v.dtype))
        return k, v


def llama_parts(model: nn.Module) -> dict[str, Any] | None:
    """The submodules the step runs (Llama-style decoder), or None for another architecture."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    core = getattr(base, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if core is None or not all(hasattr(core, n) for n in needed) or not hasattr(base, "lm_head"):
        return None
    attn = getattr(base.config, "_attn_implementation", "sdpa")
    if attn not in ("sdpa", "eager"):
        return None
    layers = list(core.layers[: base.config.num_hidden_layers])
    params = inspect.signature(layers[0].forward).parameters
    cache_kw = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params),
                    None)  # the name changed across transformers versions
    if cache_kw is None:
        return None
    return {"embed": core.embed_tokens, "layers": layers, "cache_kw": cache_kw,
            "norm": core.norm, "rotary": core.rotary_emb, "lm_head": base.lm_head,
            "rotate": _grouped_rotate(layers[0])}


_GROUPED_NEEDS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling",
                                "layer_idx"),
                  "": ("input_layernorm", "post_attention_layernorm", "mlp")}


def _grouped_rotate(layer: nn.Module) -> Callable | None:
    """The rotary function of a Llama-style layer, or None where ``grouped_layer`` cannot
    stand in for the layer's forward (another architecture)."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or type(layer).__name__ != "LlamaDecoderLayer":
        return None
    if not all(hasattr(layer, n) for n in _GROUPED_NEEDS[""]) or \
            not all(hasattr(attn, n) for n in _GROUPED_NEEDS["self_attn"]):
        return None
    return getattr(inspect.getmodule(type(attn)), "apply_rotary_pos_emb", None)


def grouped_layer(layer: nn.Module, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, ...],
                  cache: StepCache, valid: torch.Tensor, rotate: Callable) -> torch.Tensor:
    """A Llama decoder layer for one new token per row, its attention over the whole cache
    with the ``g`` query heads of each KV head as SDPA's query length: the same sums as the
    layer's forward, without the copy of K and V per query head."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)  # (rows, 1, hidden)
    rows, d = x.shape[0], attn.head_dim
    q = attn.q_proj(x).view(rows, 1, -1, d).transpose(1, 2)  # (rows, heads, 1, d)
    k = attn.k_proj(x).view(rows, 1, -1, d).transpose(1, 2)  # (rows, kv heads, 1, d)
    v = attn.v_proj(x).view(rows, 1, -1, d).transpose(1, 2)
    q, k = rotate(q, k, *cos_sin)
    keys, values = cache.update(k, v, attn.layer_idx)  # (rows, kv heads, capacity, d)
    # query head h reads KV head h // g (transformers' repeat_kv order)
    q = q.reshape(rows, keys.shape[1], -1, d).to(keys.dtype)  # (rows, kv heads, g, d)
    out = nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=valid[:, None, None, :], scale=attn.scaling)
    h = hidden + attn.o_proj(out.reshape(rows, 1, -1).to(hidden.dtype))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def pick_tokens(logits: torch.Tensor, scale: torch.Tensor, greedy: torch.Tensor, top_p: float,
                u: torch.Tensor) -> torch.Tensor:
    """``sampling.next_tokens`` without a host sync: greedy rows (``greedy``) take the argmax,
    the others nucleus-sample with their uniform ``u`` ([rows, 1]). The nucleus comes from a
    full sort (``next_tokens`` tries a top-k first, which needs a look at the values): the
    same tokens, whatever the nucleus's size."""
    probs = torch.softmax(logits.float() / scale, dim=-1)
    if top_p >= 1.0:
        cdf = probs.cumsum(dim=-1)
        picked = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=probs.shape[-1] - 1)
        picked = picked.squeeze(1)
    else:
        vals, idx = probs.sort(dim=-1, descending=True)
        cum = vals.cumsum(dim=-1)
        vals = vals * ((cum - vals) < top_p)
        cdf = vals.cumsum(dim=-1)
        choice = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=vals.shape[-1] - 1)
        picked = idx.gather(1, choice).squeeze(1)
    return torch.where(greedy, logits.argmax(dim=-1), picked)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The sizes a ``DecodeStep`` allocates once: one value per buffer dimension, so a
    step (and a CUDA graph captured from it) is reused exactly when its shape is equal.

    ``layers_kv``: per layer, (KV heads, value head size, key head size)."""

    rows: int
    capacity: int  # cache slots: the prompts' width plus the new tokens (rounded up on CUDA)
    steps: int  # new tokens per call
    layers_kv: tuple[tuple[int, int, int], ...]
    kv_dtype: torch.dtype
    vocab: int


class DecodeStep:
    """Every tensor one decode step reads or writes, and the step itself (``__call__``).

    Shapes are fixed at construction (``StepShape``); ``load`` fills them for a call, so one
    instance (and a CUDA graph captured from it) serves every call of that shape.
    """

    def __init__(self, parts: dict[str, Any], shape: StepShape, eos: list[int], top_p: float,
                 device: torch.device, attention: str | None = None) -> None:
        rows, capacity, steps = shape.rows, shape.capacity, shape.steps
        layers_kv, kv_dtype, vocab = shape.layers_kv, shape.kv_dtype, shape.vocab
        self.shape = shape
        self.parts, self.top_p = parts, float(top_p)
        wanted = attention or STEP_ATTENTION
        if wanted not in ("grouped", "layer"):
            raise ValueError(f"step attention {wanted!r} must be grouped or layer")
        #: how this step attends (``STEP_ATTENTION``; "layer" where "grouped" cannot run)
        self.attention = "grouped" if wanted == "grouped" and parts.get("rotate") else "layer"
        self.rows, self.capacity, self.steps = rows, capacity, steps
        dev = {"device": device}
        self.keys = [torch.zeros((rows, h, capacity, d), dtype=kv_dtype, **dev)
                     for h, _, d in layers_kv]
        self.values = [torch.zeros((rows, h, capacity, dv), dtype=kv_dtype, **dev)
                       for h, dv, _ in layers_kv]
        self.slot = torch.zeros((), dtype=torch.long, **dev)  # cache slot the step writes
        self.step = torch.zeros((), dtype=torch.long, **dev)  # column of ``tokens`` it writes
        self.cache = StepCache(self.keys, self.values, self.slot)
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, **dev)  # keys to attend
        self.pos = torch.zeros((rows, 1), dtype=torch.long, **dev)
        self.logits = torch.zeros((rows, vocab), dtype=torch.float32, **dev)
        self.tokens = torch.zeros((rows, steps), dtype=torch.long, **dev)
        self.uniforms = torch.zeros((rows, steps), dtype=torch.float32, **dev)
        self.scale = torch.ones((rows, 1), dtype=torch.float32, **dev)
        self.greedy = torch.zeros(rows, dtype=torch.bool, **dev)
        self.done = torch.zeros(rows, dtype=torch.bool, **dev)
        self.eos = torch.tensor(eos, dtype=torch.long, **dev)
        self.eos0 = torch.full((rows,), eos[0], dtype=torch.long, **dev)

    def load(self, keys: list[torch.Tensor], values: list[torch.Tensor], prompt_mask: torch.Tensor,
             logits: torch.Tensor, temps: torch.Tensor, uniforms: torch.Tensor) -> None:
        """Fill the state for one call: the prompts' KV (width ``prompt_mask.shape[1]``),
        their last logits, per-row temperatures (<= 0: greedy) and the uniform table."""
        width = prompt_mask.shape[1]
        for buf, src in zip(self.keys, keys):
            buf[:, :, :width].copy_(src)
        for buf, src in zip(self.values, values):
            buf[:, :, :width].copy_(src)
        self.valid.zero_()
        self.valid[:, :width].copy_(prompt_mask.bool())
        self.pos.copy_(prompt_mask.sum(-1, keepdim=True))
        self.logits.copy_(logits)
        self.uniforms.copy_(uniforms[:, : self.steps])
        temps = temps.to(self.scale).reshape(-1, 1)
        self.greedy.copy_(temps[:, 0] <= 0)
        self.scale.copy_(torch.where(temps > 0, temps, torch.ones_like(temps)))
        self.done.zero_()
        self.tokens.zero_()
        self.step.fill_(0)
        self.slot.fill_(width)

    def __call__(self) -> None:
        """Sample one token per row from ``logits``, record it, and run the model on it."""
        u = self.uniforms.index_select(1, self.step.view(1))
        tok = pick_tokens(self.logits, self.scale, self.greedy, self.top_p, u)
        tok = torch.where(self.done, self.eos0, tok)  # a finished row keeps decoding EOS
        self.tokens.index_copy_(1, self.step.view(1), tok[:, None])
        self.done.logical_or_((tok[:, None] == self.eos[None, :]).any(-1))  # isin may sync
        self.valid.index_fill_(1, self.slot.view(1), True)
        p = self.parts
        hidden = p["embed"](tok[:, None])
        embeddings = p["rotary"](hidden, position_ids=self.pos)
        mask = self.valid[:, None, None, :]
        for layer in p["layers"]:
            if self.attention == "grouped":
                hidden = grouped_layer(layer, hidden, embeddings, self.cache, self.valid,
                                       p["rotate"])
                continue
            out = layer(hidden, attention_mask=mask, position_ids=self.pos, use_cache=True,
                        position_embeddings=embeddings, **{p["cache_kw"]: self.cache})
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = p["norm"](hidden)
        self.logits.copy_(p["lm_head"](hidden[:, -1]).float())
        self.pos.add_(1)
        self.step.add_(1)
        self.slot.add_(1)


def _is_lora_linear(module: nn.Module) -> bool:
    return (hasattr(module, "base_layer") and hasattr(module, "lora_A")
            and isinstance(getattr(module, "base_layer", None), nn.Linear))


def _static_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    base = module.base_layer
    return nn.functional.linear(x.to(base.weight.dtype), module.__dict__[_WEIGHTS_ATTR],
                                base.bias)


@contextmanager
def static_weights(model: nn.Module) -> Iterator[tuple[int, int]]:
    """Run each LoRA layer as one linear layer over a buffer holding its merged weight.

    The buffer is allocated once per layer and refreshed in place (``copy_``) on entry with
    whatever adapter is active now (none, the policy, the reference), so a graph captured
    against it replays with the current weights: a phase boundary costs one copy per layer,
    never a recapture. Yields how many buffers were allocated (a graph captured before must be
    captured again) and how many were refreshed in place."""

    patched, refreshed, allocated = [], 0, 0
    with torch.no_grad():
        for module in model.modules():
            if not _is_lora_linear(module) or "forward" in module.__dict__:
                continue
            names = _active(module)
            if names is None:
                continue
            base = module.base_layer
            weight = _merged_weight(module, names, pack=False) if names else base.weight
            source = (names, _stamp(base.weight, *(t for a in names for t in (
                module.lora_A[a].weight, module.lora_B[a].weight))))
            buf = module.__dict__.get(_WEIGHTS_ATTR)
            if buf is None or buf.shape != weight.shape or buf.dtype != weight.dtype \
                    or buf.device != weight.device:
                module.__dict__[_WEIGHTS_ATTR] = weight.detach().clone()
                allocated += 1
            elif module.__dict__.get(_WEIGHTS_ATTR + "_src") != source:
                buf.copy_(weight)
                refreshed += 1
            module.__dict__[_WEIGHTS_ATTR + "_src"] = source
            module.forward = functools.partial(_static_forward, module)
            patched.append(module)
    try:
        yield allocated, refreshed
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)


def warm_up(step: DecodeStep, times: int = 2) -> None:
    """Run ``step()`` ``times`` times, each at the loaded position: a warm-up that walked on
    would index past a call of fewer steps (``max_new_tokens`` 1) or past the cache's end.
    It still writes tokens and KV: ``load`` again before the real steps."""
    for _ in range(times):
        step()
        step.step.sub_(1)
        step.slot.sub_(1)
        step.pos.sub_(1)


def capture(step: DecodeStep) -> torch.cuda.CUDAGraph:
    """Record ``step()`` as a CUDA graph after a warm-up on a side stream (which changes the
    state: ``load`` it again before replaying)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm_up(step)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
