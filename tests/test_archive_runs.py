"""scripts/archive_runs.py: a sweep archived between sittings keeps only its finished runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "study" / "runs" / "study" / "bandit_atlas_s0"


def test_finished_keeps_only_runs_that_wrote_results(tmp_path: Path):
    sweep = tmp_path / "study"
    shutil.copytree(RUN, sweep / "bandit_atlas_s0")
    going = sweep / "bandit_atlas_s1"
    going.mkdir()
    shutil.copyfile(RUN / "events.jsonl", going / "events.jsonl")  # no results.json yet
    for finished, expected in ((True, {"bandit_atlas_s0"}),
                               (False, {"bandit_atlas_s0", "bandit_atlas_s1"})):
        out = tmp_path / f"out_{finished}"
        cmd = [sys.executable, str(ROOT / "scripts" / "archive_runs.py"), str(sweep),
               "--out", str(out)] + (["--finished"] if finished else [])
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
        assert {p.name for p in (out / "study").iterdir() if p.is_dir()} == expected
        assert (out / "study" / "bandit_atlas_s0" / "results.json").exists()
