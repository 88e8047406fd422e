"""Copy what a report needs from sweep folders into the repository (docs/study/runs, docs/runs).

    python scripts/archive_runs.py /work/study_runs/study /work/study_runs/ablation --out docs/study/runs

Per run folder: ``results.json`` (recomputed from the JSONL files with the current
``atlas.results.summarise``; the values it replaced are kept under ``recomputed``),
``events.jsonl``, ``programs.jsonl``, the resolved
``config.yaml`` and ``overrides.yaml`` (from the run's ``.hydra/``), ``precision.json`` and
``train.log``; never checkpoints or W&B files. Per sweep: its task secrets
(``.task_secret*``, published once the sweep is over, so the hidden environments can be
rebuilt) as ``<sweep>/task_secret*``. ``python -m atlas.report <out>`` then recomputes every
table from these files.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

RUN_FILES = ("events.jsonl", "programs.jsonl", "precision.json", "train.log")  # + results.json
HYDRA_FILES = ("config.yaml", "overrides.yaml")


def refresh_results(run: Path, dest: Path) -> None:
    """Write ``results.json`` recomputed from the run's JSONL with today's ``summarise`` (the
    run's own fields, precision, wall time, kept), so an archived results.json agrees with
    ``python -m atlas.report`` on it; what changed is listed under ``recomputed``."""
    import subprocess

    from atlas.results import summarise
    from atlas.telemetry import dumps

    old = json.loads((run / "results.json").read_text())
    new = summarise(run, old)
    changed = sorted(k for k in new if k in old and new[k] != old[k])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    new["recomputed"] = {"by": f"scripts/archive_runs.py at {commit or 'unknown commit'}",
                         "changed": {k: old[k] for k in changed}}
    dest.write_text(dumps(new) + "\n")


def archive(sweeps: list[Path], out: Path, finished: bool = False) -> list[Path]:
    """Copy each sweep's run folders (those holding an events.jsonl; with ``finished``, only
    those that wrote results.json) and secrets below ``out``."""
    written: list[Path] = []
    for sweep in sweeps:
        dest_sweep = out / sweep.name
        for secret in sorted(sweep.glob(".task_secret*")):
            dest = dest_sweep / secret.name.lstrip(".")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(secret, dest)
            written.append(dest)
        for events in sorted(sweep.glob("*/events.jsonl")):
            run = events.parent
            if finished and not (run / "results.json").exists():
                continue  # a run still going (a sweep archived between sittings)
            dest = dest_sweep / run.name
            dest.mkdir(parents=True, exist_ok=True)
            for name in RUN_FILES:
                if (run / name).exists():
                    shutil.copyfile(run / name, dest / name)
                    written.append(dest / name)
            if (run / "results.json").exists():
                refresh_results(run, dest / "results.json")
                written.append(dest / "results.json")
            for name in HYDRA_FILES:
                if (run / ".hydra" / name).exists():
                    shutil.copyfile(run / ".hydra" / name, dest / name)
                    written.append(dest / name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep folders (multirun/<name>)")
    parser.add_argument("--out", type=Path, required=True, help="e.g. docs/study/runs")
    parser.add_argument("--finished", action="store_true",
                        help="only the runs that finished (results.json): a sweep still running")
    args = parser.parse_args()
    for sweep in args.sweeps:
        if not sweep.is_dir():
            parser.error(f"{sweep} is not a folder: pass a sweep folder (multirun/<name>)")
    written = archive(args.sweeps, args.out, finished=args.finished)
    print(f"wrote {len(written)} files under {args.out}")


if __name__ == "__main__":
    main()
