"""G_k held out of D_k in a run, and the machinery of ``python -m atlas.bench gate``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from atlas.bench import gate as bench
from atlas.dpo import DPOConfig, GateConfig
from atlas.evolution.database import ProgramDatabase
from atlas.telemetry import read_jsonl
from atlas.train import run
from tests.conftest import QUICK_BANDIT, compose_cfg, explore_settings

ROOT = Path(__file__).resolve().parents[1]


def test_atlas_run_scores_the_gate_on_prompts_held_out_of_dk(tmp_path: Path) -> None:
    # 2 islands served per round: 4 prompts per phase, one held out (gate.holdout 0.25; at
    # the default half, the tiny model's 2 remaining prompts often give D_k no pair at all)
    cfg = compose_cfg(["experiment=test", "method=atlas", "explore.islands_per_round=2",
                       "explore.samples_per_prompt=2", "method.skip_without_improvement=false",
                       "gate.holdout=0.25", "gate.evidence=holdout",
                       "gate.min_completions=2",  # decide on this thin G_k: it is the subject
                       "task.timeout_s=60",  # a loaded shared machine: no spurious timeouts
                       *QUICK_BANDIT],
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
        # events show c*, S, KL and the bound (a G_k below gate.min_completions measures nothing)
        assert g["chosen"] in {c["name"] for c in g["candidates"]}
        if g["evidence"]["informative_completions"] < cfg.gate.min_completions:
            assert g["reason"] == "insufficient evidence" and g["gain"] is None
            continue
        assert {"score", "ref_score", "kl", "lower_bound", "se", "gain_scale", "kl_scale"} <= set(g)
        assert g["epsilon"] == cfg.gate.epsilon == 0.01 and g["confidence"] == 0.9
        # S's unit and the bound, recorded: BC only on a G_k of bc_min_completions or more
        thin = g["evidence"]["informative_completions"] < cfg.gate.bc_min_completions
        assert (g["scale"], g["bound"]) == (cfg.gate.scale, "percentile" if thin else "bc")
        if g["accepted"]:
            assert g["lower_bound"] >= g["epsilon"] and g["kl"] <= g["delta"]


def test_every_trained_atlas_phase_decides_on_recorded_evidence(tmp_path: Path, capsys) -> None:
    """The default gate (gate.evidence=auto) on a test-sized run: no trained phase goes
    without a decision for want of a held-out prompt (the first phase serves one prompt: every
    island starts from the seed), G_k's programs are recorded, and the summary prints one
    line per phase."""
    cfg = compose_cfg(["experiment=test", "method=atlas", "explore.islands_per_round=2",
                       "method.skip_without_improvement=false", "task.timeout_s=60",
                       *QUICK_BANDIT],
                      run_dir=tmp_path)
    results = run(cfg)
    events = read_jsonl(tmp_path / "events.jsonl")
    phases = [e for e in events if e["event"] == "phase"]
    ids = {json.loads(line)["id"] for line in (tmp_path / "programs.jsonl").read_text().splitlines()}
    trained = [e for e in phases if not e.get("skipped")]
    assert trained, "no phase trained"
    for p in trained:
        g = p["gate"]
        assert g["reason"] != "rejected: no held-out gate item"
        ev = g["evidence"]
        assert ev["mode"] in ("holdout", "buffer") and ev["in_sample"] == (ev["mode"] == "buffer")
        assert ev["completions"] == sum(len(x) for x in ev["program_ids"]) >= 1
        assert {i for x in ev["program_ids"] for i in x} <= ids
        decided = ev["informative_completions"] >= ev["minimum"]
        assert decided == (g["reason"] != "insufficient evidence")
    log = results["reference_log"]
    assert [p["phase"] for p in log] == [p["phase"] for p in phases]
    out = capsys.readouterr().out
    for p in log:
        line = next(x for x in out.splitlines() if x.strip().startswith(f"phase {p['phase']} "))
        assert (p["outcome"] in line) or ("accepted" in line and p["outcome"] == "promoted") \
            or (p["outcome"] == "rejected" and "rejected" in line)


def test_bench_trial_data_holds_the_gate_prompt_out_and_inverts_pairs() -> None:
    programs = bench.load_programs(bench.DATA)
    db = ProgramDatabase(explore_settings(), seed=0)
    gate, dpo = GateConfig(), DPOConfig()
    pairs, items, held = bench.trial_data(programs, db, gate, dpo, 0, 24)
    # the loop's hold-out over the two shipped runs' 16 prompts: half, informative first
    assert len(held) == 8 and {it.prompt for it in items} <= held
    assert len(pairs) == 23 and not {p.prompt for p in pairs} & held  # docs/bench: 23 pairs
    assert {p.kind for p in pairs} == {"passed_vs_passed", "passed_vs_failed", "supporter_vs_agent"}
    assert len({p.id // 1_000_000 for p in programs}) == 2  # two runs, ids kept apart
    other = bench.trial_data(programs, db, gate, dpo, 1, 24)
    assert other[2] != held  # G_k differs by seed
    inv = bench.inverted(pairs)
    assert [(p.chosen, p.rejected) for p in inv] == [(p.rejected, p.chosen) for p in pairs]
    assert [p.chosen_score for p in inv] == [p.rejected_score for p in pairs]
    rich = bench.trial_data(programs, db, gate, dpo, 1, 12, holdout="richest", gate_completions=8)
    assert len(rich[2]) == 1 and len(rich[1][0].completions) == 8 and len(rich[0]) == 12
    assert not {p.prompt for p in rich[0]} & rich[2]
    # the buffer (the paper's rule), as a run's phase: nothing held out, D_k from G_k's prompts
    pairs, items, held = bench.trial_data(programs, db, gate, dpo, 0, 24, evidence="buffer")
    assert not held and len(items) == gate.subset_size and len(pairs) == 24
    assert {p.prompt for p in pairs} <= {it.prompt for it in items}
    # a first phase: one prompt, D_k and G_k both from its 40 completions
    pairs, items, held = bench.trial_data(programs, db, gate, dpo, 0, 24, evidence="first-phase")
    assert len(items) == 1 and len(items[0].completions) == 40 and len(pairs) == 24
    assert {p.prompt for p in pairs} == {items[0].prompt}


def test_bench_runs_end_to_end_on_the_tiny_model(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gate.json"
    bench.main(["--model", "tiny", "--trials", "1", "--pairs", "2", "--gate-completions", "3",
                "--max-length", "128", "--json", str(out)])
    text = capsys.readouterr().out
    assert "correct: accepted" in text and "inverted: accepted" in text
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["arm"] for r in rows] == ["correct", "inverted"]
    assert all(r["pairs"] == 2 and r["gate_items"] == 8 for r in rows)  # the loop's hold-out (half)
    assert all(r["gate_items"] * 2 <= r["gate_completions"] <= r["gate_items"] * 3 for r in rows)
    # lr 5e-5 for 1 step barely moves the tiny model
    assert all(abs(r["gain"]) < 0.02 for r in rows)
    # Eq. 5 at the default epsilon: accepted iff the bound clears it inside the trust region
    assert result["gate"]["epsilon"] == 0.01
    assert all(r["accepted"] == bench.accepted_at(r, 0.01, result["gate"]["delta"]) for r in rows)
    assert result["summary"]["correct"]["rate"] == float(rows[0]["accepted"])
    # the raw log-probs give the same decision back without the model (so --rows can
    # re-decide a recorded bench under other gate settings)
    gate = GateConfig.from_cfg(result["gate"])
    for r in rows:
        assert len(r["raw"]["sum_logps"]) == len(r["candidates"])
        again = bench.redecide(r, gate)
        for key in ("accepted", "chosen", "gain", "lower", "se", "kl"):
            assert again[key] == pytest.approx(r[key], abs=1e-12), key
    old = bench.redecide(rows[0], dataclasses.replace(gate, scale="item", bound="percentile"))
    assert old["gain"] != pytest.approx(rows[0]["gain"], abs=1e-9)  # the unit matters
    capsys.readouterr()
    bench.main(["--rows", str(out), "--bound", "percentile", "--scale", "item"])
    text = capsys.readouterr().out
    assert "re-decided from their raw log-probs with scale item, bound percentile" in text
    assert f"gain {old['gain']:+.4f}" in text


def test_bench_rows_re_decide_on_a_smaller_c_k() -> None:
    """``--candidates``: a recorded trial re-decided on some of C_k's candidates only; Eq. 4
    then chooses among those kept (here the best one, step_2, is dropped: final is chosen)."""
    ref = [[-10.0, -12.0], [-11.0, -9.0]]
    better = [[-9.0, -13.0], [-12.0, -8.0]]  # more mass on the better completion of each item
    row = {"seed": 0, "arm": "correct", "raw": {
        "names": ["step_2", "step_4", "final"], "ref_sum_logps": ref,
        "sum_logps": [[[-8.0, -14.0], [-13.0, -7.0]], ref, better],  # step_2 is best
        "kl": [[1e-4, 1e-4], [1e-4, 1e-4], [1e-4, 1e-4]],
        "scores": [[1.0, 0.0], [0.0, 1.0]]}}
    gate = GateConfig(epsilon=-1.0, resamples=200)
    assert bench.redecide(row, gate)["chosen"] == "step_2"
    kept = bench.keep_candidates(row, [1, -1])
    assert kept["raw"]["names"] == ["step_4", "final"]
    assert kept["raw"]["sum_logps"] == [ref, better] and len(kept["raw"]["kl"]) == 2
    assert bench.redecide(kept, gate)["chosen"] == "final"
    assert bench.keep_candidates(row, [0, -1, 0])["raw"]["names"] == ["step_2", "final"]


def test_bench_rows_are_resummarised_at_other_epsilons(tmp_path: Path, capsys) -> None:
    """A bench's recorded rows give the acceptance rates at any epsilon without re-running:
    c* (Eq. 4) does not depend on epsilon, so Eq. 5 is the lower bound and KL vs thresholds."""
    rows = [{"arm": "correct", "lower": 0.017, "kl": 3e-4},
            {"arm": "correct", "lower": -0.03, "kl": 8e-4},
            {"arm": "correct", "lower": 0.0, "kl": 0.2},  # clears epsilon 0, outside delta
            {"arm": "inverted", "lower": -0.009, "kl": 3e-4},
            {"arm": "inverted", "lower": float("nan"), "kl": 3e-4}]  # NaN never clears
    got = dict(bench.rates_by_epsilon(rows, [-0.05, 0.0, 0.02], delta=0.05))
    assert got[-0.05] == {"correct": (2, 3), "inverted": (1, 2)}
    assert got[0.0] == {"correct": (1, 3), "inverted": (0, 2)}
    assert got[0.02] == {"correct": (0, 3), "inverted": (0, 2)}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": rows}))
    bench.main(["--rows", str(path), "--epsilons", "0"])
    assert "epsilon +0.000: correct accepted 1/3, inverted accepted 0/2" in capsys.readouterr().out


def test_bench_null_simulation_shows_bc_overcorrecting_on_a_thin_gate(capsys) -> None:
    """``--null``: a no-effect policy against the gate, no model. One item of 2 completions:
    half the resamples repeat one completion (gain 0), so BC puts the bound at the gain and
    passes half the no-effect policies; the percentile bound passes none."""
    rows = bench.null_rates([(1, 2)], 40, GateConfig())
    assert rows[0]["percentile"] == 0.0 and 0.3 < rows[0]["bc"] < 0.7
    bench.main(["--null", "1x2", "--null-trials", "5"])
    assert "1 items x 2 completions: passed bc" in capsys.readouterr().out
