"""A researcher's first day: the smoke run shows the whole loop and keeps its summary, the
probe line reads without the docs, reports write beside their inputs, and a misplaced field,
a model that is not an option and ``--help`` point the way (through the real command lines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from atlas.train import probe_text

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def _cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


# -- the probe line ---------------------------------------------------------------------------

def _probe(valid: tuple[float, float, float], score: tuple[float, float, float]) -> dict[str, Any]:
    return {"prompts": 2, "samples": 3, "valid_before": 0.5, "valid_after": 0.5 + valid[0],
            "valid_change": dict(zip(("mean", "t_lo", "t_hi"), valid)),
            "score_change": dict(zip(("mean", "t_lo", "t_hi"), score)),
            "kl_base": 0.0292, "kl_reference": 0.0187, "heldout_pairs": 5,
            "heldout_accuracy": 0.8, "seconds": 18.0, "share_of_phase": 0.17}


def test_the_probe_line_reads_in_plain_words_with_units_intervals_and_a_verdict() -> None:
    line = probe_text(_probe((0.33, -0.21, 0.88), (0.22, 0.06, 0.5)))
    assert line.startswith("learning probe, 6 new programs on prompts this phase did not "
                           "train on: valid rate 0.50 before -> 0.83 after")
    # an interval that includes 0 is no evidence; one above 0 is a rise
    assert "change +0.33 (95 % CI -0.21 to +0.88: no evidence of change)" in line
    assert "mean score change +0.22 (95 % CI +0.06 to +0.5: rose)" in line
    assert "2.92e-02 nats/token from the base model, 1.87e-02 from the reference" in line
    assert "preferred the better program in 0.80 of 5 held-out pairs (0.5 = chance)" in line
    assert "D_k" not in line
    fell = probe_text(_probe((-0.5, -0.9, -0.1), (0.0, 0.0, 0.0)))
    assert "change -0.50 (95 % CI -0.90 to -0.10: fell)" in fell
    alone = probe_text({**_probe((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
                        "valid_change": {"mean": 0.0, "t_lo": None, "t_hi": None},
                        "heldout_pairs": 0})
    assert "change +0.00 (too few programs for a 95 % CI)" in alone
    assert "no held-out pairs" in alone


# -- the smoke run ----------------------------------------------------------------------------

def test_the_smoke_run_trains_meets_the_gate_probes_and_keeps_its_summary(tmp_path: Path) -> None:
    """`python -m atlas.train experiment=test` as the README writes it: a trained phase, the
    gate's decision and a probe line on the tiny model; the summary printed is summary.txt."""
    run = tmp_path / "run"
    # about a minute on a quiet 2-core machine; the bound only catches a hang on a loaded one
    proc = _cli("atlas.train", "experiment=test", "progress=false", f"hydra.run.dir={run}",
                timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = (run / "summary.txt").read_text()
    assert kept.startswith("ATLAS run: task=bandit method=atlas seed=0")
    assert kept in proc.stdout  # written as printed, the `outputs in` line included
    assert kept.rstrip().endswith(f"outputs in {run}")
    results = json.loads((run / "results.json").read_text())
    assert results["phases_trained"] >= 1, kept
    phases = [ln for ln in kept.splitlines() if ln.startswith("  phase ")]
    assert any("trained;" in p and ("promoted" in p or "rejected" in p) for p in phases), kept
    assert "learning probe, 6 new programs" in kept and "95 % CI" in kept
    # the agent's own best is not the supporter's: the tiny model writes no valid program
    assert results["candidates_by_source"]["supporter"] > 0
    print(f"\nsmoke run: wall {results['wall_seconds']:.0f} s in the loop")
    # a re-run of the finished run prints the same summary and leaves summary.txt as it was
    again = _cli("atlas.train", "experiment=test", "progress=false", f"hydra.run.dir={run}")
    assert again.returncode == 0 and kept in again.stdout
    assert (run / "summary.txt").read_text() == kept


# -- misplaced fields, models that are not options, --help -------------------------------------

@pytest.mark.parametrize("override, expected", [
    ("explore.beta=0.2", "unknown explore field(s) ['beta']: explore.beta is not a known field; "
                         "beta is a field of dpo, not of explore: did you mean dpo.beta=0.2?"),
    ("model=qwen2", "model=qwen2: no option conf/model/qwen2.yaml (options: llama3_1b, "
                    "llama3_1b_shape, smollm2, tiny); for another Hugging Face model, name it "
                    "with model.source=hf model.name_or_path=<hub id or folder>"),
    ("model=Qwen/Qwen2-0.5B", "Qwen/Qwen2-0.5B reads as a hub id, not an option: load it with "
                              "model.source=hf model.name_or_path=Qwen/Qwen2-0.5B"),
])
def test_a_misplaced_field_or_model_points_to_where_it_belongs(override: str,
                                                               expected: str) -> None:
    proc = _cli("atlas.train", override, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert expected in lines[0]


def test_a_model_folder_points_to_model_source_hf(tmp_path: Path) -> None:
    proc = _cli("atlas.train", f"model={tmp_path}", timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert (f"{tmp_path} is a folder, not an option: load the model it holds with "
            f"model.source=hf model.name_or_path={tmp_path.resolve()}") in proc.stderr


def test_help_starts_with_three_lines_on_atlas_and_its_commands() -> None:
    proc = _cli("atlas.train", "--help", timeout=120)
    assert proc.returncode == 0
    head = proc.stdout.splitlines()[:4]
    assert head[0].startswith("atlas: a small LLM writes Python programs")
    assert head[1].startswith("Commands: python -m atlas.train") and "atlas.report" in head[1]
    assert head[2].startswith("First: python -m atlas.train experiment=test")
    assert head[3] == ""
