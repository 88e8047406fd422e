"""The floors a bench compares its speed with.

The *arithmetic floor* of a part is its least multiply-adds (``macs_per_token``) at the
machine's matrix-multiply rate at the model's layer shapes (``linear_rate``): no
implementation on this machine does the part's work in less. The *busy floor* is the time
the device is busy computing:

On CUDA: the summed time of the GPU kernels and copies the torch profiler records (what the
kernels alone would take if the GPU never waited for the host). On the CPU there is no such
split, so the floor is the profiler's self CPU time of ``aten::`` ops: time inside torch's
operators, Python, dispatch and sampling bookkeeping excluded. A ratio (wall / floor) of 1.0
means nothing but the operators ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: SmolLM2-135M's shape (its config.json; a test checks them against the shipped model)
SMOLLM2 = {"hidden": 576, "intermediate": 1536, "layers": 30, "kv": 192, "vocab": 49152}


def model_dims(config: Any) -> dict[str, int]:
    """The shape ``macs_per_token`` counts, from a transformers Llama-style config."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    return {"hidden": config.hidden_size, "intermediate": config.intermediate_size,
            "layers": config.num_hidden_layers,
            "kv": config.hidden_size // heads * kv_heads, "vocab": config.vocab_size}


def macs_per_token(dims: dict[str, int]) -> tuple[int, int]:
    """Multiply-adds of one token through the decoder layers' linear maps, and through the
    LM head (attention's own products: ``attention_macs``)."""
    h, i = dims["hidden"], dims["intermediate"]
    return dims["layers"] * (2 * h * h + 2 * h * dims["kv"] + 3 * h * i), h * dims["vocab"]


def attention_macs(dims: dict[str, int], attended: float) -> float:
    """Multiply-adds of attention's two products (scores, then the weighted values) over
    ``attended`` (query, key) pairs (``atlas.dpo.batching.attended_pairs``): per layer and
    pair, a head-width dot product and a head-width update in every head. Causal: a key
    after its query is never counted, whatever a kernel computes and throws away."""
    return 2 * dims["layers"] * dims["hidden"] * attended


def linear_rate(dtype: str, dims: dict[str, int] = SMOLLM2, device: str = "cpu") -> float:
    """Multiply-adds a second of one linear layer on ``device``: per shape of the model's and
    150- and 600-row inputs (a completion and a prompt), the best of 5 timings of 10 calls
    (the machine's rate, not its noise); the median over the shapes."""
    import time

    import torch

    dt = getattr(torch, dtype)
    cuda = device.startswith("cuda")
    rates = []
    h, i = dims["hidden"], dims["intermediate"]
    for rows in (150, 600):
        for k, n in ((h, h), (h, i), (i, h), (h, dims["vocab"])):
            x = torch.randn(rows, k, dtype=dt, device=device)
            w = torch.randn(n, k, dtype=dt, device=device)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            best = float("inf")
            for _ in range(5):
                if cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(10):
                    torch.nn.functional.linear(x, w)
                if cuda:
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t)
            rates.append(10 * rows * k * n / best)
    return sorted(rates)[len(rates) // 2]
CUDA_KIND = "CUDA kernel time (torch.profiler)"
CPU_KIND = "self CPU time of aten:: ops (torch.profiler)"


@dataclass(frozen=True)
class Busy:
    """Busy seconds of one profiled call and what they measure."""

    seconds: float
    kind: str
    #: the device's busiest kernels (name, seconds), most first: where a step's time goes
    top: tuple[tuple[str, float], ...] = ()


def busy_seconds(events: Any, device: str) -> float:
    """Busy seconds in a profiler's ``events()``: device events on CUDA, the self time of
    aten ops on the CPU (each op counted once: self time excludes its children)."""
    from torch.autograd import DeviceType

    total_us = 0.0
    for e in events:
        if device.startswith("cuda"):
            if e.device_type == DeviceType.CUDA:
                total_us += e.time_range.elapsed_us()
        elif e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
            total_us += e.self_cpu_time_total
    return total_us / 1e6


def top_kernels(events: Any, n: int = 8) -> tuple[tuple[str, float], ...]:
    """The ``n`` CUDA kernels (by name) that kept the device busiest, with their seconds."""
    from torch.autograd import DeviceType

    by: dict[str, float] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA:
            by[e.name] = by.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e6
    return tuple(sorted(by.items(), key=lambda kv: -kv[1])[:n])


def profile_busy(fn: Callable[[], T], device: str) -> tuple[T, Busy]:
    """Run ``fn`` once under the torch profiler; return its result and the busy time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    return out, Busy(busy_seconds(events, device), CUDA_KIND if cuda else CPU_KIND,
                     top_kernels(events) if cuda else ())


def ratio_text(wall_s: float, floor_s: float, kind: str) -> str:
    """``wall / floor`` as printed beside tokens/s."""
    if floor_s <= 0:
        return f"floor n/a ({kind} recorded nothing)"
    return (f"{wall_s * 1e3:.2f} ms vs floor {floor_s * 1e3:.2f} ms = {wall_s / floor_s:.2f}x "
            f"the floor ({kind})")
