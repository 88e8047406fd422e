"""Whether a server answers, within a bounded time, and if not, the true reason.

Why one probe: a model hub or a W&B server that cannot be had must stop a run at start in one
line within seconds, and that line must say what happened. A name that cannot be looked up
and a connection refused fail at once; only a silent host takes the whole timeout. (The hub's
line used to say "did not answer within 3 s" when the lookup had failed at once.) The probe
runs in a thread: ``getaddrinfo`` ignores socket timeouts.
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.error
import urllib.request
from urllib.parse import urlparse


def _why(exc: BaseException, where: str, timeout: float) -> str:
    reason = getattr(exc, "reason", exc) if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return f"{where} cannot be looked up ({reason.strerror or reason}: no network or DNS?)"
    if isinstance(reason, ConnectionRefusedError):
        return f"{where} refused the connection (nothing listens there)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"{where} did not answer within {timeout:g} s"
    if isinstance(reason, ssl.SSLError):
        return f"{where} answered, but its TLS failed ({reason})"
    if isinstance(reason, OSError) and reason.strerror:
        return f"{where} cannot be reached ({reason.strerror})"
    return f"{where} cannot be reached ({type(reason).__name__}: {reason})"


def unreachable(url: str, timeout: float, *, http: bool = False) -> str | None:
    """None when the server at ``url`` answers within ``timeout`` seconds: accepts a TCP
    connection, or with ``http`` answers a GET with any HTTP status. Else one clause saying
    why not, starting with the URL's host and port."""
    parts = urlparse(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{parts.scheme}://{parts.hostname}:{port}"
    found: list[str | None] = []

    def probe() -> None:
        try:
            if http:
                try:
                    urllib.request.urlopen(url, timeout=timeout).close()  # noqa: S310 - the user's URL
                except urllib.error.HTTPError:
                    pass  # a status, even 401 or 404, is an answer
            else:
                socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
            found.append(None)
        except Exception as exc:  # noqa: BLE001 - every failure is a reason to report
            found.append(_why(exc, where, timeout))

    thread = threading.Thread(target=probe, daemon=True, name="atlas-reach")
    thread.start()
    thread.join(timeout)
    return found[0] if found else f"{where} did not answer within {timeout:g} s"
