"""``python -m atlas.export <run dir> [--out DIR]``: a run's traces as a training dataset.

One record per candidate: the prompt the agent saw, its completion, the extracted code, the
score and the failure, as a Hugging Face ``datasets`` folder (``load_from_disk``) and JSONL.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from atlas.telemetry import PROGRAMS, dumps, read_jsonl

COLUMNS = ("id", "island", "round", "phase", "source", "prompt", "completion", "code", "score",
           "passed", "failure_kind", "failure_message", "parents")


def trace_records(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for p in read_jsonl(Path(run_dir) / PROGRAMS):
        ev = p["evaluation"]
        rows.append({"id": p["id"], "island": p["island"], "round": p["round"],
                     "phase": p.get("phase", 0), "source": p.get("source", "agent"),
                     "prompt": p.get("prompt", ""), "completion": p.get("completion", ""),
                     "code": p["code"], "score": ev.get("score"), "passed": bool(ev["passed"]),
                     "failure_kind": ev.get("failure_kind", "ok"),
                     "failure_message": ev.get("message", ""), "parents": list(p.get("parents", []))})
    return rows


def export(run_dir: Path, out: Path) -> tuple[Path, Path]:
    """Write ``out/traces.jsonl`` and the ``out/dataset`` folder; returns both paths."""
    from datasets import Dataset, Features, Sequence, Value

    rows = trace_records(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/{PROGRAMS} holds no programs; is it an atlas run folder?")
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "traces.jsonl"
    jsonl.write_text("".join(dumps(r) + "\n" for r in rows))
    features = Features({
        "id": Value("int64"), "island": Value("int64"), "round": Value("int64"),
        "phase": Value("int64"), "source": Value("string"), "prompt": Value("string"),
        "completion": Value("string"), "code": Value("string"), "score": Value("float64"),
        "passed": Value("bool"), "failure_kind": Value("string"),
        "failure_message": Value("string"), "parents": Sequence(Value("int64")),
    })
    ds = Dataset.from_dict({c: [r[c] for r in rows] for c in COLUMNS}, features=features)
    folder = out / "dataset"
    ds.save_to_disk(str(folder))
    return jsonl, folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m atlas.export", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: <run_dir>/traces")
    args = parser.parse_args(argv)
    jsonl, folder = export(args.run_dir, args.out or args.run_dir / "traces")
    print(f"wrote {jsonl} and {folder} (datasets.load_from_disk)")


if __name__ == "__main__":
    main()
