"""Reports, the analysis notebook and trace export, from run folders.

Numbers are checked on hand-written run folders whose tables are known in advance (two
seeds with known initial/final scores -> known mean/std; known strategist interventions and
gate decisions -> known rates). The plumbing is checked on a real sweep (3 methods x 2 seeds,
tiny model; built once per session by tests/test_wandb.py's ``build_sweep``): the CLI, the
notebook executed with nbclient, and ``atlas.export`` read back with ``datasets``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from atlas.export import COLUMNS, export, trace_records
from atlas.telemetry import EVENTS, PROGRAMS, read_jsonl
from tests.test_wandb import METHODS, SEEDS, build_sweep, job_dirs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sweep(tmp_path_factory.getbasetemp())


def _cli(module: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, env=dict(os.environ, MPLBACKEND="Agg"))
    if ok:
        assert proc.returncode == 0, f"{module} {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _rows(text: str, title: str) -> dict[tuple[str, ...], list[str]]:
    """The rows of one printed table, keyed by (task, method[, seed]), as whitespace tokens."""
    skip = 3 if title.startswith("Table 2") else 2  # Table 2 names each task's score first
    block = text.split(title, 1)[1].split("\n\n", 1)[0].strip().splitlines()[skip:]
    width = 3 if title.startswith("Table 5") else 2
    return {tuple(line.split()[:width]): line.split()[width:] for line in block}


# -- hand-written run folders with known numbers -------------------------------------------

def _program(pid: int, rnd: int, score: float | None, source: str = "agent") -> dict[str, Any]:
    passed = score is not None
    return {"id": pid, "island": pid % 2, "round": rnd, "phase": max(rnd, 1) if rnd else 0,
            "code": f"def policy():\n    return {pid}\n", "prompt": f"prompt {pid}",
            "completion": f"completion {pid}", "parents": [0] if rnd else [], "cluster": "c0",
            "source": source,
            "evaluation": {"score": score, "passed": passed, "message": "" if passed else "boom",
                           "failure_kind": "ok" if passed else "syntax", "metrics": {}}}


def _trained(phase: int, changed: list[str], promoted: bool | None) -> dict[str, Any]:
    e: dict[str, Any] = {"event": "phase", "round": phase, "phase": phase,
                         "strategist": {"changed": changed} if changed is not None else None}
    if promoted is not None:
        e.update(gate={"accepted": promoted, "reason": "accepted" if promoted else "rejected: no gain"},
                 promoted=promoted, vetoed=False)
    return e


def write_run(root: Path, task: str, method: str, seed: int, initial: float,
              rounds: list[list[float | None]], phases: list[dict[str, Any]],
              complete: bool = True, name: str | None = None) -> Path:
    """A run folder as atlas.loop writes it: seed program, agent programs per round, phases;
    ``name``: the run label (``name=``), the experiment being ``study``."""
    run = root / f"{task}_{method}_s{seed}{'_' + name if name else ''}"
    run.mkdir(parents=True)
    programs = [_program(0, 0, initial, "seed")]
    for r, scores in enumerate(rounds, start=1):
        programs += [_program(len(programs), r, s) for s in scores]
    (run / PROGRAMS).write_text("".join(json.dumps(p) + "\n" for p in programs))
    events = [{"event": "config", "config": {"task": {"name": task}, "method": {"name": method},
                                             "seed": seed,
                                             **({"name": name, "experiment_name": "study"}
                                                if name else {})}}]
    events += [{"event": "round", "round": r, "valid_rate": 0.5} for r in range(1, len(rounds) + 1)]
    events += phases
    if complete:
        events.append({"event": "end", "results": {"wall_seconds": 12.0}})
    (run / EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


@pytest.fixture
def known_runs(tmp_path: Path) -> Path:
    """bandit/atlas: seed 0 goes -0.6 -> -0.3 (+50%), seed 1 -0.6 -> -0.4 (+33.3%);
    beta changed in 1/2 and 2/2 trained phases, lr in 0/2 and 1/2; promotions 1/2 and 2/2.
    bandit/evotune seed 0: -0.6 -> -0.55, its only phase skipped, the run incomplete.
    pinn/atlas seed 0: -1e-2 -> -1e-3 (+90%). Plus a folder killed before its config event."""
    root = tmp_path / "multirun" / "known"
    write_run(root, "bandit", "atlas", 0, -0.6, [[-0.5, None], [-0.3]],
              [_trained(1, ["beta"], True), _trained(2, [], False)])
    write_run(root, "bandit", "atlas", 1, -0.6, [[-0.4], [-0.45, None]],
              [_trained(1, ["beta", "lr"], True), _trained(2, ["beta"], True)])
    write_run(root, "bandit", "evotune", 0, -0.6, [[-0.55]],
              [{"event": "phase", "round": 1, "phase": 1, "skipped": True,
                "reason": "no score improvement this phase (paper B.4)"}], complete=False)
    write_run(root, "pinn", "atlas", 0, -1e-2, [[-1e-3, None]],
              [_trained(1, ["score_threshold"], True)])
    (root / "bandit_atlas_s9").mkdir()
    (root / "bandit_atlas_s9" / EVENTS).write_text("")
    return root


def test_report_prints_known_table2_table3_table5_and_writes_pngs(known_runs: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "figs"
    proc = _cli("atlas.report", str(known_runs), "--out", str(out))
    text = proc.stdout
    assert "4 runs (1 incomplete)" in text
    assert "skipping" in proc.stderr and "bandit_atlas_s9" in proc.stderr

    t2 = _rows(text, "Table 2")
    assert "score: bandit = NMR; pinn = -validation loss" in text  # the tasks' score_label
    # mean +- sample std (ddof=1): final (-0.3, -0.4) -> -0.35 +- 0.0707; improvement (50, 33.3);
    # every program here is the agent's, so the agent columns repeat final and improvement;
    # last column: evaluated candidates (no explore config in these folders: no budget)
    assert t2[("bandit", "atlas")] == ["2", "-0.6", "+-", "0", "-0.35", "+-", "0.071",
                                       "41.67", "+-", "12", "-0.35", "+-", "0.071",
                                       "41.67", "+-", "12", "3"]
    assert t2[("bandit", "evotune")] == ["1", "-0.6", "+-", "0", "-0.55", "+-", "0",
                                         "8.333", "+-", "0", "-0.55", "+-", "0",
                                         "8.333", "+-", "0", "1"]
    assert t2[("pinn", "atlas")] == ["1", "-0.01", "+-", "0", "-0.001", "+-", "0", "90", "+-", "0",
                                     "-0.001", "+-", "0", "90", "+-", "0", "2"]
    assert list(t2) == [("bandit", "evotune"), ("bandit", "atlas"), ("pinn", "atlas")]

    # columns: score_threshold, epochs, beta, lr, accept_rate (means of per-seed rates)
    t3 = _rows(text, "Table 3")
    assert t3[("bandit", "atlas")] == ["0.0%", "0.0%", "75.0%", "25.0%", "75.0%"]
    assert t3[("bandit", "evotune")] == ["-", "-", "-", "-", "-"]  # no trained phase
    assert t3[("pinn", "atlas")] == ["100.0%", "0.0%", "0.0%", "0.0%", "100.0%"]
    t5 = _rows(text, "Table 5")
    assert t5[("bandit", "atlas", "0")] == ["0/2", "0/2", "1/2", "0/2", "1/2"]
    assert t5[("bandit", "atlas", "1")] == ["0/2", "0/2", "2/2", "1/2", "2/2"]

    for task in ("bandit", "pinn"):
        png = out / f"figure2_{task}.png"
        assert f"wrote {png}" in text
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000


def test_report_errors_name_the_folder_and_the_fix(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "wandb").mkdir(parents=True)
    proc = _cli("atlas.report", str(empty), ok=False)
    assert proc.returncode == 2
    assert "no run folders" in proc.stderr and str(empty) in proc.stderr
    assert "multirun/<name>" in proc.stderr
    missing = _cli("atlas.report", str(tmp_path / "nope"), ok=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    broken = tmp_path / "broken" / "run"
    broken.mkdir(parents=True)
    (broken / EVENTS).write_text(json.dumps({"event": "round", "round": 1}) + "\n")
    proc = _cli("atlas.report", str(broken.parent), ok=False)
    assert proc.returncode == 2 and "could be read" in proc.stderr and "no config event" in proc.stderr


# -- a synthetic seed study: intervals, paired differences, files ---------------------------

T4 = 2.7764451051977987  # t(0.975, df=4)
EVOTUNE_FINALS = [-0.50, -0.45, -0.55, -0.40, -0.60]
ATLAS_GAIN = [0.10, 0.05, 0.20, 0.15, 0.05]      # the agent's own best over EvoTune's, per seed
EVODPO_GAIN = [0.01, 0.02, 0.03, -0.05, 0.04]


@pytest.fixture
def study_runs(tmp_path: Path) -> Path:
    """3 methods x 5 seeds of bandit, all from -0.6. Per seed: round 1 writes -0.65 (below the seed) and a
    failed program (EvoTune seed 4: three failed), round 2 the final. ATLAS seed 0 also has a
    supporter program at -0.2: its any-source final is -0.2, its agent-only final -0.4."""
    root = tmp_path / "multirun" / "study"
    for seed in range(5):
        for method, gain in (("evotune", 0.0), ("evodpo", EVODPO_GAIN[seed]),
                             ("atlas", ATLAS_GAIN[seed])):
            failed = [None, None, None] if (method, seed) == ("evotune", 4) else [None]
            run = write_run(root, "bandit", method, seed, -0.6,
                            [[-0.65, *failed], [EVOTUNE_FINALS[seed] + gain]], [])
            if (method, seed) == ("atlas", 0):
                with (run / PROGRAMS).open("a") as fh:
                    fh.write(json.dumps(_program(99, 2, -0.2, "supporter")) + "\n")
    return root


def _t_ci(xs: list[float]) -> tuple[float, float]:
    n, mean = len(xs), sum(xs) / len(xs)
    half = T4 * math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)
    return mean - half, mean + half


def test_study_statistics_by_hand_and_the_files_written(study_runs: Path, tmp_path: Path) -> None:
    import csv

    out = tmp_path / "study"
    text = _cli("atlas.report", str(study_runs), "--out", str(out)).stdout
    assert "15 runs (0 incomplete)" in text
    doc = json.loads((out / "report.json").read_text())
    means = {(r["method"], r["metric"]): r for r in doc["means"]}
    # EvoTune's finals: mean -0.5, s = sqrt(0.025/4) = 0.0790569, half = 2.77645 * s / sqrt(5) = 0.0981622
    evo = means[("evotune", "final_score")]
    assert evo["n"] == 5 and evo["mean"] == pytest.approx(-0.5)
    assert (evo["lo"], evo["hi"]) == pytest.approx((-0.5981622, -0.4018378), abs=1e-6)
    # ATLAS's agent-only and any-source finals differ only on seed 0 (-0.4 vs -0.2)
    assert means[("atlas", "final_agent")]["mean"] == pytest.approx(-0.5 + 0.11)
    assert means[("atlas", "final_score")]["mean"] == pytest.approx(-0.5 + 0.15)

    paired = {(r["metric"], r["a"], r["b"]): r for r in doc["paired"]}
    # agent only, ATLAS - EvoTune: diffs 0.10 0.05 0.20 0.15 0.05 -> mean 0.11,
    # s = sqrt(0.017/4) = 0.0651920, t CI 0.11 -+ 0.0809466; all 5 positive -> p = 2/32
    agent = paired[("final_agent", "atlas", "evotune")]
    assert agent["n"] == 5 and agent["diffs"] == pytest.approx(ATLAS_GAIN)
    assert agent["mean"] == pytest.approx(0.11)
    assert (agent["t_lo"], agent["t_hi"]) == pytest.approx((0.0290534, 0.1909466), abs=1e-6)
    assert (agent["t_lo"], agent["t_hi"]) == pytest.approx(_t_ci(ATLAS_GAIN))
    assert 0.05 <= agent["boot_lo"] < 0.11 < agent["boot_hi"] <= 0.20
    assert agent["p_signed_rank"] == pytest.approx(0.0625) and agent["p_min"] == 0.0625
    assert (agent["wins"], agent["losses"]) == (5, 0)
    # any source: seed 0's diff is 0.30 (the supporter's -0.2) -> mean 0.15, s = sqrt(0.045/4)
    anysrc = paired[("final_score", "atlas", "evotune")]
    assert anysrc["mean"] == pytest.approx(0.15)
    assert (anysrc["t_lo"], anysrc["t_hi"]) == pytest.approx((0.0183016, 0.2816984), abs=1e-6)
    # EvoDPO - EvoTune: diffs 0.01 0.02 0.03 -0.05 0.04 (|d| ranks 1 2 3 5 4) -> W+ = 10 of 15 -> p = 20/32
    dpo = paired[("final_score", "evodpo", "evotune")]
    assert dpo["mean"] == pytest.approx(0.01) and dpo["p_signed_rank"] == pytest.approx(0.625)
    assert (dpo["wins"], dpo["losses"]) == (4, 1)
    # improvement %: (final - (-0.6)) / 0.6 * 100, so its diffs are the final diffs / 0.006
    imp = paired[("improvement_agent_pct", "atlas", "evotune")]
    assert imp["mean"] == pytest.approx(0.11 / 0.006)
    assert {(r["a"], r["b"]) for r in doc["paired"]} == {
        ("evodpo", "evotune"), ("atlas", "evotune"), ("atlas", "evodpo")}

    # valid rate per phase (the agent's programs): phase 1 is 1/2 except EvoTune seed 4 (1/4)
    valid = {(r["method"], r["phase"]): r for r in doc["valid_by_phase"]}
    v1 = valid[("evotune", 1)]
    assert v1["mean"] == pytest.approx(0.45)
    assert (v1["lo"], v1["hi"]) == pytest.approx(_t_ci([0.5, 0.5, 0.5, 0.5, 0.25]))
    assert valid[("atlas", 2)]["mean"] == 1.0 and valid[("atlas", 1)]["mean"] == 0.5

    # the printed tables say the 5-seed floor instead of claiming p < 0.05
    assert "smallest p it can give with n non-zero pairs (0.0625 here)" in text
    row = next(line.split() for line in text.splitlines()
               if "final (agent)" in line and "atlas - evotune" in line)
    assert row[-2:] == ["0.0625", "0.0625"]

    # the files: CSV per table, report.md with every table and the figure, report.json
    for name in ("table2", "table3", "table5", "means_ci", "paired", "valid_by_phase"):
        with (out / f"{name}.csv").open() as fh:
            rows = list(csv.reader(fh))
        assert len(rows) > 1, name
    with (out / "paired.csv").open() as fh:
        prow = next(r for r in csv.DictReader(fh)
                    if r["metric"] == "final (agent)" and r["A - B"] == "atlas - evotune")
    assert prow["n"] == "5" and prow["mean diff"] == "0.11" and prow["p (signed-rank)"] == "0.0625"
    with (out / "table5.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 15  # one row per trial
    md = (out / "report.md").read_text()
    for title in ("Table 2", "Table 3", "Table 5", "Means with 95% Student-t", "Paired differences",
                  "Valid-program rate"):
        assert f"**{title}" in md
    assert "| bandit | atlas | final (agent) | 5 | -0.39 |" in md
    assert "![figure2_bandit](figure2_bandit.png)" in md
    assert (out / "figure2_bandit.png").read_bytes()[:8] == PNG_MAGIC
    assert {r["run"] for r in doc["runs"]} == {f"bandit_{m}_s{s}" for m in METHODS for s in range(5)}


# -- the real sweep: CLI, notebook, export --------------------------------------------------

def test_report_on_a_real_sweep_matches_each_runs_results(sweep: Path, tmp_path: Path) -> None:
    proc = _cli("atlas.report", str(sweep), "--out", str(tmp_path))
    assert f"{len(METHODS) * len(SEEDS)} runs (0 incomplete)" in proc.stdout
    t2 = _rows(proc.stdout, "Table 2")
    assert list(t2) == [("bandit", m) for m in METHODS]
    jobs = job_dirs(sweep)
    for method in METHODS:
        results = [json.loads((jobs[(method, s)] / "results.json").read_text()) for s in SEEDS]
        finals = [r["final_score"] for r in results]
        mean = sum(finals) / len(finals)
        std = math.sqrt(sum((f - mean) ** 2 for f in finals) / (len(finals) - 1))
        cells = t2[("bandit", method)]
        assert cells[0] == str(len(SEEDS))
        assert cells[4:7] == [f"{mean:.4g}", "+-", f"{std:.2g}"]
        assert cells[1] == f"{results[0]['initial_score']:.4g}"
    t3 = _rows(proc.stdout, "Table 3")
    assert t3[("bandit", "evotune")] == ["-"] * 5  # the tiny model never trains a phase
    png = tmp_path / "figure2_bandit.png"
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_analysis_notebook_runs_on_the_sweep_and_writes_the_figures(
        sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    out = tmp_path / "nb"
    out.mkdir()
    monkeypatch.setenv("ATLAS_RUNS", str(sweep))
    monkeypatch.setenv("ATLAS_REPORT_OUT", str(out))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    # one cell's stdout, then a blank line: the tables' text as the CLI separates them
    text = "\n".join("".join(o.get("text", "") for o in c.outputs)
                     for c in nb.cells if c.cell_type == "code")
    assert f"{len(METHODS) * len(SEEDS)} runs under" in text
    cli = _cli("atlas.report", str(sweep), "--out", str(tmp_path / "cli")).stdout
    for title in ("Table 2", "Table 3", "Table 5"):  # the notebook prints what the CLI prints
        assert _rows(text, title) == _rows(cli, title)
    for name in ("figure2_bandit.png", "valid_rate_bandit.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2  # Figure 2 and the valid-rate chart, shown inline


def test_export_writes_jsonl_and_a_loadable_dataset_of_one_run(sweep: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    run = job_dirs(sweep)[("atlas", 1)]
    programs = read_jsonl(run / PROGRAMS)
    jsonl, folder = export(run, tmp_path / "traces")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    ds = load_from_disk(str(folder))
    assert len(rows) == len(ds) == len(programs) > 0
    assert ds.column_names == list(COLUMNS)
    for p, row, rec in zip(programs, rows, ds):
        ev = p["evaluation"]
        assert (rec["id"], rec["code"], rec["prompt"], rec["completion"]) == \
            (p["id"], p["code"], p["prompt"], p["completion"])
        assert (rec["passed"], rec["failure_kind"], rec["failure_message"]) == \
            (ev["passed"], ev["failure_kind"], ev["message"])
        assert rec["score"] == ev["score"] == row["score"]  # None for a failed program
        assert (rec["task"], rec["method"], rec["seed"], rec["run"]) == ("bandit", "atlas", 1, run.name)
    assert {r["source"] for r in rows} >= {"seed", "agent"}


def test_export_cli_takes_a_whole_sweep_and_rejects_a_folder_without_runs(
        sweep: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    proc = _cli("atlas.export", str(sweep), "--out", str(tmp_path / "all"))
    total = sum(len(read_jsonl(d / PROGRAMS)) for d in job_dirs(sweep).values())
    assert f"wrote {total} records" in proc.stdout
    ds = load_from_disk(str(tmp_path / "all" / "dataset"))
    assert len(ds) == total
    assert sorted({(m, s) for m, s in zip(ds["method"], ds["seed"])}) == \
        sorted((m, s) for m in METHODS for s in SEEDS)
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = _cli("atlas.export", str(empty), ok=False)
    assert bad.returncode == 2 and "no programs.jsonl under" in bad.stderr
    with pytest.raises(FileNotFoundError, match="has no programs.jsonl"):
        trace_records(empty)


def test_a_run_with_its_own_name_is_its_own_arm_paired_on_the_same_seeds(tmp_path: Path) -> None:
    """An ablation swept under name=study_nopref is reported as 'atlas:study_nopref', beside
    (not averaged into) atlas, and paired with it seed by seed; a run whose name is the
    experiment's stays its method."""
    root = tmp_path / "multirun"
    for seed, (full, ablated) in enumerate([(-0.3, -0.4), (-0.35, -0.5), (-0.2, -0.25)]):
        write_run(root / "study", "bandit", "atlas", seed, -0.6, [[full]], [], name="study")
        write_run(root / "nopref", "bandit", "atlas", seed, -0.6, [[ablated]], [],
                  name="study_nopref")
    out = tmp_path / "out"
    _cli("atlas.report", str(root / "study"), str(root / "nopref"), "--out", str(out))
    doc = json.loads((out / "report.json").read_text())
    means = {(r["method"], r["metric"]): r["mean"] for r in doc["means"]}
    assert means[("atlas", "final_agent")] == pytest.approx(-0.85 / 3)
    assert means[("atlas:study_nopref", "final_agent")] == pytest.approx(-1.15 / 3)
    pair = next(r for r in doc["paired"] if r["metric"] == "final_agent")
    assert (pair["a"], pair["b"]) == ("atlas:study_nopref", "atlas")
    assert pair["diffs"] == pytest.approx([-0.1, -0.15, -0.05])


def test_phase_table_shows_gate_and_strategist_per_phase_of_a_recorded_run(tmp_path: Path) -> None:
    """The committed ATLAS bandit run (docs/runs/cpu_bandit_s0/atlas): phase 1's gate chose
    step_8 (gain +0.1295, 90% lower bound +0.00077 < epsilon 0.02 then, KL 5.5e-4) and
    rejected; the strategist set a score threshold, with its reason."""
    import csv

    root = Path(__file__).resolve().parents[1] / "docs" / "runs" / "cpu_bandit_s0"
    out = tmp_path / "out"
    _cli("atlas.report", str(root / "atlas"), str(root / "evotune"), "--out", str(out))
    with (out / "phases.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    atlas = [r for r in rows if r["method"] == "atlas"]
    assert [r["phase"] for r in atlas] == ["1", "2"]
    p1 = atlas[0]
    assert (p1["decision"], p1["c*"], p1["G_k"]) == ("rejected: no gain", "step_8", "1")
    assert float(p1["gain"]) == pytest.approx(0.1295, abs=1e-4)
    assert float(p1["lower"]) == pytest.approx(7.67e-4, rel=1e-2)
    assert float(p1["KL"]) == pytest.approx(5.50e-4, rel=1e-2)
    assert float(p1["S(c*)"]) - float(p1["S(ref)"]) == pytest.approx(float(p1["gain"]), abs=1e-3)
    assert p1["strategist"].startswith("score_threshold: 23 passed programs")
    assert "sa9" in p1["kinds"]
    evotune = [r for r in rows if r["method"] == "evotune"]
    assert evotune and all(r["c*"] == "-" and r["strategist"] == "-" for r in evotune)
    assert all(r["decision"] == "trained (no gate)" or r["decision"].startswith("skipped")
               for r in evotune)


def test_each_phase_says_what_the_reference_did():
    """results.json's reference_log and the summary's per-phase lines: every outcome."""
    from atlas.results import phase_line
    from atlas.train import phase_text

    ev = {"mode": "buffer", "in_sample": True, "completions": 12, "informative_completions": 8,
          "minimum": 4}
    gate = {"gain": 0.05, "lower_bound": 0.02, "kl": 0.001, "epsilon": 0.01, "delta": 0.05,
            "chosen": "step_2", "reason": "accepted", "evidence": ev}
    cases = [
        ({"phase": 1, "round": 4, "skipped": True, "reason": "no score improvement"},
         "skipped", "skipped (no score improvement)"),
        ({"phase": 2, "round": 8, "reference": "fixed"}, "fixed reference", "reference fixed"),
        ({"phase": 3, "gate": gate, "promoted": True}, "promoted",
         "G_k buffer (in-sample) 8/12 informative; gain +0.0500, lower +0.0200, KL 1.00e-03 -> "
         "promoted step_2 (accepted)"),
        ({"phase": 4, "gate": {**gate, "reason": "rejected: no gain", "lower_bound": 0.004},
          "promoted": False}, "rejected", "rejected: no gain: lower bound +0.004 < epsilon 0.01"),
        ({"phase": 5, "gate": {**gate, "reason": "rejected: KL too large", "kl": 0.2},
          "promoted": False}, "rejected", "rejected: KL too large: KL 0.2 > delta 0.05"),
        ({"phase": 6, "gate": gate, "promoted": False, "vetoed": True,
          "inspector": {"reason": "Regression: IC error spike"}}, "vetoed",
         "vetoed: Regression: IC error spike"),
        ({"phase": 7, "gate": {**gate, "reason": "insufficient evidence", "gain": None,
                               "evidence": {**ev, "informative_completions": 2}},
          "promoted": False}, "insufficient evidence",
         "insufficient evidence: 2 informative completions < gate.min_completions=4"),
    ]
    for event, outcome, text in cases:
        line = phase_line(event)
        assert line["outcome"] == outcome and line["trained"] == (outcome != "skipped")
        assert text in phase_text(line), phase_text(line)
# -- Figure 2's regime marks and the runs' provenance ---------------------------------------

def _with(run: Path, regimes: dict[int, str] | None = None,
          provenance: dict[str, Any] | None = None) -> Path:
    """Give a hand-written run per-round equations (``Program.regime``) and/or a provenance
    record in its end event."""
    if regimes:
        programs = read_jsonl(run / PROGRAMS)
        for p in programs:
            p["regime"] = regimes.get(p["round"], regimes[0])
        (run / PROGRAMS).write_text("".join(json.dumps(p) + "\n" for p in programs))
    if provenance:
        events = read_jsonl(run / EVENTS)
        events[-1]["results"]["provenance"] = provenance
        (run / EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def _png_height(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[20:24], "big")


def test_figure2_marks_the_rounds_where_the_equation_changed(tmp_path: Path) -> None:
    """PINN's viscosity steps at round 2: the loss rises there while Table 2 (on the last
    equation) reports a gain; the figure marks the change and its caption says so."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        _with(write_run(root, "pinn", "atlas", seed, -0.105, [[-0.1], [-0.18], [-0.15]],
                        [_trained(1, [], True)]),
              regimes={0: '{"nu": 0.01}', 1: '{"nu": 0.01}', 2: '{"nu": 0.001}',
                       3: '{"nu": 0.001}'})
    flat_root = tmp_path / "flat"
    write_run(flat_root, "pinn", "atlas", 0, -0.105, [[-0.1], [-0.09]], [_trained(1, [], True)])
    out, out_flat = tmp_path / "out", tmp_path / "out_flat"
    _cli("atlas.report", str(root), "--out", str(out))
    _cli("atlas.report", str(flat_root), "--out", str(out_flat))
    report = json.loads((out / "report.json").read_text())
    assert {r["run"]: r["regime_changes"] for r in report["runs"]} == \
        {"pinn_atlas_s0": [2], "pinn_atlas_s1": [2]}
    md = (out / "report.md").read_text()
    assert "Dashed lines: the task's equation changed at round 2." in md
    assert "equation changed" not in (out_flat / "report.md").read_text()
    # the caption's strip makes the marked figure taller (4.6 in against 4 in at 120 dpi)
    assert _png_height(out / "figure2_pinn.png") == 552
    assert _png_height(out_flat / "figure2_pinn.png") == 480


def test_report_shows_provenance_per_arm_and_warns_when_runs_differ(tmp_path: Path) -> None:
    base = {"git_commit": "abc", "git_dirty": False, "cpu": "EPYC", "gpu": None,
            "device": "cpu", "dtype": "float32",
            "versions": {"torch": "2.13.0", "transformers": "5.1", "peft": "0.18",
                         "lightning": "2.6", "jax": None}}
    root = tmp_path / "runs"
    _with(write_run(root, "bandit", "atlas", 0, -0.6, [[-0.5]], [_trained(1, [], True)]),
          provenance=base)
    _with(write_run(root, "bandit", "evotune", 0, -0.6, [[-0.5]], [_trained(1, [], None)]),
          provenance={**base, "versions": {**base["versions"], "torch": "2.12.0"}})
    proc = _cli("atlas.report", str(root), "--out", str(tmp_path / "out"))
    assert "bandit atlas: git_commit=abc, git_dirty=False" in proc.stdout
    assert "versions.torch=2.13.0" in proc.stdout and "versions.torch=2.12.0" in proc.stdout
    warns = [x for x in proc.stderr.splitlines() if x.startswith("warning: the runs of task bandit")]
    assert len(warns) == 1 and "versions.torch (2.13.0, 2.12.0)" in warns[0]
    assert "dtype" not in warns[0]  # only the fields that differ
    _with(write_run(tmp_path / "same", "bandit", "atlas", 1, -0.6, [[-0.5]], []), provenance=base)
    _with(write_run(tmp_path / "same", "bandit", "evotune", 1, -0.6, [[-0.5]], []),
          provenance=base)
    assert "warning" not in _cli("atlas.report", str(tmp_path / "same")).stderr


def test_provenance_of_this_process() -> None:
    from atlas.provenance import LIBRARIES, provenance

    rec = provenance("cpu", "float32")
    assert set(rec["versions"]) == set(LIBRARIES) and rec["versions"]["torch"]
    assert (rec["device"], rec["dtype"], rec["gpu"]) == ("cpu", "float32", None)
    assert rec["cpu"] and (rec["git_commit"] is None or len(rec["git_commit"]) == 40)
    assert rec["git_dirty"] in (True, False, None)


def test_notebook_finds_the_readmes_outputs_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ATLAS_RUNS the notebook reads multirun/ and outputs/ (the README's first
    command writes a single run there), from the repository root or notebooks/."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    (src,) = [c.source for c in nb.cells if "def default_runs" in c.source]
    namespace: dict[str, Any] = {}
    exec(src.split("RUNS =")[0].replace("from atlas import report", ""), namespace)  # noqa: S102
    (tmp_path / "outputs" / "cpu").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert namespace["default_runs"]() == str(tmp_path / "outputs")
    (tmp_path / "multirun").mkdir()
    assert namespace["default_runs"]() == f"{tmp_path / 'multirun'}:{tmp_path / 'outputs'}"


def test_the_separations_pair_each_question_on_its_seeds() -> None:
    """Each question a reviewer asks first is one paired row per task: the LLM over blind
    tuning, fine-tuning over sampling, the evolving reference, the supporters; a seed only one
    arm has is left out of that row."""
    from atlas.learning import separations

    def run(method: str, seed: int, agent: float, any_source: float | None = None) -> dict:
        return {"task": "bandit", "method": method, "seed": seed, "final_agent": agent,
                "final_score": agent if any_source is None else any_source}

    runs = [run("random_literals", s, -1.0) for s in (10, 11, 12)]
    runs += [run("sample", s, -0.9) for s in (10, 11, 12)]
    runs += [run("evotune", s, -0.8 + 0.1 * (s == 12)) for s in (10, 11, 12)]
    runs += [run("evodpo", s, -0.8) for s in (10, 11)]
    runs += [run("atlas", s, -0.85, -0.5 if s < 12 else None) for s in (10, 11, 12)]
    rows = {(r["question"], r["a"], r["b"]): r for r in separations(runs)}
    blind = rows[("the LLM over blind tuning", "evotune (agent's own)", "random_literals")]
    assert blind["n"] == 3 and blind["mean"] == pytest.approx((0.2 + 0.2 + 0.3) / 3)
    tuned = rows[("fine-tuning over sampling", "evotune (agent's own)", "sample (agent's own)")]
    assert tuned["wins"] == 3 and tuned["diffs"] == pytest.approx([0.1, 0.1, 0.2])
    ref = rows[("the evolving reference", "evodpo (agent's own)", "evotune (agent's own)")]
    assert ref["seeds"] == [10, 11] and ref["diffs"] == pytest.approx([0.0, 0.0])
    # the supporters within ATLAS runs: >= 0 by construction, so a decomposition, never a
    # test: per seed what the supporters' programs added (0 where the agent's was the best)
    within = rows[("the supporters, within ATLAS runs", "atlas (any source)", "atlas (agent's own)")]
    assert within["kind"] == "decomposition"
    assert within["diffs"] == pytest.approx([0.35, 0.35, 0.0]) and within["n"] == 3
    assert (within["wins"], within["losses"]) == (2, 0)
    assert all(within[k] is None for k in ("p_signed_rank", "p_min", "t_lo", "boot_lo", "ties"))
    others = [r for r in rows.values() if r is not within]
    assert others and all(r["kind"] == "exploratory" and r["p_signed_rank"] is not None
                          for r in others)
    assert ("the supporters over EvoDPO", "atlas (any source)", "evodpo") in rows


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_report_writes_beside_its_runs_never_among_their_files(tmp_path: Path) -> None:
    """`atlas.report <run folder>`: the run's own files stay byte for byte as they were, the
    report goes to <run folder>/report/, an --out that is a run folder is refused in one
    line, and the tables one run cannot fill say why instead of printing a bare header."""
    run = write_run(tmp_path / "outputs" / "cpu", "bandit", "random_literals", 0, -0.6,
                    [[-0.5, None], [-0.3]], [])
    before = _files(run)
    proc = _cli("atlas.report", str(run))
    after = {k: v for k, v in _files(run).items() if not k.startswith("report/")}
    assert after == before
    written = sorted(p.name for p in (run / "report").iterdir())
    assert "report.md" in written and "figure2_bandit.png" in written, written
    assert all(line.startswith(f"wrote {run / 'report'}") for line in proc.stdout.splitlines()
               if line.startswith("wrote "))
    assert "no rows: a paired difference needs two methods run on the same seed; these runs "\
           "hold 1 method (random_literals) on 1 seed (0)" in proc.stdout
    assert "no rows: a paired difference needs two methods" in (run / "report" / "report.md"
                                                                  ).read_text()
    # columns line up whatever the method's name: each row of Table 2 as wide as its header
    t2 = proc.stdout.split("Table 2", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert t2[0].split()[:2] == ["task", "method"] and "random_literals" in t2[1]
    assert len({len(line) for line in t2}) == 1, t2  # the last column ends where its header does
    assert t2[0].index("method") == t2[1].index("random_literals")
    refused = _cli("atlas.report", str(run), "--out", str(run), ok=False)
    assert refused.returncode == 2 and "is a run folder" in refused.stderr
    assert _files(run).keys() == {*before, *(f"report/{n}" for n in written)}


def test_the_documented_notebook_command_takes_a_relative_atlas_runs(tmp_path: Path) -> None:
    """`ATLAS_RUNS=multirun/<name> .venv/bin/jupyter execute notebooks/analysis.ipynb` as
    docs/reports.md writes it, from the folder that holds multirun/: the kernel runs in
    notebooks/, yet the relative path is the caller's, and the PNGs go to its report/."""
    here = tmp_path
    known_runs = here / "multirun" / "known"
    for seed in (0, 1):
        write_run(known_runs, "bandit", "atlas", seed, -0.6, [[-0.5, None], [-0.3 - seed / 10]],
                  [_trained(1, ["beta"], True)])
    jupyter = Path(sys.executable).with_name("jupyter")
    env = {**os.environ, "ATLAS_RUNS": "multirun/known", "PWD": str(here), "MPLBACKEND": "Agg"}
    env.pop("ATLAS_REPORT_OUT", None)
    proc = subprocess.run([str(jupyter), "execute", str(NOTEBOOK)], cwd=here, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    png = known_runs / "report" / "figure2_bandit.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert not (NOTEBOOK.parent / "multirun").exists()


# -- the verdict: the pre-registered family and the pairing check, from run folders -------

def test_report_names_a_block_on_two_secrets_and_prints_the_family(tmp_path: Path) -> None:
    """bandit, experiment=study, seeds 10-12, sample and evotune. In rounds 3-4 (phases 3-4)
    sample writes 2 new valid programs of 4, evotune 4 of 4: +0.5 on each block. Seed 12's
    evotune scored the seed program differently (another secret): the block is named, in
    the warnings and report.json, and left out of the family."""
    root = tmp_path / "multirun" / "study"
    for seed in (10, 11, 12):
        for method, late in (("sample", [-0.5, None]), ("evotune", [-0.5, -0.45])):
            initial = -0.5 if (method, seed) == ("evotune", 12) else -0.6
            run = write_run(root, "bandit", method, seed, initial,
                            [[-0.55], [-0.52], late, late], [], name="study")
            programs = read_jsonl(run / PROGRAMS)
            for i, p in enumerate(programs):  # ids of their own, and a shape and score of
                p["id"] = i                   # their own: new, not a copy or constants-only
                if p["source"] == "agent":
                    p["code"] = f"def policy():\n    return v{i}\n"
                    if p["evaluation"]["passed"]:
                        p["evaluation"]["score"] = -0.5 + 0.01 * i
            (run / PROGRAMS).write_text("".join(json.dumps(p) + "\n" for p in programs))
            if (method, seed) == ("sample", 10):  # cut at round 3 and resumed: marked
                events = read_jsonl(run / EVENTS)
                events[-1]["results"]["resumed_at"] = [3]
                (run / EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out"
    proc = _cli("atlas.report", str(root), "--out", str(out))
    resumed = "resumed: bandit sample seed 10 at round 3 (bandit_sample_s10_study)"
    assert resumed in proc.stdout and f"- {resumed}" in (out / "report.md").read_text()
    warned = [x for x in proc.stderr.splitlines() if "did not face one task secret" in x]
    assert len(warned) == 1 and warned[0].startswith("warning: bandit seed 12: ")
    assert "initial_score -0.5 (evotune) / -0.6 (sample)" in warned[0]
    doc = json.loads((out / "report.json").read_text())
    assert doc["pairing"]["unshared"] == ["bandit s12"]
    assert warned[0] in (out / "report.md").read_text()
    family = {r["question"]: r for r in doc["verdict"]["family"]}
    tuned = family["does fine-tuning help?"]
    assert tuned["blocks"] == ["bandit s10", "bandit s11"]
    assert tuned["diffs"] == pytest.approx([0.5, 0.5]) and tuned["p_signed_rank"] == 0.5
    assert tuned["p_holm"] == 1.0  # 4 x 0.5, capped: the family has four members
    assert {"task": "bandit", "seed": 12} | {"reason": tuned["left_out"][0]["reason"]} \
        in tuned["left_out"] and tuned["left_out"][0]["reason"].startswith("secrets differ")
    assert all(r["p_holm"] is None for q, r in family.items() if q != "does fine-tuning help?")
    row = next(line for line in proc.stdout.splitlines()
               if line.strip().startswith("does fine-tuning help?"))
    assert "evotune - sample" in row and "0 zero, 2 tied" in row  # two equal differences
    # p (signed-rank), p (Holm), then the blocks left out: 20 in the family's scope, 2 paired
    assert row.split()[-9:] == ["0.5", "1", "17", "no", "evotune", "run;", "1", "secrets",
                                "differ"]
    assert "Only the pre-registered family (atlas.verdict)" in proc.stdout
    # every rate's interval in [0, 1]: the valid rate per phase and the endpoints per arm
    for rows in (doc["valid_by_phase"], doc["verdict"]["endpoints"]):
        assert rows and all(0.0 <= r["lo"] <= r["hi"] <= 1.0 for r in rows if r["n"] > 1)


def test_learning_and_novelty_tables_pool_counts_per_method_and_phase() -> None:
    """Two seeds of evotune and one of atlas: one learning row and one novelty row per task,
    method, (writer) and phase, holding the seeds' counts summed, with exact p and no rate
    outside [0, 1]."""
    from atlas.learning import learning_rows, novelty_rows

    def probe(up: int, down: int, right: int, pairs: int, kl: float) -> dict[str, Any]:
        return {"valid_change": {"fail_to_pass": up, "pass_to_fail": down}, "prompts": 2,
                "samples": 4, "heldout_pairs": pairs, "heldout_right": right, "kl_base": kl,
                "score_change": 0.01, "copies_before": 1, "copies_after": 3,
                "new_valid_before": 4, "new_valid_after": 2}

    def run(method: str, seed: int, probes: list[dict[str, Any]],
            agent: list[tuple[int, int, int]]) -> dict[str, Any]:
        return {"task": "bandit", "method": method, "seed": seed,
                "reference_log": [{"phase": k + 1, "probe": p} for k, p in enumerate(probes)],
                "novelty": {"by_phase": [
                    {"phase": k + 1, "agent": {"proposals": n, "evaluated": n - c, "copies": c,
                                               "valid": nv, "new_valid": nv,
                                               "new_beats_parents": 0,
                                               "labels": {"new": n - c}}}
                    for k, (n, c, nv) in enumerate(agent)]}}

    runs = [run("evotune", 10, [probe(3, 0, 7, 8, 0.02), probe(1, 1, 5, 8, 0.03)],
                [(4, 0, 4), (4, 2, 1)]),
            run("evotune", 11, [probe(2, 0, 6, 8, 0.01), probe(0, 2, 3, 8, 0.01)],
                [(4, 1, 3), (4, 4, 0)]),
            run("atlas", 10, [probe(0, 0, 1, 2, 0.0)], [(4, 0, 2)])]
    rows = {(r["method"], r["phase"]): r for r in learning_rows(runs)}
    assert sorted(rows) == [("atlas", 1), ("evotune", 1), ("evotune", 2)]
    e1 = rows[("evotune", 1)]
    assert e1["n"] == 2 and e1["slots"] == 16
    assert e1["valid_change"] == {"fail_to_pass": 5, "pass_to_fail": 0, "p": 2 / 32}
    assert e1["heldout"] == {"pairs": 16, "right": 13, "accuracy": 13 / 16,
                             "p": pytest.approx(2 * (560 + 120 + 16 + 1) / 2 ** 16)}
    assert rows[("atlas", 1)]["heldout"]["accuracy"] is None  # 2 pairs: too few
    assert e1["copies"] == {"before": 2, "after": 6}
    assert rows[("evotune", 2)]["kl_base"]["lo"] >= 0.0  # floored: a KL is never negative
    novel = {(r["method"], r["phase"]): r for r in novelty_rows(runs)}
    assert sorted(novel) == [("atlas", 1), ("evotune", 1), ("evotune", 2)]
    e2 = novel[("evotune", 2)]
    assert (e2["seeds"], e2["proposals"], e2["copies"], e2["new_valid"]) == (2, 8, 6, 1)
    assert e2["copy_rate"] == 6 / 8 and e2["new_valid_per_proposal"] == 1 / 8
    assert all(0.0 <= r[k] <= 1.0 for r in novel.values()
               for k in ("copy_rate", "new_valid_per_proposal") if r[k] is not None)
