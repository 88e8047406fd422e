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

def _probe(valid: tuple[float, float, float], score: tuple[float, float, float],
           **extra: Any) -> dict[str, Any]:
    return {"prompts": 2, "samples": 3, "valid_before": 0.5, "valid_after": 0.5 + valid[0],
            "valid_change": dict(zip(("mean", "t_lo", "t_hi"), valid)),
            "score_change": dict(zip(("mean", "t_lo", "t_hi"), score)),
            "kl_base": 0.0292, "kl_reference": 0.0187, "heldout_pairs": 5,
            "heldout_accuracy": 0.8, "seconds": 18.0, "share_of_phase": 0.17, **extra}


def test_the_probe_line_reads_in_plain_words_with_units_intervals_and_a_verdict() -> None:
    line = probe_text(_probe((0.33, -0.21, 0.88), (0.22, 0.06, 0.5)))
    # six binary slots read as counts, not as a rate with a t interval
    assert line.startswith("learning probe, 6 programs on prompts this phase did not "
                           "train on: valid 3/6 before -> 5/6 after;"), line
    assert "t_lo" not in line and "0.33" not in line
    # a score interval above 0 is a rise
    assert "mean score change +0.22 (95 % CI +0.06 to +0.5: rose)" in line
    assert "2.92e-02 nats/token from the base model, 1.87e-02 from the reference" in line
    # five held-out pairs are too few for an accuracy
    assert "held-out preference accuracy: too few pairs (5)" in line
    assert "18 s (17% of the phase)" in line
    assert "D_k" not in line
    signed = probe_text(_probe(
        (0.33, None, None), (-0.3, -0.5, -0.1), heldout_pairs=12, heldout_accuracy=0.75,
        heldout_p=0.15, copies_before=1, copies_after=4, new_valid_before=2,
        new_valid_after=1, valid_change={"mean": 0.33, "fail_to_pass": 2, "pass_to_fail": 0,
                                         "p": 0.5}))
    assert "valid 3/6 before -> 5/6 after (2 fail->pass, 0 pass->fail, sign test p 0.50)" \
        in signed
    assert "copies of earlier programs 1 -> 4, new & valid 2 -> 1" in signed
    assert "mean score change -0.3 (95 % CI -0.5 to -0.1: fell)" in signed
    assert ("it preferred the better program in 0.75 of 12 held-out pairs "
            "(0.5 = chance, binomial p 0.15)") in signed
    alone = probe_text({**_probe((0.0, 0.0, 0.0), (0.0, None, None)), "heldout_pairs": 0})
    assert "mean score change +0 (too few programs for a 95 % CI)" in alone
    assert "too few pairs (0)" in alone
    nothing = probe_text({**_probe((0.0, 0.0, 0.0), (None, None, None)),
                          "valid_before": None})
    assert "valid n/a before" in nothing and "mean score change n/a" in nothing


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
    assert "learning probe, 6 programs" in kept and "nats/token" in kept
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
