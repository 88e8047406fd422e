"""A long message cut to the one line a run stops with or a report shows."""

from __future__ import annotations


def cause(message: str, limit: int = 300) -> str:
    """``message`` cut to about ``limit`` characters on one line, keeping its first line and
    its end: a traceback's cause is its last line, a failure's summary its first."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    head, last = lines[0], lines[-1]
    text = head if len(lines) == 1 else f"{head} ... {last}"
    if len(text) <= limit:
        return text
    if len(lines) == 1:
        half = (limit - 5) // 2
        return f"{head[:half]} ... {head[-half:]}"
    tail = min(len(last), limit // 2)
    return f"{head[:max(0, limit - tail - 5)]} ... {last[-tail:]}"
