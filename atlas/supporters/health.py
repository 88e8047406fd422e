"""Whether a supporter's server answers: one health request at start, a circuit breaker after.

Why: a wrong, dead or hung ``base_url`` used to show only as WARNING lines while every call
waited its ``timeout_s`` and fell back; a run with a hung server took six times as long and
its records looked like any other. Now a server that does not answer at start stops the run
with one line naming the role, the URL and the fix (``supporters.on_unreachable=fallback``
runs on the embedded rules instead, and says so), and a server that stops answering during a
run is not asked again for ``breaker_cooldown_s`` once ``breaker_failures`` calls in a row
found it down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from atlas.schema import ConfigError
from atlas.supporters.config import RoleConfig

log = logging.getLogger("atlas.supporters")

#: fallback causes that say the server did not answer (a bad answer is the model's, not the
#: server's: it does not open the breaker)
DOWN_CAUSES = frozenset({"unreachable", "timeout", "http_error"})

_DOWN: dict[str, str] = {}  # base_url -> why its health request failed (on_unreachable=fallback)
_LOCK = threading.Lock()


def probe(base_url: str, timeout_s: float) -> str | None:
    """Why ``GET <base_url>/models`` (every OpenAI-compatible server has it) did not answer
    with a model list within ``timeout_s``; None when it did."""
    url = base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - the user's URL
            body = resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return f"answered HTTP {exc.code} to GET {url} (is base_url the API root, e.g. " \
               f"http://host:port/v1?)"
    except (TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"did not answer GET {url} within {timeout_s:g} s"
        return f"cannot be reached ({reason})"
    try:
        json.loads(body)
    except ValueError:
        return f"answered GET {url} with something that is not JSON (is base_url an " \
               f"OpenAI-compatible API root?)"
    return None


def check_supporters(roles: Mapping[str, RoleConfig]) -> dict[str, str]:
    """One health request per server the ``openai`` roles use; ``{role: why}`` for the roles
    whose server did not answer and that asked to fall back (they start with an open breaker).

    ConfigError (one line naming the roles, the URL and the fix) when a server did not answer
    and one of its roles has ``on_unreachable=stop``.
    """
    by_url: dict[str, list[str]] = {}
    for role, cfg in roles.items():
        if cfg.backend == "openai":
            by_url.setdefault(cfg.base_url, []).append(role)
    down: dict[str, str] = {}
    for url, names in by_url.items():
        timeout = min(roles[r].health_timeout_s for r in names)
        why = probe(url, timeout)
        with _LOCK:
            _DOWN.pop(url, None)
        if why is None:
            continue
        stop = [r for r in names if roles[r].on_unreachable == "stop"]
        if stop:
            key = "supporters" if len(stop) == len(roles) else f"supporters.{stop[0]}"
            raise ConfigError(
                f"supporter {', '.join(stop)}: the server at {url} {why}; start it, or fix "
                f"{key}.base_url, or set {key}.on_unreachable=fallback to run on the embedded "
                f"rules")
        with _LOCK:
            _DOWN[url] = why
        for r in names:
            down[r] = why
        log.warning("supporter %s: the server at %s %s; the embedded rules answer (on_unreachable="
                    "fallback) and it is asked again every %g s", ", ".join(names), url, why,
                    roles[names[0]].breaker_cooldown_s)
    return down


def found_down(base_url: str) -> str | None:
    """Why the start's health request to ``base_url`` failed; None if it answered or none ran."""
    with _LOCK:
        return _DOWN.get(base_url)


class Breaker:
    """A role's circuit breaker: ``failures`` server failures in a row open it; while open the
    role falls back without asking; after ``cooldown_s`` one call asks again (a success closes
    it, a failure opens it for another ``cooldown_s``). It says so once per opening."""

    def __init__(self, role: str, failures: int, cooldown_s: float) -> None:
        self.role = role
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.in_a_row = 0
        self.open_until: float | None = None
        self.openings = 0

    def allows(self) -> bool:
        """Whether the next call may ask the server."""
        return self.open_until is None or time.monotonic() >= self.open_until

    def open(self, why: str) -> None:
        self.open_until = time.monotonic() + self.cooldown_s
        self.openings += 1
        (log.warning if self.openings == 1 else log.info)("supporter %s: %s; the embedded rules answer for the next %g s "
                    "(supporters.breaker_cooldown_s), then it is asked again",
                    self.role, why, self.cooldown_s)

    def record(self, cause: str | None) -> None:
        """The outcome of a call that asked the server (``cause``: its fallback cause or None)."""
        if cause not in DOWN_CAUSES:  # an answer, good or bad: the server is up
            if self.open_until is not None:
                log.info("supporter %s: the server answers again", self.role)
            self.in_a_row = 0
            self.open_until = None
            return
        self.in_a_row += 1
        if self.open_until is not None:  # the retry after the cool-down failed too
            self.open(f"the server still does not answer ({cause})")
        elif self.failures and self.in_a_row >= self.failures:
            self.open(f"{self.in_a_row} calls in a row got no answer (last: {cause})")
