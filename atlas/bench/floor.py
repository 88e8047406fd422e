"""The floor a bench compares its speed with: the time the device is busy computing.

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
