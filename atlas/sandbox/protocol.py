"""Framing between the main process and a sandbox worker (and a worker and its child).

Why its own pipes and JSON: candidate stdout/stderr never share a channel with results, and
the parent never unpickles anything a compromised worker wrote (unpickling is code
execution). Each frame is ``MAGIC + 4-byte length + UTF-8 JSON``; every result echoes a
per-request random nonce, so bytes a program writes blindly cannot pass for a result.
The os functions are bound at import time so that the guard's patches never touch them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

from atlas.sandbox.behaviour import check_behaviour
from atlas.types import Evaluation, FailureKind

MAGIC = b"ATL1"
HEADER = struct.Struct(">4sI")
MAX_FRAME = 8 << 20

_os_write = os.write
_os_read = os.read
_KINDS = frozenset(k.value for k in FailureKind)


class ProtocolError(RuntimeError):
    """A frame was malformed, oversized, or failed validation."""


def encode(obj: dict[str, Any]) -> bytes:
    """One frame for ``obj`` (JSON; NaN allowed in metrics). A message holding anything but
    plain JSON types (a numpy array or number) is a TypeError with the fix."""
    try:
        body = json.dumps(obj).encode("utf-8")
    except TypeError as exc:
        raise TypeError(f"a message must hold plain JSON types (dict, list, str, int, float, "
                        f"bool, None): {exc}; convert numpy arrays with .tolist() and numpy "
                        f"numbers with float() or int()") from None
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(MAGIC, len(body)) + body


def write_frame(fd: int, obj: dict[str, Any]) -> None:
    """Write one whole frame to ``fd`` (blocking)."""
    view = memoryview(encode(obj))
    while view:
        view = view[_os_write(fd, view):]


def read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None on EOF before any byte; raises on a short read."""
    chunks, got = [], 0
    while got < n:
        chunk = _os_read(fd, n - got)
        if not chunk:
            if got == 0:
                return None
            raise ProtocolError(f"EOF after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """Blocking read of one frame; None on a clean EOF."""
    header = read_exact(fd, HEADER.size)
    if header is None:
        return None
    return _decode_body(header, lambda n: read_exact(fd, n))


def _decode_body(header: bytes, read: Any) -> dict[str, Any]:
    magic, size = HEADER.unpack(header)
    if magic != MAGIC or size > MAX_FRAME:
        raise ProtocolError(f"bad frame header {header!r}")
    body = read(size)
    if body is None or len(body) != size:
        raise ProtocolError("truncated frame")
    try:
        obj = json.loads(body.decode("utf-8"))
    except RecursionError:  # deeply nested lists: not a ValueError, would crash the reader
        raise ProtocolError("a frame nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return obj


class FrameBuffer:
    """Incremental decoder for non-blocking readers (the parent's watchdog loop)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > MAX_FRAME + HEADER.size:
            raise ProtocolError("more data than one frame may hold")

    def pop(self) -> dict[str, Any] | None:
        """The next complete frame, or None if more bytes are needed."""
        if len(self._buf) < HEADER.size:
            return None
        magic, size = HEADER.unpack(bytes(self._buf[:HEADER.size]))
        if magic != MAGIC or size > MAX_FRAME:
            raise ProtocolError(f"bad frame header {bytes(self._buf[:HEADER.size])!r}")
        if len(self._buf) < HEADER.size + size:
            return None
        header, body = bytes(self._buf[:HEADER.size]), bytes(self._buf[HEADER.size:][:size])
        del self._buf[:HEADER.size + size]
        return _decode_body(header, lambda n: body)

    def pending(self) -> int:
        return len(self._buf)


def decode_frames(data: bytes) -> list[dict[str, Any]]:
    """All frames in ``data``; raises if anything is left over or malformed."""
    buf, frames = FrameBuffer(), []
    buf.feed(data)
    while (frame := buf.pop()) is not None:
        frames.append(frame)
    if buf.pending():
        raise ProtocolError(f"{buf.pending()} stray bytes after the frames")
    return frames


def validate_evaluation(d: Any) -> Evaluation:
    """Rebuild an ``Evaluation`` from untrusted JSON, enforcing its invariants."""
    if not isinstance(d, dict):
        raise ProtocolError("evaluation must be an object")
    kind = d.get("failure_kind", FailureKind.OK.value)
    if kind not in _KINDS:
        raise ProtocolError(f"unknown failure_kind {kind!r}")
    passed = d.get("passed")
    if not isinstance(passed, bool):
        raise ProtocolError("passed must be a bool")
    score = d.get("score")
    if score is not None and (not isinstance(score, (int, float)) or isinstance(score, bool)):
        raise ProtocolError("score must be a number or null")
    metrics = d.get("metrics") or {}
    if not isinstance(metrics, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in metrics.items()):
        raise ProtocolError("metrics must map str to numbers")
    message = d.get("message", "")
    if not isinstance(message, str):
        raise ProtocolError("message must be a string")
    try:
        behaviour = check_behaviour(d.get("behaviour"))
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    ev = Evaluation(score=-math.inf if score is None else float(score), passed=passed,
                    failure_kind=kind, message=message[:2000],
                    metrics={k: float(v) for k, v in metrics.items()}, behaviour=behaviour)
    if ev.passed and (kind != FailureKind.OK.value or not math.isfinite(ev.score)):
        raise ProtocolError("a passed evaluation needs failure_kind 'ok' and a finite score")
    if not ev.passed:
        ev.score, ev.behaviour = -math.inf, None
    return ev
