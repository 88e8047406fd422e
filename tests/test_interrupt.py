"""Stop signals: raised as ``Stopped`` at once, held while a checkpoint is written."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from atlas import checkpoint
from atlas.interrupt import Interrupted, Terminated, held, stop_on_signals


@pytest.fixture(autouse=True)
def _python_s_own_sigint():
    """Python's own SIGINT handler in force, as in a foreground shell: a suite started as a
    background job (`cmd &`, nohup) inherits SIGINT ignored, which ``stop_on_signals``
    rightly leaves alone (the last test)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


class _SignalsWhilePickled:
    """Sends ``signum`` to this process while torch pickles it: a stop in mid-write."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __reduce__(self) -> tuple:
        os.kill(os.getpid(), self.signum)
        return (int, (7,))


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, Interrupted),
                                            (signal.SIGTERM, Terminated)])
def test_a_stop_in_mid_checkpoint_waits_for_the_write(tmp_path: Path, signum: int,
                                                      raised: type) -> None:
    state = {"next_round": 3, "payload": list(range(1000)), "late": _SignalsWhilePickled(signum)}
    with stop_on_signals() as installed:
        assert installed == {"SIGTERM": True, "SIGINT": True}
        with pytest.raises(raised) as info:
            checkpoint.save(tmp_path, state)
    assert info.value.code == 128 + signum
    saved = checkpoint.load(tmp_path)
    assert saved is not None and saved["next_round"] == 3 and saved["late"] == 7
    assert saved["payload"] == list(range(1000))
    assert checkpoint.stale_tmp_files(tmp_path) == []


def test_outside_a_held_block_a_stop_is_raised_at_once_and_the_handlers_go() -> None:
    before = signal.getsignal(signal.SIGINT)
    reached = []
    with stop_on_signals(), pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the kill")  # the handler raises before this line
    assert reached == []
    assert signal.getsignal(signal.SIGINT) is before


def test_a_held_block_raises_its_own_error_and_then_stops_at_once() -> None:
    with stop_on_signals():
        with pytest.raises(ValueError), held():
            os.kill(os.getpid(), signal.SIGINT)
            raise ValueError("the block's own error")
        with pytest.raises(Interrupted):  # nothing is held any more
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the stop was held after the block")  # the handler raises first


def test_held_blocks_nest_and_raise_once_at_the_outer_end() -> None:
    order = []
    with stop_on_signals(), pytest.raises(Terminated):
        with held():
            with held():
                os.kill(os.getpid(), signal.SIGTERM)
                order.append("inner end")
            order.append("outer end")
    assert order == ["inner end", "outer end"]


def test_an_ignored_sigint_stays_ignored() -> None:
    """A run started with SIGINT ignored (nohup, a background job) keeps it so, as Python
    itself does; SIGTERM still stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with stop_on_signals() as installed:
        assert installed == {"SIGTERM": True, "SIGINT": False}
        os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing is raised
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_second_stop_while_the_first_stops_the_run_is_absorbed() -> None:
    """One stop, one line: a Ctrl-C that arrives while the first stop closes the run's parts
    (the ``finally`` blocks on the way out) does not raise again."""
    closed = []
    with stop_on_signals(), pytest.raises(Interrupted) as info:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # while the sandbox closes: absorbed
            closed.append("the sandbox")
    assert closed == ["the sandbox"] and info.value.code == 130
    with stop_on_signals(), pytest.raises(Interrupted):  # the next run stops as the first did
        os.kill(os.getpid(), signal.SIGINT)


def test_after_a_stop_left_the_run_further_signals_are_ignored() -> None:
    from atlas.interrupt import settle

    settle()
    try:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # nothing is raised while the process exits
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
