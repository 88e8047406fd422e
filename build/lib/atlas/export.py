"""``python -m atlas.export <run or sweep dir> [--out DIR]``: a run's traces as a training dataset.

One record per candidate: the prompt the agent saw, its completion, the extracted code, the
score and the failure, plus which run it came from (task, method, seed, run folder), as a
Hugging Face ``datasets`` folder (``load_from_disk``) and JSONL, so others can train on the
agent's own attempts (SFT on passed programs, reward models, DPO on pairs). A sweep folder
exports every run below it into one dataset.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from atlas.telemetry import EVENTS, PROGRAMS, dumps, read_jsonl

COLUMNS = ("id", "island", "round", "phase", "source", "prompt", "completion", "code", "score",
           "passed", "failure_kind", "failure_message", "parents", "task", "method", "seed", "run")


def _run_meta(run_dir: Path) -> dict[str, Any]:
    """task / method / seed from the run's config event (None when events.jsonl lacks it)."""
    config: dict[str, Any] = {}
    if (run_dir / EVENTS).exists():
        config = next((e["config"] for e in read_jsonl(run_dir / EVENTS)
                       if e.get("event") == "config"), {})
    return {"task": (config.get("task") or {}).get("name"),
            "method": (config.get("method") or {}).get("name"),
            "seed": config.get("seed"), "run": run_dir.name}


def trace_records(run_dir: Path) -> list[dict[str, Any]]:
    """One dict per program of ``run_dir/programs.jsonl``, with the keys of ``COLUMNS``."""
    run_dir = Path(run_dir)
    if not (run_dir / PROGRAMS).exists():
        raise FileNotFoundError(f"{run_dir} has no {PROGRAMS}: pass an atlas run folder "
                                f"(outputs/<name>/<task>_<method>_s<seed>) or a sweep folder")
    meta = _run_meta(run_dir)
    rows = []
    for p in read_jsonl(run_dir / PROGRAMS):
        ev = p["evaluation"]
        rows.append({"id": p["id"], "island": p["island"], "round": p["round"],
                     "phase": p.get("phase", 0), "source": p.get("source", "agent"),
                     "prompt": p.get("prompt", ""), "completion": p.get("completion", ""),
                     "code": p["code"], "score": ev.get("score"), "passed": bool(ev["passed"]),
                     "failure_kind": ev.get("failure_kind", "ok"),
                     "failure_message": ev.get("message", ""),
                     "parents": list(p.get("parents", [])), **meta})
    return rows


def find_run_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a run folder, else every run folder below it (wandb/ skipped)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if (path / PROGRAMS).exists():
        return [path]
    return sorted(p.parent for p in path.rglob(PROGRAMS) if "wandb" not in p.parts)


def export(run_dir: Path, out: Path) -> tuple[Path, Path]:
    """Write ``out/traces.jsonl`` and the ``out/dataset`` folder; returns both paths.

    ``run_dir`` is a run folder or a sweep folder (all its runs go into one dataset)."""
    from datasets import Dataset, Features, Sequence, Value

    runs = find_run_dirs(run_dir)
    if not runs:
        raise FileNotFoundError(f"no {PROGRAMS} under {run_dir}: pass an atlas run folder or a "
                                f"sweep folder (multirun/<name>)")
    rows = [r for d in runs for r in trace_records(d)]
    if not rows:
        raise ValueError(f"{run_dir}: {PROGRAMS} holds no programs; did the run start?")
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "traces.jsonl"
    jsonl.write_text("".join(dumps(r) + "\n" for r in rows))
    features = Features({
        "id": Value("int64"), "island": Value("int64"), "round": Value("int64"),
        "phase": Value("int64"), "source": Value("string"), "prompt": Value("string"),
        "completion": Value("string"), "code": Value("string"), "score": Value("float64"),
        "passed": Value("bool"), "failure_kind": Value("string"),
        "failure_message": Value("string"), "parents": Sequence(Value("int64")),
        "task": Value("string"), "method": Value("string"), "seed": Value("int64"),
        "run": Value("string"),
    })
    ds = Dataset.from_dict({c: [r[c] for r in rows] for c in COLUMNS}, features=features)
    folder = out / "dataset"
    ds.save_to_disk(str(folder))
    return jsonl, folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m atlas.export", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a run folder or a sweep folder")
    parser.add_argument("--out", type=Path, default=None, help="default: <run_dir>/traces")
    args = parser.parse_args(argv)
    try:
        jsonl, folder = export(args.run_dir, args.out or args.run_dir / "traces")
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    n = sum(1 for _ in open(jsonl, encoding="utf-8"))
    print(f"wrote {n} records to {jsonl} and {folder} (datasets.load_from_disk)")


if __name__ == "__main__":
    main()
