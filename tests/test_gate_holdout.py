"""G_k held out of D_k in a run, and the machinery of ``python -m atlas.bench gate``."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from atlas.bench import gate as bench
from atlas.dpo import DPOConfig, GateConfig
from atlas.evolution.database import ProgramDatabase
from atlas.telemetry import read_jsonl
from atlas.train import run
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]


def test_atlas_run_scores_the_gate_on_prompts_held_out_of_dk(tmp_path: Path) -> None:
    # 2 islands served per round: 4 prompts per phase, one held out (gate.holdout 0.25)
    cfg = compose_cfg(["experiment=test", "method=atlas", "explore.islands_per_round=2",
                       "explore.samples_per_prompt=2", "method.skip_without_improvement=false",
                       "task.timeout_s=60"],  # a loaded shared machine: no spurious timeouts
                      run_dir=tmp_path)
    run(cfg)
    phases = [e for e in read_jsonl(tmp_path / "events.jsonl")
              if e["event"] == "phase" and e.get("gate")]
    assert phases, "no phase reached the gate"
    for p in phases:
        g = p["gate"]
        assert g["held_out"] is True and p["held_out_prompts"] >= 1
        assert g["gk_prompt_hashes"] and p["dk_prompt_hashes"]
        assert not set(g["gk_prompt_hashes"]) & set(p["dk_prompt_hashes"])
        assert g["gate_prompts"] == len(g["gk_prompt_hashes"]) <= p["held_out_prompts"]
        # events show c*, S, KL and the bound
        assert g["chosen"] in {c["name"] for c in g["candidates"]}
        assert {"score", "ref_score", "kl", "lower_bound", "se", "gain_scale", "kl_scale"} <= set(g)
        assert g["epsilon"] == 0.02 and g["confidence"] == 0.9
        if g["accepted"]:
            assert g["lower_bound"] >= g["epsilon"] and g["kl"] <= g["delta"]


def test_bench_trial_data_holds_the_gate_prompt_out_and_inverts_pairs() -> None:
    programs = bench.load_programs(bench.DATA)
    db = ProgramDatabase.from_config(OmegaConf.load(ROOT / "conf" / "explore" / "default.yaml"),
                                     seed=0)
    for p in programs:
        db.add(p)
    gate, dpo = GateConfig(), DPOConfig()
    pairs, items, held = bench.trial_data(programs, db, gate, dpo, 0, 12)
    assert len(held) == 1 and [it.prompt for it in items] == list(held)
    assert len(items[0].completions) == 24  # a seeded subset of its 48 completions
    assert len(pairs) == 5 and not {p.prompt for p in pairs} & held  # the shipped run's 5
    other = bench.trial_data(programs, db, gate, dpo, 1, 12)
    assert other[1][0].completions != items[0].completions  # G_k differs by seed
    inv = bench.inverted(pairs)
    assert [(p.chosen, p.rejected) for p in inv] == [(p.rejected, p.chosen) for p in pairs]
    assert [p.chosen_score for p in inv] == [p.rejected_score for p in pairs]
    loop = bench.trial_data(programs, db, gate, dpo, 1, 12, holdout="loop", gate_completions=0)
    assert not {p.prompt for p in loop[0]} & loop[2] and len(loop[2]) == 1


def test_bench_runs_end_to_end_on_the_tiny_model(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gate.json"
    bench.main(["--model", "tiny", "--trials", "1", "--pairs", "2", "--gate-completions", "8",
                "--max-length", "128", "--json", str(out)])
    text = capsys.readouterr().out
    assert "correct: accepted" in text and "inverted: accepted" in text
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["arm"] for r in rows] == ["correct", "inverted"]
    assert all(r["pairs"] == 2 and r["gate_completions"] == 8 for r in rows)
    # lr 5e-5 for 1 step barely moves the tiny model: no gain clears epsilon
    assert all(abs(r["gain"]) < 0.02 and not r["accepted"] for r in rows)
    assert result["summary"]["correct"]["rate"] == 0.0
    assert result["gate"]["epsilon"] == 0.02
