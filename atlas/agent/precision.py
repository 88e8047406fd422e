"""Choose the research agent's precision per machine (``model.dtype: auto``).

bf16 halves memory traffic, but only a CPU that computes it natively (AVX512-BF16 or AMX)
turns that into speed: on an AVX2-only CPU torch emulates bf16 matmuls and they run ~4x
slower than fp32 (measured here: (8x576)@(576x1536) 1.87 ms bf16 vs 0.46 ms fp32). So:

- an explicit ``model.dtype`` (bfloat16 | float32 | float16) always wins;
- CUDA: bf16;
- CPU with AVX512-BF16 or AMX: bf16;
- any other CPU: a one-off micro-benchmark of the agent's typical matmul in both precisions,
  cached per machine (CPU model, capability, torch version) under ``model.cache_dir``; bf16
  only when it is clearly faster there, fp32 otherwise.

The choice and its reason go to the run log and ``results.json``; a resumed run reads them
back from its run folder (``precision.json``) so it never changes precision mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from atlas.atomic import write_text_atomic

CHOICES = ("auto", "bfloat16", "float32", "float16")
#: bf16 must beat fp32 by this factor in the micro-benchmark to be chosen on a non-native CPU
BF16_MARGIN = 1.1
RUN_FILE = "precision.json"


@dataclass(frozen=True)
class Precision:
    """The dtype a run computes in, and why it was chosen."""

    dtype: str
    reason: str
    fp32_ms: float | None = None  # micro-benchmark figures, when one ran
    bf16_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_features() -> dict[str, bool | str]:
    """What torch's CPU kernels can use here: the dispatch level and the bf16 instructions."""
    cpu = torch.cpu
    probe = {name: getattr(cpu, f"_is_{name}_supported", lambda: False)
             for name in ("avx2", "avx512", "avx512_bf16", "amx_tile", "vnni")}
    out: dict[str, bool | str] = {"capability": torch.backends.cpu.get_cpu_capability()}
    for name, fn in probe.items():
        try:
            out[name] = bool(fn())
        except RuntimeError:
            out[name] = False
    return out


def native_bf16() -> bool:
    """True when this CPU computes bf16 matmuls in hardware (AVX512-BF16 or AMX)."""
    f = cpu_features()
    return bool(f["avx512_bf16"] or f["amx_tile"])


def _time_matmul(dtype: torch.dtype, reps: int = 30) -> float:
    """Median ms of the agent's typical decode matmul, (8x576)@(576x1536), on one thread."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 576, generator=g).to(dtype)
    w = torch.randn(1536, 576, generator=g).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            torch.nn.functional.linear(x, w)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(4):
                torch.nn.functional.linear(x, w)
            times.append((time.perf_counter() - t0) / 4 * 1e3)
    finally:
        torch.set_num_threads(before)
    times.sort()
    return times[len(times) // 2]


def _machine_key() -> str:
    feats = cpu_features()
    text = json.dumps([cpu_model(), feats, torch.__version__, platform.machine()], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def measured_cpu_precision(cache_dir: str | os.PathLike | None) -> Precision:
    """fp32 or bf16 by a micro-benchmark, cached per machine in ``cache_dir`` (if writable)."""
    file = None
    if cache_dir:
        file = Path(os.path.expanduser(str(cache_dir))) / f"precision-{_machine_key()}.json"
        try:
            return Precision(**json.loads(file.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    fp32, bf16 = _time_matmul(torch.float32), _time_matmul(torch.bfloat16)
    caps = cpu_features()["capability"]
    if fp32 / bf16 >= BF16_MARGIN:
        choice = Precision("bfloat16", f"{caps} CPU without native bf16, but a bf16 matmul ran "
                           f"{fp32 / bf16:.1f}x faster than fp32 here", fp32, bf16)
    else:
        choice = Precision("float32", f"{caps} CPU without native bf16 (no AVX512-BF16/AMX): a "
                           f"bf16 matmul ran {bf16 / fp32:.1f}x slower than fp32 here", fp32, bf16)
    if file is not None:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(file, json.dumps(choice.to_dict()))
        except OSError:
            pass  # a read-only cache only costs the benchmark again next time
    return choice


def choose_precision(requested: str, device: str, cache_dir: str | os.PathLike | None = None
                     ) -> Precision:
    """Resolve ``model.dtype`` for ``device`` (rules in the module docstring)."""
    requested = str(requested)
    if requested not in CHOICES:
        raise ValueError(f"model.dtype={requested!r} is not supported; use one of {list(CHOICES)}")
    if requested != "auto":
        return Precision(requested, "set by model.dtype")
    if str(device).startswith("cuda"):
        return Precision("bfloat16", "CUDA device")
    if native_bf16():
        return Precision("bfloat16", "CPU computes bf16 natively (AVX512-BF16/AMX)")
    return measured_cpu_precision(cache_dir)


def run_precision(run_dir: str | os.PathLike, requested: str, device: str,
                  cache_dir: str | os.PathLike | None, resume: bool) -> Precision:
    """The run's precision: the one recorded in ``run_dir`` when resuming an ``auto`` run,
    else a fresh choice, which is then recorded there (only when it differs from the file's:
    a re-run writes nothing, so a run folder on a full disk can still be resumed)."""
    file = Path(run_dir) / RUN_FILE
    if resume and str(requested) == "auto":
        try:
            recorded = Precision(**json.loads(file.read_text()))
            return Precision(recorded.dtype, f"{recorded.reason} (kept from the run's start)",
                             recorded.fp32_ms, recorded.bf16_ms)
        except (OSError, ValueError, TypeError):
            pass
    choice = choose_precision(requested, device, cache_dir)
    text = json.dumps(choice.to_dict()) + "\n"
    try:
        unchanged = file.read_text() == text
    except OSError:
        unchanged = False
    if not unchanged:
        file.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(file, text)
    return choice
