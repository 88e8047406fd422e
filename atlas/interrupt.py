"""SIGTERM stops a run at once; the checkpoint of the last finished round stays for resume.

Why: SLURM (at a time limit or ``scancel``) and ``kill`` send SIGTERM and, after a grace
period, SIGKILL. Python ends on SIGTERM only while no handler is installed, and Lightning
installs one during DPO that merely sets a flag, so without ours a run in a phase keeps going
until the SIGKILL (observed). Turning SIGTERM into an exception stops the run inside the current
operation; sandbox workers and the W&B run are closed by the ``finally`` blocks on the way
out, and re-running the same command resumes from the last finished round.
Where SIGTERM already has an owner (submitit requeues on USR2 and ignores SIGTERM on
purpose), it is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM arrives; exit status 128 + SIGTERM (143)."""

    def __init__(self) -> None:
        super().__init__(128 + int(signal.SIGTERM))


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def stop_on_sigterm() -> Iterator[bool]:
    """Install the handler for the block; yields whether it was installed."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield False
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)
