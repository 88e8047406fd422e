"""The W&B dashboard (``python -m atlas.dashboard``), checked offline against a real run.

One tiny ATLAS run (``experiment=test method=atlas logger=wandb``, W&B offline) is made per
module; the keys its offline W&B files hold are what the dashboard's panels may name. The
workspace is built, never saved (saving needs a W&B server).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from atlas.dashboard import SECTIONS, build_workspace, charts, panel_keys
from atlas.telemetry import EVENTS, read_jsonl
from tests.test_wandb import ROOT, read_offline_run, series, sweep_env

# the sweep test's cheap tiny run (tests/test_wandb.py): two rounds, a phase after each, and
# every phase trained so that DPO, the gate and the strategist all log
RUN_OVERRIDES = ["experiment=test", "logger=wandb", "method=atlas", "progress=false",
                 "explore.rounds=2", "explore.phase_every=1", "task.env_seeds=[0]", "task.T=500",
                 "method.skip_without_improvement=false"]


@pytest.fixture(scope="module")
def atlas_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("dashboard")
    run_dir = base / "run"
    cmd = [sys.executable, "-m", "atlas.train", *RUN_OVERRIDES, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=base, env=sweep_env(base), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return run_dir


def logged_keys(run: dict[str, Any]) -> set[str]:
    """Every history key of an offline run, plus the names of the tables it logged."""
    keys = {k for row in run["history"] for k in row}
    tables = {k[: -len("/_type")] for row in run["history"] for k, v in row.items()
              if k.endswith("/_type") and v == "table-file"}
    return keys | tables


def test_every_panel_names_a_key_the_run_logs(atlas_run: Path) -> None:
    keys = logged_keys(read_offline_run(atlas_run))
    pending = {c.title for c in charts() if c.pending}
    panels = panel_keys(build_workspace("atlas", "someone", group="a_sweep"))
    assert len(panels) == len(charts())  # every chart became a panel (the intro has no keys)
    missing = []
    for title, names, regex in panels:
        absent = [k for k in names if k not in keys]
        if regex is not None and not any(re.search(regex, k) for k in keys):
            absent.append(f"/{regex}/")
        if absent and title not in pending:
            missing.append((title, absent))
    assert not missing, f"panels name keys the run never logged: {missing}"
    # the pending panel waits for the sampler's fields: say so while it is empty
    for title, names, _ in panels:
        if title in pending and not set(names) <= keys:
            print(f"pending panel {title!r}: {sorted(set(names) - keys)} not logged yet")


def test_the_new_round_and_phase_series_agree_with_the_run_files(atlas_run: Path) -> None:
    run = read_offline_run(atlas_run)
    results = json.loads((atlas_run / "results.json").read_text())
    events = read_jsonl(atlas_run / EVENTS)
    rounds = [e for e in events if e["event"] == "round"]
    # the agent-only best, round by round, is results.json's (the supporter-copy rule included)
    assert series(run, "round/best_agent") == pytest.approx(
        [b for b in results["best_by_round_agent"][1:] if b is not None])
    assert series(run, "round/best") == pytest.approx([e["best"] for e in rounds])
    # the supporter's actions are the sums of each round's exploration events
    explorations = [e for e in events if e["event"] == "exploration"]
    assert explorations, "ATLAS's exploration supporter reviewed no island"
    for key, field in (("patches", "patches"), ("patches_as_preferences", "as_preferences")):
        per_round = [sum(e[field] for e in explorations if e["round"] == r["round"])
                     for r in rounds]
        assert series(run, f"round/supporters/{key}") == per_round
    assert series(run, "round/supporters/reviews") == [
        sum(1 for e in explorations if e["round"] == r["round"]) for r in rounds]
    gated = [e for e in events if e["event"] == "phase" and e.get("gate")]
    assert series(run, "phase/gate/insufficient_evidence") == [
        float(e["gate"]["reason"] == "insufficient evidence") for e in gated]
    assert series(run, "phase/gate/lower_bound") == pytest.approx(
        [e["gate"]["lower_bound"] for e in gated])


def test_the_workspace_shows_one_sweep_grouped_by_method() -> None:
    workspace = build_workspace("atlas", "someone", group="bandit_sweep")
    assert "bandit_sweep" in workspace.runset_settings.filters
    assert [g.name for g in workspace.runset_settings.groupby] == ["JobType"]
    assert [s.name for s in workspace.sections] == [title for title, _ in SECTIONS]
    project = build_workspace("atlas", "someone", per_run=True)
    assert project.runset_settings.filters == "" and project.runset_settings.groupby == []


def test_print_writes_the_spec_without_a_server() -> None:
    proc = subprocess.run([sys.executable, "-m", "atlas.dashboard", "--print", "--group", "s1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == [title for title, _ in SECTIONS]
    plots = [p for s in sections for p in s["panels"] if p["viewType"] == "Run History Line Plot"]
    assert {p["config"]["xAxis"] for p in plots} == {"round/round", "phase/phase", "_step"}


def test_docs_describe_every_panel() -> None:
    text = (ROOT / "docs" / "dashboard.md").read_text()
    assert [c.title for c in charts() if c.title not in text] == []


def test_saving_without_a_login_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in sweep_env(tmp_path).items() if k != "WANDB_API_KEY"}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"))
    proc = subprocess.run([sys.executable, "-m", "atlas.dashboard", "--group", "s1"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "wandb login" in lines[0] and "Traceback" not in proc.stderr
