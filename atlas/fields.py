"""Field checks for ``Task`` classes, which validate their own ``task.*`` fields.

The config groups' schemas live in ``atlas.schema`` (pydantic); a task is the extension point
(``Task(**cfg.task)``, also from packages outside atlas: docs/architecture.md, "Tasks"), so it
keeps these small helpers, which phrase errors the way ``atlas.schema`` does: the field's full
name (``task.n_steps``), the value it got, and what to write instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def check_known_fields(known: Iterable[str], data: Mapping[str, Any], group: str,
                       label: str | None = None, hint: str = "") -> None:
    """ValueError naming the first unknown key of ``data`` and listing the known ones."""
    known = sorted(known)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown {label or group} field(s) {unknown}: {group}.{unknown[0]} is "
                         f"not a known field; remove it or use one of {known}{hint}")


def require(ok: bool, group: str, name: str, value: Any, fix: str) -> None:
    """ValueError ``group.name=value is invalid: fix`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{group}.{name}={value!r} is invalid: {fix}")


def number(group: str, name: str, value: Any, *, low: float | None = None,
           low_open: bool = False, integer: bool = False) -> float | int:
    """Coerce one knob to a finite number, failing with the field name and the fix."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{group}.{name} must be {kind}, got {value!r}; set {group}.{name}=<{kind}>")
    if not math.isfinite(value):
        raise ValueError(f"{group}.{name} must be finite, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise TypeError(f"{group}.{name} must be an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if low is not None and (value <= low if low_open else value < low):
        sign = ">" if low_open else ">="
        raise ValueError(f"{group}.{name} must be {sign} {low}, got {value!r}")
    return value
