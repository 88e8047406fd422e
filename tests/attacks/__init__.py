"""How an attack program's result is judged.

Each attack program's first line declares the outcomes that mean it was contained:
``# outcome: honest | blocked(kill, tgkill) | exception(can't start new thread) | tampered``.
``honest``: it passed with the honest score of its fallback (an attack that got anything
plays another arm); ``blocked(calls)``: it failed as ``blocked``, the message naming every
listed call (the kernel saw it make them); any other kind, with an optional text its message
must hold. Anything else is a test failure: a passed run with another score got through, and
an ``exception`` the attack did not declare means it died before it could try (did not run),
for example on ``os.listdir("/proc")``. Attacks aim at fixed targets (``TARGET_PIDS``: the
scorer's and the zygote's host pids, filled in by the test), never only at what they can
list, so an attack that can name nothing still makes its calls.
"""

from __future__ import annotations

import re
from pathlib import Path

from atlas.types import Evaluation

_OUTCOME = re.compile(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*$")


def outcomes(path: Path) -> list[tuple[str, str]]:
    """The (kind, detail) pairs an attack declares on its first line."""
    first = path.read_text().splitlines()[0]
    if not first.startswith("# outcome:"):
        raise AssertionError(f"{path} lacks its first line '# outcome: ...'")
    out = []
    for part in first.split(":", 1)[1].split("|"):
        m = _OUTCOME.match(part)
        if m is None:
            raise AssertionError(f"{path}: cannot read the outcome {part!r}")
        out.append((m.group(1), (m.group(2) or "").strip()))
    return out


def verdict(path: Path, ev: Evaluation, honest: float) -> str | None:
    """None where ``ev`` is an outcome ``path`` declares; else why the test fails."""
    declared = outcomes(path)
    if ev.passed:
        if ("honest", "") in declared and ev.score == honest:
            return None
        return (f"{path.stem} GOT THROUGH: it scored {ev.score!r}, the honest fallback "
                f"scores {honest!r} (declared {declared})")
    for kind, detail in declared:
        if kind != ev.failure_kind:
            continue
        if kind == "blocked":
            missing = [c.strip() for c in detail.split(",") if c.strip()
                       and c.strip() not in ev.message]
            if not missing:
                return None
        elif detail in ev.message:
            return None
    if ev.failure_kind == "exception":
        return (f"{path.stem} DID NOT RUN: it died before its attack could be judged "
                f"(declared {declared}): {ev.message[:600]}")
    return f"{path.stem}: {ev.failure_kind} is no declared outcome {declared}: {ev.message[:600]}"


def fill(code: str, **values: object) -> str:
    """``code`` with each placeholder (``TARGET_PIDS``, ``SECRET_PATH``...) filled in."""
    for key, value in values.items():
        code = code.replace(key, value if isinstance(value, str) else repr(value))
    return code
