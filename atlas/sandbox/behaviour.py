"""A program's behaviour fingerprint: how it plays one public input, the same for everyone.

Why: each program faces hidden inputs of its own (``atlas.sandbox.inputs``), so two programs
that behave the same (a rename, a reordering) no longer score the same, and a score can no
longer tell ``atlas.novelty`` that a program repeats another's behaviour. So a task's scorer
also lets the program play a *public* input (drawn from ``PUBLIC_SEED``, never from the
secret), identical for every program, and hashes what it played there (``fingerprint``):
programs that behave the same have the same fingerprint whatever their own hidden inputs.
The scorer computes it from the actions it received, so the candidate does not report it;
it travels as ``Evaluation.behaviour``, not as a metric, and never enters the score.

The public input is played by a second copy of the program (``Twin``) with random streams
of its own, so that it changes nothing of the scored play: module-level state (a counter, a
cache) and the draws of ``random`` and ``numpy.random`` that the scored copy sees are those
it would see without the public input, and what the twin plays depends on the program and
the public input only, not on the hidden inputs the scored copy faced. A twin that raises
stops playing (the fingerprint records where); the scored play goes on.

What it cannot promise: the public input is public, so a program can recognise it and play
it differently from its hidden inputs. It gains no score by that (the score is the hidden
inputs' alone), only the label ``new`` for a copy built to differ there.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Iterable
from hashlib import blake2b
from typing import Any, TypeVar

from atlas.sandbox.candidate import CANDIDATE_MODULE, load_candidate

#: the seed every public input is drawn from: public on purpose (any fixed number would do;
#: it only has to differ from nothing secret and be the same for every program and run)
PUBLIC_SEED = 56_056
#: what ``Evaluation.behaviour`` may hold: lowercase hex digits (``fingerprint``'s digest)
BEHAVIOUR = re.compile(r"[0-9a-f]{8,128}")

T = TypeVar("T")

# bound at import, before any candidate runs: a candidate may reassign what it can reach
_getstate, _setstate = random.getstate, random.setstate


def fingerprint(kind: str, actions: Iterable[int], stopped_at: int | None = None) -> str:
    """32 hex digits of the actions played on a task's public input (``kind`` names the
    task and the input's form); ``stopped_at`` the step where the program raised there."""
    h = blake2b(digest_size=16, person=b"atlas-behaviour")
    h.update(kind.encode("utf-8") + b"\0")
    h.update(",".join(str(int(a)) for a in actions).encode("ascii"))
    if stopped_at is not None:
        h.update(f"\0stopped:{int(stopped_at)}".encode("ascii"))
    return h.hexdigest()


def check_behaviour(value: Any) -> str | None:
    """``value`` if it is None or a fingerprint (``BEHAVIOUR``); ValueError otherwise."""
    if value is None or (isinstance(value, str) and BEHAVIOUR.fullmatch(value)):
        return value
    raise ValueError(f"behaviour must be null or 8-128 lowercase hex digits, not "
                     f"{repr(value)[:40]}")


def _numpy_random() -> Any:
    numpy = sys.modules.get("numpy")
    return None if numpy is None else numpy.random


class Twin:
    """A second copy of the candidate, loaded and called with random streams of its own.

    Made in the runner where the random generators have just been seeded (the regime's
    seed, ``runner.seed_candidate_rngs``): the twin starts from that state too, so it plays
    as the program would alone. ``sys.modules["candidate"]`` is the twin's module while
    the twin runs and the scored copy's otherwise."""

    def __init__(self, code: str, entry_point: str) -> None:
        self.code, self.entry_point = code, entry_point
        nprand = _numpy_random()
        self._np_get = None if nprand is None else nprand.get_state
        self._np_set = None if nprand is None else nprand.set_state
        self._streams = self._save()  # the seeded state: where the twin's streams begin
        self._fn: Callable[..., Any] | None = None
        self._module: Any = None

    def _save(self) -> tuple[Any, Any]:
        return _getstate(), (self._np_get() if self._np_get is not None else None)

    def _restore(self, streams: tuple[Any, Any]) -> None:
        _setstate(streams[0])
        if self._np_set is not None and streams[1] is not None:
            self._np_set(streams[1])

    def within(self, play: Callable[[Callable[..., Any]], T]) -> T:
        """``play(entry point)`` with the twin's random streams and module swapped in (the
        twin loaded on first use) and the scored copy's swapped back, whatever it raises."""
        scored, module = self._save(), sys.modules.get(CANDIDATE_MODULE)
        self._restore(self._streams)
        try:
            if self._fn is None:
                self._fn = load_candidate(self.code, self.entry_point)
                self._module = sys.modules.get(CANDIDATE_MODULE)
            elif self._module is not None:
                sys.modules[CANDIDATE_MODULE] = self._module
            return play(self._fn)
        finally:
            self._streams = self._save()
            self._restore(scored)
            if module is not None:
                sys.modules[CANDIDATE_MODULE] = module
