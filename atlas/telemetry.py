"""Everything a run reports: ``events.jsonl``, ``programs.jsonl`` and W&B (through Lightning).

The JSONL files are the source of truth (figures and tables are recomputed from them);
W&B mirrors them. Files are append-only and their byte offsets are checkpointed, so a
resumed run truncates what the crashed round wrote and never duplicates a line.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from atlas.types import Program

log = logging.getLogger("atlas.telemetry")

EVENTS = "events.jsonl"
PROGRAMS = "programs.jsonl"


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (the JSON standard has no NaN/inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _clean(value.item())
    return value


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), allow_nan=False)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``a/b/c`` keys (what W&B charts)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


class Telemetry:
    """Writes the run's JSONL files and mirrors them to an optional Lightning logger."""

    def __init__(self, run_dir: Path, logger: Any | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = logger
        self._events = open(self.run_dir / EVENTS, "a", encoding="utf-8")  # noqa: SIM115
        self._programs = open(self.run_dir / PROGRAMS, "a", encoding="utf-8")  # noqa: SIM115
        self._step = 0

    # -- resume -----------------------------------------------------------------------
    def offsets(self) -> dict[str, int]:
        """Byte sizes of the JSONL files (checkpointed with the round)."""
        self.flush()
        return {EVENTS: self._events.tell(), PROGRAMS: self._programs.tell(), "step": self._step}

    def truncate_to(self, offsets: dict[str, int]) -> None:
        """Drop whatever a crashed round appended after the last checkpoint."""
        for name, fh in ((EVENTS, self._events), (PROGRAMS, self._programs)):
            fh.flush()
            fh.truncate(int(offsets.get(name, 0)))
            fh.seek(0, os.SEEK_END)
        self._step = int(offsets.get("step", 0))

    # -- writing ----------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"event": kind, **fields}
        self._events.write(dumps(record) + "\n")
        self._events.flush()
        if self.logger is not None and kind in ("round", "phase", "seed"):
            self._step += 1
            metrics = flatten({k: v for k, v in record.items() if k != "event"}, prefix=kind)
            if metrics:
                self.logger.log_metrics(metrics, step=self._step)
        return record

    def programs(self, programs: list[Program]) -> None:
        for p in programs:
            self._programs.write(dumps(p.to_dict()) + "\n")
        self._programs.flush()

    def flush(self) -> None:
        for fh in (self._events, self._programs):
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        self.flush()
        self._events.close()
        self._programs.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file written by ``Telemetry`` (a torn last line is ignored)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("ignoring a torn line in %s", path)
    return rows
