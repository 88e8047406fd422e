"""The pipe between a trusted scorer and the untrusted runner of one candidate.

Why a tiny JSON message protocol: the scorer interprets every byte the runner sends (nothing
is unpickled, no object crosses), so the runner can only answer the questions the task asks.
A runner reports its own failure with ``{"error": kind, "message": ...}``; the scorer turns
that, a malformed message, or EOF into ``RunnerFailed``. A runner can fail itself, never pass.
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Any

from atlas.sandbox import protocol
from atlas.types import FailureKind

#: failure kinds a runner may claim for itself (never ``ok``, ``tampered`` or ``blocked``: the
#: scorer's side decides those)
RUNNER_KINDS = frozenset(k.value for k in FailureKind) - {"ok", "tampered", "blocked"}


class RunnerFailed(Exception):
    """The runner failed, died, or broke the protocol; ``kind`` classifies it."""

    def __init__(self, kind: FailureKind | str, message: str) -> None:
        super().__init__(message)
        self.kind = kind.value if isinstance(kind, FailureKind) else str(kind)
        self.message = message


class RunnerEnded(RunnerFailed):
    """The runner's end of the pipe closed without a word."""


class Link:
    """One end of a runner conversation: ``send`` / ``recv`` JSON objects over two fds."""

    def __init__(self, read_fd: int, write_fd: int, *, trusted: bool) -> None:
        self.read_fd, self.write_fd, self.trusted = read_fd, write_fd, trusted
        self._buf = protocol.FrameBuffer()
        #: the runner's guard violations: once one is recorded (even if the program caught
        #: the error), the next message is that failure instead of an answer
        self.violations: list[str] = []

    def send(self, obj: dict[str, Any]) -> None:
        if self.violations and "error" not in obj:
            obj = {"error": FailureKind.EXCEPTION.value, "message": self.violations[0]}
        try:
            protocol.write_frame(self.write_fd, obj)
        except (BrokenPipeError, OSError) as exc:
            if self.trusted:
                # a runner that failed before reading (no entry point, a syntax error) said why
                # and exited while this large message was on its way: its word, not the pipe's
                raise self._said_before_exit() or RunnerFailed(
                    FailureKind.KILLED, f"the program's process ended early "
                                        f"({type(exc).__name__})") from exc
            raise

    def _said_before_exit(self) -> RunnerFailed | None:
        """The failure a runner reported before its end of the pipe closed, if it did (not
        an end of file, nor a second of silence)."""
        try:
            self.recv(timeout_s=1.0)
        except RunnerEnded:
            return None
        except RunnerFailed as failed:
            return None if failed.kind == FailureKind.TIMEOUT.value else failed
        except OSError:
            return None
        return None

    def recv(self, timeout_s: float = math.inf) -> dict[str, Any]:
        """The next message; on the trusted side a runner error/EOF raises ``RunnerFailed``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                frame = self._buf.pop()
            except (protocol.ProtocolError, ValueError) as exc:
                raise self._tampered(exc) from exc
            if frame is not None:
                break
            if timeout_s != math.inf:  # the pool's watchdog bounds the infinite case
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise RunnerFailed(FailureKind.TIMEOUT, "the program did not answer in time")
                ready, _, _ = select.select([self.read_fd], [], [], min(wait, 1.0))
                if not ready:
                    continue
            chunk = protocol._os_read(self.read_fd, 1 << 16)
            if not chunk:
                raise RunnerEnded(FailureKind.EXCEPTION, "the program's process ended "
                                  "before answering (it exited, crashed or was killed)")
            try:
                self._buf.feed(chunk)
            except protocol.ProtocolError as exc:
                raise self._tampered(exc) from exc
        if self.trusted and "error" in frame:
            kind = frame.get("error")
            message = frame.get("message")
            if not isinstance(kind, str) or kind not in RUNNER_KINDS \
                    or not isinstance(message, str):
                raise RunnerFailed(FailureKind.TAMPERED, "the program sent a malformed failure")
            raise RunnerFailed(kind, message[:2000])
        return frame

    def _tampered(self, exc: Exception) -> RunnerFailed:
        return RunnerFailed(FailureKind.TAMPERED, f"the program broke the runner protocol ({exc})")

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
