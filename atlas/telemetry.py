"""Everything a run reports: ``events.jsonl``, ``programs.jsonl`` and W&B (through Lightning).

The JSONL files are the source of truth (figures and tables are recomputed from them);
W&B mirrors them. Files are append-only and their byte offsets are checkpointed, so a
resumed run truncates what the crashed round wrote and never duplicates a line.

W&B layout (see ``logger_metrics``): ``round/*`` charts are plotted against ``round/round``
(valid rate, best, ``round/islands/<i>/{best,median,size,coverage}``, failure counts, and two
chart-only series: ``round/best_agent``, the agent-only best as ``results.json`` counts it,
and ``round/supporters/*``, what the exploration supporter did that round),
``phase/*`` against ``phase/phase`` (scores, pairs, ``phase/dpo/*``,
``phase/gate/{kl,gain,lower_bound,...}``, ``phase/gate/insufficient_evidence`` as 0/1,
``phase/promoted``, ``phase/vetoed``, ``phase/strategist/values/*``,
``phase/interventions/<knob>`` as 0/1); at the end of the run the tables ``programs`` and
``phases`` and ``results/*`` summary keys. ``python -m atlas.dashboard`` lays them out.
Tables are rebuilt from the JSONL files, so a resumed run's tables hold every program once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from atlas.knobs import KNOBS
from atlas.novelty import program_key
from atlas.types import INSUFFICIENT_EVIDENCE, Program

log = logging.getLogger("atlas.telemetry")

EVENTS = "events.jsonl"
PROGRAMS = "programs.jsonl"
TAIL_BYTES = 1 << 20  # the end of each JSONL file a checkpoint keeps, to repair a torn line


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


# columns of the W&B tables logged at the end of a run
PROGRAM_COLUMNS = ("id", "island", "round", "phase", "source", "score", "passed", "failure_kind",
                   "code")
PHASE_COLUMNS = ("phase", "round", "skipped", "reason", "pairs", "gate_reason", "gain", "kl",
                 "promoted", "vetoed", "interventions")
# what flatten() drops (lists) but a chart needs: strategist knob changes as 0/1 series


def logger_metrics(kind: str, record: dict[str, Any]) -> dict[str, float]:
    """The chart values of one ``round`` / ``phase`` / ``seed`` event, keyed ``<kind>/a/b``."""
    metrics = flatten({k: v for k, v in record.items() if k != "event"}, prefix=kind)
    if kind == "phase":  # a trained phase's record has no "skipped": chart it as 0
        metrics.setdefault("phase/skipped", 0.0)
        gate = record.get("gate")
        if isinstance(gate, dict):  # the outcome the reason string alone names
            metrics["phase/gate/insufficient_evidence"] = float(
                gate.get("reason") == INSUFFICIENT_EVIDENCE)
    strategist = record.get("strategist") if kind == "phase" else None
    if isinstance(strategist, dict):
        changed = set(strategist.get("changed") or [])
        metrics.update({f"phase/interventions/{k}": float(k in changed) for k in KNOBS})
    return metrics


def supporter_metrics(explorations: list[dict[str, Any]]) -> dict[str, float]:
    """``round/supporters/*``: what the exploration supporter did in one round, summed over the
    ``exploration`` events of the islands it reviewed (absent when the method has none)."""
    if not explorations:
        return {}
    def count(pred: Any) -> float:
        return float(sum(1 for e in explorations if pred(e)))
    def total(key: str) -> float:
        return float(sum(int(e.get(key) or 0) for e in explorations))
    return {"round/supporters/reviews": float(len(explorations)),
            "round/supporters/critiques": count(lambda e: e.get("critique")),
            "round/supporters/temperature_changes": count(lambda e: e.get("temperature") is not None),
            "round/supporters/fallbacks": count(lambda e: e.get("fallback_cause")),
            "round/supporters/patches": total("patches"),
            "round/supporters/patches_as_preferences": total("as_preferences"),
            "round/supporters/patches_dropped_for_budget": total("patches_dropped_for_budget")}


class AgentBest:
    """The agent-only best on the equation in force, kept as programs are written: the rule of
    ``results.json``'s ``final_agent`` and ``best_by_round_agent`` (``atlas.results._origins``:
    a re-score counts as the program it re-scored, an agent program that repeats an earlier
    supporter program counts as the supporter's), without re-reading the run each round."""

    def __init__(self, entry_point: str | None = None) -> None:
        self.entry_point = entry_point
        self.origin: dict[int, str] = {}
        self.supporter_code: set[str] = set()
        self.best: dict[str, float] = {}  # regime -> best score of seed/agent code
        self.regime = ""  # the equation of the last program written

    def add(self, p: dict[str, Any]) -> None:
        source = p.get("source", "agent")
        parents = p.get("parents") or []
        if source == "rescore" and parents and int(parents[0]) in self.origin:
            source = self.origin[int(parents[0])]
        elif isinstance(p.get("code"), str) and source in ("supporter", "agent"):
            key = program_key(p["code"], self.entry_point)
            if source == "supporter":
                self.supporter_code.add(key)
            elif key in self.supporter_code:
                source = "supporter_copy"
        self.origin[int(p["id"])] = source
        self.regime = p.get("regime", "")
        ev = p.get("evaluation") or {}
        if source in ("seed", "agent") and ev.get("passed") and ev.get("score") is not None:
            score = float(ev["score"])
            self.best[self.regime] = max(self.best.get(self.regime, -math.inf), score)

    def now(self) -> float | None:
        best = self.best.get(self.regime, -math.inf)
        return best if math.isfinite(best) else None


def program_rows(programs: list[dict[str, Any]], limit: int) -> list[list[Any]]:
    """Rows of the ``programs`` table; over ``limit`` (W&B truncates), the best ``limit`` by score."""
    rows = [[p["id"], p["island"], p["round"], p.get("phase", 0), p.get("source", "agent"),
             p["evaluation"].get("score"), bool(p["evaluation"].get("passed")),
             p["evaluation"].get("failure_kind", "ok"), p["code"]] for p in programs]
    if len(rows) > limit:
        log.warning("W&B programs table: keeping the best %d of %d programs (all are in %s)",
                    limit, len(rows), PROGRAMS)
        rows.sort(key=lambda r: (r[6], r[5] if r[5] is not None else -math.inf), reverse=True)
        rows = rows[:limit]
    return rows


def phase_rows(events: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows of the ``phases`` table: what each phase did and why (gate reason, interventions)."""
    rows = []
    for e in events:
        if e.get("event") != "phase":
            continue
        gate = e.get("gate") or {}
        changed = (e.get("strategist") or {}).get("changed") or []
        rows.append([e.get("phase"), e.get("round"), bool(e.get("skipped", False)),
                     e.get("reason", ""), e.get("pairs"), gate.get("reason", ""), gate.get("gain"),
                     gate.get("kl"), e.get("promoted"), e.get("vetoed"), ",".join(changed)])
    return rows


class Telemetry:
    """Writes the run's JSONL files and mirrors them to an optional Lightning logger."""

    def __init__(self, run_dir: Path, logger: Any | None = None,
                 entry_point: str | None = None) -> None:
        """``entry_point``: the task's, for the agent-only best (``AgentBest``)."""
        self.run_dir = Path(run_dir)
        self.entry_point = entry_point
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = logger
        self._events = open(self.run_dir / EVENTS, "a", encoding="utf-8")  # noqa: SIM115
        self._programs = open(self.run_dir / PROGRAMS, "a", encoding="utf-8")  # noqa: SIM115
        self._step = 0
        self._agent_best: AgentBest | None = None  # built from programs.jsonl when first needed
        self._explorations: list[dict[str, Any]] = []  # this round's, for round/supporters/*
        if logger is not None:
            define_axes(logger)

    # -- resume -----------------------------------------------------------------------
    def offsets(self) -> dict[str, Any]:
        """Byte sizes of the JSONL files (checkpointed with the round), plus each file's last
        ``TAIL_BYTES`` ("tail"): if a file later turns out shorter than its checkpointed size
        (a torn last line of the checkpointed region), ``truncate_to`` restores it from them."""
        self.flush()
        sizes = {EVENTS: self._events.tell(), PROGRAMS: self._programs.tell()}
        tail = {}
        for name, size in sizes.items():
            with open(self.run_dir / name, "rb") as fh:
                fh.seek(max(0, size - TAIL_BYTES))
                tail[name] = fh.read(size - fh.tell())
        return {**sizes, "step": self._step, "tail": tail}

    def truncate_to(self, offsets: dict[str, Any]) -> None:
        """Bring each file back to its checkpointed size: drop what a crashed round appended,
        and restore a checkpointed tail the file lost. Never pads (``truncate`` past the end
        of a file fills it with NUL bytes, which glued the next record onto a torn line)."""
        for fh in (self._events, self._programs):
            fh.flush()
        restore_files(self.run_dir, offsets)
        for fh in (self._events, self._programs):
            fh.seek(0, os.SEEK_END)
        self._step = int(offsets.get("step", 0))
        self._agent_best, self._explorations = None, []

    # -- writing ----------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"event": kind, **fields}
        self._events.write(dumps(record) + "\n")
        self._events.flush()
        if self.logger is not None and kind == "exploration":
            self._explorations.append(record)
        if self.logger is not None and kind in ("round", "phase", "seed"):
            self._step += 1
            metrics = logger_metrics(kind, record)
            if kind == "round":
                metrics.update(self._round_extras())
            if metrics:
                self.logger.log_metrics(metrics, step=self._step)
        if self.logger is not None and kind == "end":
            self.log_tables(record.get("results") or {})
        return record

    def _round_extras(self) -> dict[str, float]:
        """The chart-only round series: the agent-only best and the supporter's actions."""
        if self._agent_best is None:
            self.flush()
            self._agent_best = AgentBest(self.entry_point)
            for p in read_jsonl(self.run_dir / PROGRAMS):
                self._agent_best.add(p)
        out = supporter_metrics(self._explorations)
        self._explorations = []
        best = self._agent_best.now()
        if best is not None:
            out["round/best_agent"] = best
        return out

    def log_tables(self, results: dict[str, Any]) -> None:
        """End of run: ``programs`` and ``phases`` W&B tables and ``results/*`` summary keys."""
        self.flush()
        if hasattr(self.logger, "log_table"):  # Lightning's WandbLogger
            import wandb

            programs = read_jsonl(self.run_dir / PROGRAMS)
            self.logger.log_table("programs", columns=list(PROGRAM_COLUMNS),
                                  data=program_rows(programs, wandb.Table.MAX_ROWS))
            self.logger.log_table("phases", columns=list(PHASE_COLUMNS),
                                  data=phase_rows(read_jsonl(self.run_dir / EVENTS)))
        summary = getattr(getattr(self.logger, "experiment", None), "summary", None)
        if summary is not None and hasattr(summary, "update"):
            summary.update(flatten(results, prefix="results"))

    def programs(self, programs: list[Program]) -> None:
        for p in programs:
            record = p.to_dict()
            self._programs.write(dumps(record) + "\n")
            if self._agent_best is not None:
                self._agent_best.add(record)
        self._programs.flush()

    def flush(self) -> None:
        for fh in (self._events, self._programs):
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        self.flush()
        self._events.close()
        self._programs.close()


def restore_files(run_dir: Path, offsets: dict[str, Any]) -> None:
    """Make ``events.jsonl`` and ``programs.jsonl`` exactly as a checkpoint's ``offsets``
    (``Telemetry.offsets``) recorded them: a resume, and a finished run whose last lines were
    torn after it ended (``atlas.runfolder.finished_results``), get their records back."""
    tails = offsets.get("tail") or {}
    for name in (EVENTS, PROGRAMS):
        _restore(Path(run_dir) / name, int(offsets.get(name, 0)), tails.get(name) or b"")


def _restore(path: Path, size: int, tail: bytes) -> None:
    """Make ``path`` exactly its checkpointed ``size`` bytes (see ``Telemetry.truncate_to``)."""
    with open(path, "r+b") as fh:
        now = fh.seek(0, os.SEEK_END)
        if now >= size:
            fh.truncate(size)
            return
        start = size - len(tail)
        if tail and now >= start:
            fh.truncate(start)
            fh.seek(start)
            fh.write(tail)
            log.warning("%s was %d bytes shorter than its checkpoint recorded (a torn last line);"
                        " restored it from the checkpoint", path, size - now)
            return
        keep = _last_line_end(fh, now)  # the lost bytes are not in the checkpoint
        fh.truncate(keep)
        log.warning("%s is %d bytes shorter than its checkpoint recorded and the checkpoint does "
                    "not hold them: the records in them are lost; continuing after the last "
                    "complete line", path, size - keep)


def _last_line_end(fh: Any, size: int, chunk: int = 1 << 16) -> int:
    """Offset just after the last newline in the first ``size`` bytes of ``fh`` (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        fh.seek(start)
        found = fh.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def define_axes(logger: Any) -> None:
    """Plot ``round/*`` against the round number and ``phase/*`` against the phase number
    (instead of W&B's global step, which DPO steps also advance). A no-op for non-W&B loggers."""
    define = getattr(getattr(logger, "experiment", None), "define_metric", None)
    if callable(define):
        define("round/round")
        define("round/*", step_metric="round/round")
        define("phase/phase")
        define("phase/*", step_metric="phase/phase")


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
