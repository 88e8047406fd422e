"""Measure the sandbox's known residual channels (docs/sandbox.md, "Known residual channels").

Why: the sandbox closes every channel it can name by construction; what stays open is timing
and the machine's shared state, which no system-call filter can close. A researcher needs to
know how much those carry, so each is measured here as an attacker would use it, through the
same ``Sandbox`` a run uses (the toy task, both workers), with a known random message:

- ``page_cache`` (to a *later* candidate): the sender reads one byte at chosen offsets of a
  large host file the runner may read (a shared library of the environment); the receiver,
  the next candidate, times its own read of each offset: a cached page answers fast.
- ``dentry`` (to a *later* candidate): the sender looks up (``stat``) chosen names that do
  not exist in a folder the runner may read, which leaves a negative directory entry in the
  kernel's cache; the receiver times its own lookup of each name: a cached miss answers fast.
- ``cpu`` (to a *concurrent* candidate): in time slots agreed in the code, the sender spins
  or sleeps; the receiver counts its own loop's iterations per slot.
- ``meminfo`` (to a *concurrent* candidate): the sender holds or frees memory per slot; the
  receiver reads ``MemAvailable`` of ``/proc/meminfo``.

Each receiver decodes with a threshold learnt from 16 known pilot bits, and reports its bits in
its failure message. The figure per channel is its capacity, ``n (1 - H(p))`` bits for ``n``
message bits at bit error rate ``p`` (a binary symmetric channel), per candidate pair and per
second of the candidates' own time.

    python scripts/residual_channels.py --mode bwrap --json docs/bench/residual_channels_bwrap.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

PILOT = [1, 0] * 8

SENDER_PAGE = '''
def policy(contexts, history, t, state):
    if t == 0:
        for (path, off), bit in zip({slots!r}, {bits!r}):
            if bit:
                with open(path, "rb") as f:
                    f.seek(off)
                    f.read(1)
    return 0
'''

RECEIVER_PAGE = '''import time


def policy(contexts, history, t, state):
    times = []
    for path, off in {slots!r}:
        with open(path, "rb") as f:
            f.seek(off)
            t0 = time.perf_counter()
            f.read(1)
            times.append(time.perf_counter() - t0)
    raise ValueError(" ".join("%.1f" % (x * 1e6) for x in times))
'''

SENDER_DENTRY = '''import os


def policy(contexts, history, t, state):
    if t == 0:
        for name, bit in zip({names!r}, {bits!r}):
            if bit:
                try:
                    os.stat(name)
                except OSError:
                    pass
    return 0
'''

RECEIVER_DENTRY = '''import os
import time


def policy(contexts, history, t, state):
    times = []
    for name in {names!r}:
        t0 = time.perf_counter()
        try:
            os.stat(name)
        except OSError:
            pass
        times.append(time.perf_counter() - t0)
    raise ValueError(" ".join("%.2f" % (x * 1e6) for x in times))
'''

#: both sides wait for the agreed start, then keep one bit per slot of ``slot`` seconds
SENDER_CPU = '''import time


def policy(contexts, history, t, state):
    if t == 0:
        while time.time() < {start!r}:
            time.sleep(0.001)
        for i, bit in enumerate({bits!r}):
            end = {start!r} + (i + 1) * {slot!r}
            if bit:
                while time.time() < end:
                    pass
            else:
                time.sleep(max(0.0, end - time.time()))
    return 0
'''

RECEIVER_CPU = '''import time


def policy(contexts, history, t, state):
    while time.time() < {start!r}:
        time.sleep(0.001)
    counts = []
    for i in range({n!r}):
        end = {start!r} + (i + 1) * {slot!r}
        c = 0
        while time.time() < end:
            c += 1
        counts.append(c)
    raise ValueError(" ".join(str(c // 100) for c in counts))  # a failure message holds 2000 chars
'''

SENDER_MEM = '''import time


def policy(contexts, history, t, state):
    if t == 0:
        while time.time() < {start!r}:
            time.sleep(0.001)
        for i, bit in enumerate({bits!r}):
            held = b"\\x01" * ({mb!r} << 20) if bit else b""
            time.sleep(max(0.0, {start!r} + (i + 1) * {slot!r} - time.time()))
            del held
    return 0
'''

RECEIVER_MEM = '''import time


def policy(contexts, history, t, state):
    out = []
    for i in range({n!r}):
        time.sleep(max(0.0, {start!r} + (i + 0.75) * {slot!r} - time.time()))
        with open("/proc/meminfo") as f:
            avail = [line for line in f if line.startswith("MemAvailable")][0]
        out.append(int(avail.split()[1]))
    raise ValueError(" ".join(str(x) for x in out))
'''


def entropy(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def decode(values: list[float]) -> list[int]:
    """Bits from the receiver's numbers: the threshold is the midpoint (in log space: times
    and counts span decades) of the pilot ones' and zeros' medians, the polarity theirs."""
    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2]

    logs = [math.log(max(v, 1e-9)) for v in values]
    ones = med([x for x, b in zip(logs, PILOT) if b])
    zeros = med([x for x, b in zip(logs, PILOT) if not b])
    cut = (ones + zeros) / 2
    return [int((x > cut) == (ones > zeros)) for x in logs[len(PILOT):]]


def numbers(message: str) -> list[float]:
    return [float(x) for x in message.split(":", 1)[1].split()]


def medians(us: list[float], bits: list[int]) -> dict[str, float]:
    """The receiver's median time (us) for the message bits the sender sent as 1 and as 0."""
    out = {}
    for bit in (1, 0):
        xs = sorted(u for u, b in zip(us[len(PILOT):], bits) if b == bit) or [math.nan]
        out[f"median_us_sent_{bit}"] = xs[len(xs) // 2]
    return out


def capacity(sent: list[int], got: list[int], seconds: float) -> dict[str, Any]:
    n = len(sent)
    if len(got) != n:
        raise ValueError(f"the receiver reported {len(got)} bits of {n}")
    errors = sum(a != b for a, b in zip(sent, got))
    bits = n * (1 - entropy(errors / n))
    return {"bits_sent": n, "errors": errors, "error_rate": errors / n,
            "capacity_bits": round(bits, 1), "seconds": round(seconds, 2),
            "bits_per_s": round(bits / seconds, 2) if seconds else None}


def mapped_files() -> set[str]:
    """Files some process has mapped now: their pages stay cached, an attacker avoids them."""
    out: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            out.update(line.split(None, 5)[5].strip() for line in maps.read_text().splitlines()
                       if len(line.split(None, 5)) == 6)
        except OSError:
            continue
    return out


def cold_files(sb: Any) -> list[Path]:
    """The shared libraries of what the sandbox's runners may read (its code view,
    ``Sandbox.view``, less its masks; not the system folders) that no process has mapped (their
    pages are cold), largest first."""
    from atlas.sandbox.view import SYSTEM_DIRS

    busy = mapped_files()
    roots = [Path(p) for p in sb.view.readable
             if not any(p == d or p.startswith(d + "/") for d in SYSTEM_DIRS)]
    masked = tuple(m + "/" for m in sb.view.masks)
    libs = {p for root in roots for p in ([root] if root.is_file() else root.rglob("*.so*"))
            if p.is_file() and ".so" in p.name and str(p) not in busy
            and not str(p).startswith(masked)}
    return sorted(libs, key=lambda p: -p.stat().st_size)


def drop_caches() -> bool:
    """A cold page cache to start from, where this process may ask for it (root)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def page_cache(sb: Any, rng: random.Random, n: int) -> dict[str, Any]:
    stride = 1 << 20  # beyond the kernel's read-ahead window (128 KiB), one read warms one slot
    slots: list[tuple[str, int]] = []
    files = []
    for path in cold_files(sb):  # the largest first, until there are slots enough
        count = (path.stat().st_size - stride) // stride
        if len(slots) >= len(PILOT) + n or count < 1:
            break
        slots += [(str(path), k * stride) for k in range(count)]
        files.append(f"{path} ({path.stat().st_size >> 20} MB)")
    if len(slots) < len(PILOT) + 8:
        return {"error": f"too few cold pages readable: {len(slots)} slots in {files}"}
    n = min(n, len(slots) - len(PILOT))
    picks = rng.sample(slots, len(PILOT) + n)
    picks = [(path, off + rng.randrange(4096)) for path, off in picks]
    bits = [rng.randrange(2) for _ in range(n)]
    dropped = drop_caches()
    t0 = time.perf_counter()
    sent = sb.evaluate(SENDER_PAGE.format(slots=picks, bits=PILOT + bits), {})
    got = sb.evaluate(RECEIVER_PAGE.format(slots=picks), {})
    t2 = time.perf_counter()
    if not sent.passed or "ValueError" not in got.message:
        return {"error": f"sender: {sent.message!r}; receiver: {got.message[:200]!r}"}
    us = numbers(got.message)
    decoded = decode(us)  # a page the sender read answers faster
    return {"files": files, "cold_start": dropped, "slots": len(slots), **medians(us, bits),
            **capacity(bits, decoded, t2 - t0)}


def dentry_folder(sb: Any) -> str:
    """A folder every runner may look names up in (the standard library's)."""
    return os.path.dirname(os.__file__)


def dentry(sb: Any, rng: random.Random, n: int) -> dict[str, Any]:
    folder = dentry_folder(sb)
    nonce = os.urandom(8).hex()  # names no earlier lookup made (not even a run with this seed)
    names = [os.path.join(folder, f"atlas-relay-{nonce}-{i}") for i in range(len(PILOT) + n)]
    bits = [rng.randrange(2) for _ in range(n)]
    t0 = time.perf_counter()
    sent = sb.evaluate(SENDER_DENTRY.format(names=names, bits=PILOT + bits), {})
    got = sb.evaluate(RECEIVER_DENTRY.format(names=names), {})
    t2 = time.perf_counter()
    if not sent.passed or "ValueError" not in got.message:
        return {"error": f"sender: {sent.message!r}; receiver: {got.message[:200]!r}"}
    us = numbers(got.message)
    decoded = decode(us)  # a name the sender looked up answers faster
    return {"folder": folder, **medians(us, bits), **capacity(bits, decoded, t2 - t0)}


def concurrent(sb: Any, rng: random.Random, n: int, slot: float, sender: str,
               receiver: str, **fmt: Any) -> dict[str, Any]:
    bits = [rng.randrange(2) for _ in range(n)]
    start = time.time() + 4.0  # both runners are up by then
    t0 = time.perf_counter()
    fs = sb.submit(sender.format(start=start, slot=slot, bits=PILOT + bits, **fmt), {})
    fr = sb.submit(receiver.format(start=start, slot=slot, n=len(PILOT) + n, **fmt), {})
    sent, got = fs.result(), fr.result()
    seconds = time.perf_counter() - t0
    if not sent.passed or "ValueError" not in got.message:
        return {"error": f"sender: {sent.message!r}; receiver: {got.message[:200]!r}"}
    values = numbers(got.message)
    decoded = decode(values)
    return {"slot_s": slot, "pilot_values": values[:len(PILOT)],
            **capacity(bits, decoded, seconds)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="auto", help="sandbox isolation: auto | bwrap | rlimits")
    ap.add_argument("--bits", type=int, default=256, help="message bits per channel")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--cpu-only", type=int, default=0, metavar="N",
                    help="measure only CPU contention at 10 ms slots, N times")
    ap.add_argument("--unbound", action="store_true",
                    help="runners share the cores (no isolation.core_sets): the channel as "
                         "it was before concurrent runners had cores of their own")
    args = ap.parse_args(argv)
    from atlas.agent.precision import cpu_model
    from atlas.sandbox import Confinement, Resources, Sandbox, TaskSpec, pool
    from atlas.sandbox.testing import TOY_RUNNER, TOY_SCORER

    if args.unbound:
        pool.core_sets = lambda workers, threads: (None, None)  # type: ignore[assignment]
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"cpu": cpu_model(), "kernel": platform.release(), "mode": args.mode,
                           "bound": not args.unbound}
    with Sandbox(TaskSpec(TOY_SCORER, {"steps": 2}, TOY_RUNNER, timeout_s=120),
                 resources=Resources(workers=2, memory_mb=1024),
                 confinement=Confinement(isolation=args.mode)) as sb:
        out["isolation"] = sb.isolation
        if args.cpu_only:
            out["cpu_0.01"] = [concurrent(sb, rng, args.bits, 0.01, SENDER_CPU, RECEIVER_CPU)
                               for _ in range(args.cpu_only)]
            print(json.dumps(out, indent=1))
            return
        out["page_cache"] = page_cache(sb, rng, args.bits)
        out["dentry"] = dentry(sb, rng, args.bits)
        for slot in (0.05, 0.01):
            out[f"cpu_{slot}"] = concurrent(sb, rng, args.bits, slot, SENDER_CPU, RECEIVER_CPU)
        out["meminfo_0.1"] = concurrent(sb, rng, min(args.bits, 64), 0.1, SENDER_MEM,
                                        RECEIVER_MEM, mb=256)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
