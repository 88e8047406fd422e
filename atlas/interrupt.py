"""SIGTERM and SIGINT (Ctrl-C) stop a run at once; the checkpoint of the last finished round
stays for resume.

Why: SLURM (at a time limit or ``scancel``) and ``kill`` send SIGTERM and, after a grace
period, SIGKILL. Python ends on SIGTERM only while no handler is installed, and Lightning
installs one during DPO that merely sets a flag, so without ours a run in a phase keeps going
until the SIGKILL (observed). Ctrl-C raises ``KeyboardInterrupt``, which Lightning catches inside
``fit`` and turns into ``sys.exit(1)`` without a word, and which elsewhere ends in a long
traceback. Turning both signals into a ``SystemExit`` subclass stops the run inside the
current operation the same way (Lightning re-raises it after its teardown); sandbox workers
and the W&B run are closed by the ``finally`` blocks on the way out, the caller says so in
one line, and re-running the same command resumes from the last finished round.
A stop that arrives while a checkpoint is written is held until the write ends (``held``):
torch's writer, cut mid-record, replaces the stop with an error of its own, and the round just
finished would be lost for a write that takes a second.
Where a signal already has an owner (submitit requeues on USR2 and ignores SIGTERM on
purpose; a program embedding atlas may handle SIGINT itself), it is left alone.
One stop, one line: a second Ctrl-C (or SIGTERM) while the first stop closes the sandbox and
the logger is absorbed, a third ends the process at once (``FORCE_AT``), and once the stop
has left the run (``settle``) further ones are ignored while the process exits with the first
stop's status, never a ``KeyboardInterrupt`` traceback from the interpreter's shutdown.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType


class Stopped(SystemExit):
    """Raised in the main thread when a stop signal arrives; exit status 128 + the signal."""

    signal_name = ""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))


class Terminated(Stopped):
    """SIGTERM (``kill``, SLURM): exit status 143."""

    signal_name = "SIGTERM"

    def __init__(self) -> None:
        super().__init__(signal.SIGTERM)


class Interrupted(Stopped):
    """SIGINT (Ctrl-C): exit status 130."""

    signal_name = "SIGINT"

    def __init__(self) -> None:
        super().__init__(signal.SIGINT)


#: while a ``held`` block runs: the stops that arrived in it, raised when it ends
_arrived: list[type[Stopped]] | None = None
#: once a stop was raised: the signals that arrived since (its stop is under way)
_since_stop: list[int] | None = None
#: the stop signal whose arrival, counted from the first, ends the process at once
FORCE_AT = 3

_RAISES = {signal.SIGTERM: (Terminated, signal.SIG_DFL),
           signal.SIGINT: (Interrupted, signal.default_int_handler)}


@contextmanager
def _stop_on(signum: signal.Signals) -> Iterator[bool]:
    exc, default = _RAISES[signum]
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signum) is not default):
        yield False
        return

    def _raise(num: int, frame: FrameType | None) -> None:
        if _since_stop is not None:  # the first stop is under way: no second one
            _since_stop.append(num)
            if len(_since_stop) + 1 >= FORCE_AT:
                os._exit(128 + num)
            return
        if _arrived is not None:
            _arrived.append(exc)
            return
        _stopping()
        raise exc()

    previous = signal.signal(signum, _raise)
    try:
        yield True
    finally:
        signal.signal(signum, previous)


def _stopping() -> None:
    global _since_stop
    _since_stop = []


@contextmanager
def stop_on_signals() -> Iterator[dict[str, bool]]:
    """Install the handlers for the block; yields which ones were installed, by name."""
    global _since_stop
    try:
        with ExitStack() as stack:
            yield {s.name: stack.enter_context(_stop_on(s)) for s in _RAISES}
    finally:
        _since_stop = None


def settle() -> None:
    """A stop has left the run and the process is ending: from now on stop signals are
    ignored. Why: a Ctrl-C during the interpreter's shutdown printed a ``KeyboardInterrupt``
    traceback, or (once Python had reset its handlers) killed the process with status -2
    instead of the stop's 130. ``SIG_IGN`` is the one disposition shutdown leaves in place."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _RAISES:
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def held() -> Iterator[None]:
    """Hold stop signals for a short block that must not be cut in half (a checkpoint write);
    the first stop that arrived is raised when the block ends. An error of the block's own
    goes on as it is."""
    global _arrived
    if _arrived is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _arrived = []
    try:
        yield
    finally:
        arrived, _arrived = _arrived, None
    if arrived:
        _stopping()
        raise arrived[0]()
