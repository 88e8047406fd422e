"""Crash-safe resume, proven by ``kill -9``: a killed and re-run job equals an uninterrupted one.

What is compared: ``results.json``, ``programs.jsonl`` and ``events.jsonl`` of the resumed run
against those of an uninterrupted run with the same seed, after removing wall-clock fields
(``VOLATILE``: ``seconds``, ``wall_seconds``, ``seconds_dpo``, ``seconds_gate`` and its parts,
``reference_table_seconds`` and the phase clock's ``{forward,backward,optimizer}_seconds``,
``load`` (the machine's load average), and ``agent_threads``, the thread counts generation ran with,
which follow when sandbox workers happened to be busy; they measure time and scheduling,
which no two runs share) and the ``config`` event's ``run_dir`` (the two runs live in
different folders). Everything else, scores, metrics, DPO losses, KL, gate decisions, every
program's code, must be equal bit for bit.

The fast test runs the tiny model (atlas/agent/tiny.py) through ``python -m tests.test_resume``,
a driver that passes each tiny-model sample through ``decode_completion``: a deterministic map
from the sampled text to a bandit program (window/alpha from a hash of the sample; one in four
broken). The tiny model still samples for real with its trained policy adapter, so a wrong
generation seed, a lost adapter or a lost optimiser state after resume changes the hash and
the programs. The driver SIGKILLs itself inside the DPO training of phase ``KILL_PHASE``,
i.e. mid-round with that round's programs already in the JSONL files (a deterministic kill
point, unlike a timer). The slow test runs the real SmolLM2 agent unmodified
(``python -m atlas.train``) and kills it from outside while a round is in flight.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from atlas import checkpoint
from tests.conftest import PINNED_SECRET, as_from_a_terminal

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = frozenset({"seconds", "wall_seconds", "seconds_dpo", "seconds_gate", "seconds_gate_parts",
                      "seconds_probe", "share_of_phase",
                      "reference_table_seconds", "agent_threads",
                      # the DPO module's part clock (atlas.dpo.module)
                      "forward_seconds", "backward_seconds", "optimizer_seconds",
                      # the round event's sampler timings
                      "setup_s", "prefill_s", "decode_s", "tok_s",
                      # results.json: the machine's load and this process tree's CPU seconds
                      "load",
                      # results.json: the rounds a run was resumed at (a resumed run is marked)
                      "resumed_at"})
KILL_PHASE = 3  # fast test: phases 1-2 train before the kill, 3-4 after it
MARKER_ENV = "ATLAS_RESUME_TEST_KILL_MARKER"  # driver: kill once, then leave a marker file
KILL_PHASE_ENV = "ATLAS_RESUME_TEST_KILL_PHASE"
KILL_SIGNAL_ENV = "ATLAS_RESUME_TEST_KILL_SIGNAL"  # SIGKILL (default) or SIGTERM

FAST = ["experiment=test", "method=atlas", "seed=0", "explore.rounds=4", "explore.phase_every=1",
        "task.T=300", "task.env_seeds=[0,1]", "dpo.max_length=512", "gate.max_length=512",
        "method.skip_without_improvement=false", "progress=false",
        # two prompts per phase (the gate decides on its buffer, gate.evidence=auto), and an
        # epsilon below any gain so the tiny model's phases promote: these tests are about
        # resuming a promoted reference, not about the gate's judgement (tests/test_gate.py)
        "explore.islands_per_round=2", "gate.epsilon=-1.0"]

# body of the sliding-window LinUCB the bandit seed program is (continues its prefill)
_BODY = """
    window = {window}
    alpha = {alpha}
    d = contexts.shape[1]
    A = np.eye(d)
    b = np.zeros(d)
    for arm, x, reward in history[-window:]:
        A += np.outer(x, x)
        b += reward * x
    A_inv = np.linalg.inv(A)
    theta = A_inv @ b
    bonus = np.sqrt(np.sum((contexts @ A_inv) * contexts, axis=1))
    return int(np.argmax(contexts @ theta + alpha * bonus))
"""
_WINDOWS = (10, 25, 50, 100, 200, 300)
_ALPHAS = (0.1, 0.3, 1.0, 2.0)


def decode_completion(sample: str) -> str:
    """A bandit program determined by ``sample`` (the tiny model's text): same text, same code."""
    h = hashlib.blake2b(sample.encode("utf-8", "replace"), digest_size=8).digest()
    if h[2] % 4 == 0:
        return "\n    return 0.5\n"  # wrong return type: a failed candidate for D_k's pairs
    return _BODY.format(window=_WINDOWS[h[0] % len(_WINDOWS)], alpha=_ALPHAS[h[1] % len(_ALPHAS)])


# ---- helpers ------------------------------------------------------------------------------
def strip_wall_clock(obj: Any) -> Any:
    """``obj`` without the wall-clock fields (``VOLATILE``) at any depth."""
    if isinstance(obj, dict):
        return {k: strip_wall_clock(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [strip_wall_clock(v) for v in obj]
    return obj


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def comparable(run_dir: Path) -> dict[str, Any]:
    """What must be equal between two runs of the same seed (module docstring)."""
    events = strip_wall_clock(_jsonl(run_dir / "events.jsonl"))
    for e in events:
        if e["event"] == "config":
            e["config"].pop("run_dir", None)
    return {"results": strip_wall_clock(json.loads((run_dir / "results.json").read_text())),
            "programs": strip_wall_clock(_jsonl(run_dir / "programs.jsonl")),
            "events": events}


def _env(marker: Path | None = None, sig: str = "SIGKILL") -> dict[str, str]:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "2"}
    env.pop(MARKER_ENV, None)
    if marker is not None:
        env[MARKER_ENV] = str(marker)
        env[KILL_PHASE_ENV] = str(KILL_PHASE)
        env[KILL_SIGNAL_ENV] = sig
    return env


def _driver_cmd(run_dir: Path, overrides: list[str]) -> list[str]:
    # the runs of one comparison share a task secret, so they face the same hidden
    # environments (docs/sandbox.md: a fresh run folder draws a fresh secret otherwise)
    secret = f"sandbox.secret_file={run_dir.parent / 'task.secret'}"
    return [sys.executable, "-m", "tests.test_resume", *overrides, secret,
            "sandbox.create_secret=true",
            f"hydra.run.dir={run_dir}"]


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=as_from_a_terminal)


def _assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The dotted paths at which ``a`` and ``b`` differ, each with both values: a failed
    comparison names its fields instead of printing two whole records."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys(), key=str)
                for d in differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: {a!r:.200} != {b!r:.200}"]


def _assert_equal_runs(resumed: dict[str, Any], clean: dict[str, Any]) -> None:
    assert len(resumed["programs"]) == len(clean["programs"])
    for a, b in zip(resumed["programs"], clean["programs"]):
        assert a == b, f"program {b['id']} differs after resume: {differences(a, b)}"
    assert [e["event"] for e in resumed["events"]] == [e["event"] for e in clean["events"]]
    for a, b in zip(resumed["events"], clean["events"]):
        assert a == b, (f"{b['event']} event of round {b.get('round')} differs after resume: "
                        f"{differences(a, b)}")
    assert resumed["results"] == clean["results"], differences(resumed["results"], clean["results"])


def _rounds_once(events: list[dict[str, Any]], rounds: int) -> None:
    assert [e["round"] for e in events if e["event"] == "round"] == list(range(1, rounds + 1))
    assert [e["event"] for e in events].count("end") == 1


# ---- fast: tiny model, deterministic self-kill inside a DPO phase -----------------------------
@pytest.fixture(scope="module")
def fast_runs() -> Iterator[dict[str, Any]]:
    """An uninterrupted run and a run killed in phase KILL_PHASE's DPO then re-run (same cmd).

    A private temp folder, not ``tmp_path_factory``: concurrent pytest sessions of one user
    prune each other's old basetemp folders, and these runs outlive several tests."""
    with tempfile.TemporaryDirectory(prefix="atlas-resume-") as tmp:
        yield _fast_runs(Path(tmp))


def _fast_runs(base: Path) -> dict[str, Any]:
    clean_dir, killed_dir, marker = base / "clean", base / "killed", base / "killed.marker"
    # the runs share base/task.secret (``_driver_cmd``); written here, not drawn, so that
    # which phases find pairs and which promote (the tests below count them) is the same
    # every session
    (base / "task.secret").write_text(PINNED_SECRET + "\n")
    (base / "task.secret").chmod(0o600)
    t0 = time.perf_counter()
    _assert_ok(_run(_driver_cmd(clean_dir, FAST), _env(), timeout=600))
    t_clean = time.perf_counter() - t0
    cmd = _driver_cmd(killed_dir, FAST)
    first = _run(cmd, _env(marker), timeout=600)
    after_kill = {"rc": first.returncode, "marker": marker.exists(),
                  "results": (killed_dir / "results.json").exists(),
                  "state": checkpoint.load(killed_dir),
                  "events": _jsonl(killed_dir / "events.jsonl")}
    t0 = time.perf_counter()
    second = _run(cmd, _env(marker), timeout=600)
    _assert_ok(second)
    t_resume = time.perf_counter() - t0
    # the same kill point, by SIGTERM (what SLURM and `kill` send first)
    termed_dir, term_marker = base / "termed", base / "termed.marker"
    term_cmd = _driver_cmd(termed_dir, FAST)
    termed = _run(term_cmd, _env(term_marker, "SIGTERM"), timeout=600)
    after_term = {"proc": termed, "marker": term_marker.exists(),
                  "results": (termed_dir / "results.json").exists(),
                  "state": checkpoint.load(termed_dir),
                  "events": _jsonl(termed_dir / "events.jsonl")}
    term_resumed = _run(term_cmd, _env(term_marker, "SIGTERM"), timeout=600)
    _assert_ok(term_resumed)
    return {"clean": clean_dir, "killed": killed_dir, "cmd": cmd, "marker": marker,
            "after_kill": after_kill, "second": second, "termed": termed_dir,
            "after_term": after_term,
            "timings": {"clean_s": t_clean, "resume_s": t_resume}}


def test_kill9_lands_mid_round_after_trained_phases(fast_runs: dict[str, Any]) -> None:
    k = fast_runs["after_kill"]
    assert k["rc"] == -signal.SIGKILL and k["marker"] and not k["results"]
    assert k["state"]["next_round"] == KILL_PHASE  # round KILL_PHASE was in flight
    rounds_written = [e["round"] for e in k["events"] if e["event"] == "round"]
    assert rounds_written == list(range(1, KILL_PHASE + 1))  # the crashed round's lines exist
    phases = [e for e in k["events"] if e["event"] == "phase"]
    assert [p["phase"] for p in phases] == list(range(1, KILL_PHASE))
    assert all(not p.get("skipped") and p["dpo"]["steps"] >= 1 for p in phases), \
        "the phases before the kill must train"
    assert "resumed from round 3" in fast_runs["second"].stderr + fast_runs["second"].stdout


def test_resumed_run_equals_uninterrupted_run(fast_runs: dict[str, Any]) -> None:
    clean, resumed = comparable(fast_runs["clean"]), comparable(fast_runs["killed"])
    _rounds_once(resumed["events"], 4)
    trained = [e for e in resumed["events"] if e["event"] == "phase" and not e.get("skipped")]
    # phases 1-2 trained before the kill, phase 3 (killed in its DPO) after it; phase 4 may
    # find no pair once supporter programs have taken its round's agent samples (one budget)
    assert [e["phase"] for e in trained][:3] == [1, 2, 3]
    assert any(e["promoted"] for e in trained) and resumed["results"]["promotions"] >= 1
    assert any(p["source"] == "supporter" for p in resumed["programs"])
    assert resumed["results"]["valid_rate"] not in (None, 0.0, 1.0)
    _assert_equal_runs(resumed, clean)
    marks = [json.loads((fast_runs[k] / "results.json").read_text())["resumed_at"]
             for k in ("killed", "clean")]
    assert marks == [[KILL_PHASE], []]  # the resumed run says where it was resumed


def test_sigterm_in_a_phase_stops_at_once_and_resumes(fast_runs: dict[str, Any]) -> None:
    """SIGTERM inside phase KILL_PHASE's first DPO step: the process ends there (status 143,
    no further round or phase), the checkpoint is the last finished round's, and re-running
    the same command gives the uninterrupted run's results."""
    t = fast_runs["after_term"]
    out = t["proc"].stdout + t["proc"].stderr
    assert t["proc"].returncode == 143, out[-3000:]
    assert t["marker"] and not t["results"]
    assert "SIGTERM: stopped" in out and "re-run the same command" in out
    assert t["state"]["next_round"] == KILL_PHASE
    assert [e["phase"] for e in t["events"] if e["event"] == "phase"] == list(range(1, KILL_PHASE))
    assert max(e["round"] for e in t["events"] if e["event"] == "round") == KILL_PHASE
    _assert_equal_runs(comparable(fast_runs["termed"]), comparable(fast_runs["clean"]))


def test_ctrl_c_in_a_phase_stops_like_sigterm_and_resumes(fast_runs: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) inside phase KILL_PHASE's first DPO step. Lightning catches a
    KeyboardInterrupt in ``fit`` and exits 1 without a word; atlas turns SIGINT into the same
    stop as SIGTERM: status 130, one line, the last finished round's checkpoint, no temporary
    file, and the re-run equals the uninterrupted run."""
    run_dir, marker = tmp_path / "interrupted", tmp_path / "interrupted.marker"
    shutil.copyfile(fast_runs["clean"].parent / "task.secret", tmp_path / "task.secret")
    cmd = _driver_cmd(run_dir, FAST)  # the clean run's secret: the same hidden environments
    first = _run(cmd, _env(marker, "SIGINT"), timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 130 and marker.exists(), out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    stops = [line for line in out.splitlines() if "stopped" in line]
    assert len(stops) == 1 and "SIGINT: stopped" in stops[0], out[-3000:]
    assert stops[0].endswith("keeps the checkpoint of the last finished round; re-run the same "
                             "command to resume")
    assert checkpoint.load(run_dir)["next_round"] == KILL_PHASE
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    _assert_ok(_run(cmd, _env(marker, "SIGINT"), timeout=600))
    resumed, clean = comparable(run_dir), comparable(fast_runs["clean"])
    for events in (resumed["events"], clean["events"]):  # the same secret, copied elsewhere
        events[0]["config"]["sandbox"].pop("secret_file")
    _assert_equal_runs(resumed, clean)


def test_rerunning_a_finished_run_is_a_noop(fast_runs: dict[str, Any]) -> None:
    run_dir = fast_runs["killed"]
    files = ["results.json", "events.jsonl", "programs.jsonl", "checkpoint/state.pt"]
    before = {f: ((run_dir / f).read_bytes(), (run_dir / f).stat().st_mtime_ns) for f in files}
    proc = _run(fast_runs["cmd"], _env(fast_runs["marker"]), timeout=600)
    _assert_ok(proc)
    assert "already holds a finished run" in proc.stderr + proc.stdout
    assert {f: ((run_dir / f).read_bytes(), (run_dir / f).stat().st_mtime_ns) for f in files} == before
    final = json.loads((run_dir / "results.json").read_text())["final_score"]
    assert f"final {final:.4g}" in proc.stdout


# ---- checkpoint files --------------------------------------------------------------------------
def test_stale_tmp_file_is_ignored_and_removed(tmp_path: Path) -> None:
    state = {"next_round": 3, "x": torch.arange(4)}
    checkpoint.save(tmp_path, state)
    stale = tmp_path / "checkpoint" / ".state.pt.4242.tmp"  # a save killed before os.replace
    stale.write_bytes(b"\x80\x02half a pickle")
    os.utime(stale, (time.time() + 60, time.time() + 60))  # newer than state.pt: still ignored
    loaded = checkpoint.load(tmp_path)
    assert loaded["next_round"] == 3 and torch.equal(loaded["x"], state["x"])
    assert not stale.exists() and checkpoint.stale_tmp_files(tmp_path) == []


def test_save_replaces_atomically_and_leaves_no_tmp(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, {"next_round": 1})
    checkpoint.save(tmp_path, {"next_round": 2})
    assert checkpoint.load(tmp_path)["next_round"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["state.pt"]


def test_unreadable_checkpoint_names_the_file_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match=r"state\.pt is unreadable.*resume=false"):
        checkpoint.load(tmp_path)
    torch.save({"something": 1}, tmp_path / "checkpoint" / "state.pt")
    with pytest.raises(RuntimeError, match="next_round"):
        checkpoint.load(tmp_path)
    assert checkpoint.load(tmp_path / "fresh") is None


# ---- torn JSONL lines and the recorded configuration --------------------------------------------
def _torn_run(tmp_path: Path, keep_tail: bool) -> Path:
    """Two checkpointed events, the last one then torn (the file lost its last 10 bytes, e.g. a
    copy cut short), a resume from the checkpoint, and two more events."""
    from atlas.telemetry import EVENTS, Telemetry

    tel = Telemetry(tmp_path)
    tel.event("config", config={"seed": 0})
    tel.event("round", round=1, best=-0.5)
    offsets = tel.offsets()
    if not keep_tail:  # a checkpoint written before checkpoints kept the files' tails
        offsets.pop("tail")
    checkpoint.save(tmp_path, {"next_round": 2, "telemetry": offsets})
    tel.close()
    path = tmp_path / EVENTS
    path.write_bytes(path.read_bytes()[:-10])
    tel = Telemetry(tmp_path)
    tel.truncate_to(checkpoint.load(tmp_path)["telemetry"])
    tel.event("round", round=2, best=-0.4)
    tel.event("round", round=3, best=-0.3)
    tel.close()
    return path


def test_resume_after_a_torn_checkpointed_line_loses_nothing_and_pads_nothing(
        tmp_path: Path) -> None:
    """Before: ``truncate`` past the torn end padded the file with NUL bytes, and the first
    record written after the resume was glued onto the torn line (both lost)."""
    path = _torn_run(tmp_path, keep_tail=True)
    data = path.read_bytes()
    assert b"\x00" not in data
    assert [e.get("round") for e in _jsonl(path)] == [None, 1, 2, 3]


def test_a_torn_line_the_checkpoint_cannot_restore_is_dropped_not_padded(tmp_path: Path) -> None:
    path = _torn_run(tmp_path, keep_tail=False)
    assert b"\x00" not in path.read_bytes()
    assert [e.get("round") for e in _jsonl(path)] == [None, 2, 3]  # only the torn record is lost


SMALL = ["experiment=test", "method=evotune", "explore.rounds=2", "explore.phase_every=2", "progress=false",
         "task.T=200", "task.env_seeds=[0]", "explore.samples_per_prompt=2"]


def test_a_run_folder_keeps_the_configuration_that_produced_it(tmp_path: Path) -> None:
    """Re-running a run folder with other settings is refused, listing the keys (old -> new)
    and the fix; invocation keys may differ; ``.hydra/config.yaml`` is written once, when the
    run starts at round 0, so it always describes the results next to it."""
    from atlas.runfolder import RunFolderError
    from atlas.train import run
    from tests.conftest import compose_cfg

    run(compose_cfg(SMALL, run_dir=tmp_path))
    files = ["results.json", "events.jsonl", "programs.jsonl", "checkpoint/state.pt",
             ".hydra/config.yaml"]
    before = {f: (tmp_path / f).read_bytes() for f in files}
    assert "beta: 0.1" in before[".hydra/config.yaml"].decode()
    with pytest.raises(RunFolderError) as err:
        run(compose_cfg([*SMALL, "dpo.beta=0.2", "explore.rounds=3"], run_dir=tmp_path))
    assert str(err.value) == (
        f"{tmp_path} holds a run made with another configuration (dpo.beta: 0.1 -> 0.2, "
        f"explore.rounds: 2 -> 3); re-run with its settings to continue it, add name=<new> for a "
        f"new run folder, or resume=false to overwrite it")
    assert {f: (tmp_path / f).read_bytes() for f in files} == before
    # how a run is driven, where it runs and logs may differ: the finished run is returned
    again = run(compose_cfg([*SMALL, "progress=true", "device=cpu", "name=other"],
                            run_dir=tmp_path))
    assert again["final_score"] == json.loads(before["results.json"])["final_score"]
    assert {f: (tmp_path / f).read_bytes() for f in files} == before
    # resume=false overwrites the run, and the recorded config with it
    run(compose_cfg([*SMALL, "dpo.beta=0.2", "resume=false"], run_dir=tmp_path))
    assert "beta: 0.2" in (tmp_path / ".hydra" / "config.yaml").read_text()
    assert _jsonl(tmp_path / "events.jsonl")[0]["config"]["dpo"]["beta"] == 0.2


def test_rng_state_round_trip() -> None:
    import random

    import numpy as np

    saved = checkpoint.rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    checkpoint.set_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


# ---- the sandbox: a candidate's own randomness is reproducible across worker processes ------
def test_unseeded_candidate_randomness_scores_the_same_in_fresh_workers() -> None:
    from atlas.sandbox import Resources, Sandbox
    from atlas.tasks import make_task

    task = make_task("bandit", T=200, env_seeds=[0])
    code = ("import numpy as np\nimport random\n\ndef policy(contexts, history, t, state):\n"
            "    return int(np.random.randint(0, 5)) if random.random() < 0.9 else 0\n")
    scores = []
    for _ in range(2):  # two sandboxes: two worker processes with fresh entropy
        with Sandbox.for_task(task, secret="ab" * 32, resources=Resources(workers=1)) as sb:
            ev = sb.evaluate(code, task.context(1))
        assert ev.passed, ev.message
        scores.append(ev.score)
    assert scores[0] == scores[1]


# ---- slow: the real SmolLM2 agent, killed from outside while a round is in flight -------------
SMOLLM2 = ["method=atlas", "model=smollm2", "seed=0", "logger=none", "explore.islands=2",
           "explore.rounds=3", "explore.phase_every=1", "explore.samples_per_prompt=4",
           "explore.max_new_tokens=160", "explore.temperatures=[0.3,0.5]", "explore.workers=1",
           "dpo.max_pairs=4", "dpo.checkpoints=1", "gate.subset_size=2", "task.T=500",
           "method.skip_without_improvement=false", "progress=false"]


def _wait_for_event(proc: subprocess.Popen, events: Path, kind: str, round_: int,
                    timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (rc={proc.returncode}) before the kill point"
        if events.exists() and any(e["event"] == kind and e.get("round") == round_
                                   for e in _safe_jsonl(events)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event of round {round_} within {timeout} s")


def _safe_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            pass
    return rows


@pytest.mark.slow
def test_smollm2_run_killed_by_sigkill_resumes_to_the_same_results(tmp_path: Path) -> None:
    """Real agent, real DPO phases: kill -9 once round 2 is in flight (its exploration done,
    phase 2 not yet), re-run the same command, compare with an uninterrupted run."""
    cmd = [sys.executable, "-m", "atlas.train", *SMOLLM2]
    clean_dir, killed_dir = tmp_path / "clean", tmp_path / "killed"
    _assert_ok(_run([*cmd, f"hydra.run.dir={clean_dir}"], _env(), timeout=3600))
    killed_cmd = [*cmd, f"hydra.run.dir={killed_dir}"]
    proc = subprocess.Popen(killed_cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for_event(proc, killed_dir / "events.jsonl", "exploration", 2, timeout=3000)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert checkpoint.load(killed_dir)["next_round"] == 2 and not (killed_dir / "results.json").exists()
    _assert_ok(_run(killed_cmd, _env(), timeout=3600))
    clean, resumed = comparable(clean_dir), comparable(killed_dir)
    _rounds_once(resumed["events"], 3)
    trained = [e["phase"] for e in resumed["events"] if e["event"] == "phase" and not e.get("skipped")]
    assert 1 in trained and any(p >= 2 for p in trained), f"trained phases: {trained}"
    _assert_equal_runs(resumed, clean)


# ---- driver: python -m tests.test_resume <hydra overrides> -----------------------------------
def _install_test_hooks() -> None:
    """Decode tiny-model samples into programs; SIGKILL this process once, inside phase
    ``$ATLAS_RESUME_TEST_KILL_PHASE``'s first DPO step, unless the marker file exists."""
    from atlas.agent.research_agent import ResearchAgent
    from atlas.dpo.module import DPOModule
    from atlas.fine_tuning import FineTuner

    sample, sample_batch = ResearchAgent.generate, ResearchAgent.generate_batch

    def generate(self: ResearchAgent, prompts: list[str], num_samples: int,
                 **kw: Any) -> list[list[str]]:
        return [[decode_completion(t) for t in row] for row in sample(self, prompts, num_samples, **kw)]

    def generate_batch(self: ResearchAgent, requests: list[Any], **kw: Any) -> list[list[str]]:
        return [[decode_completion(t) for t in row] for row in sample_batch(self, requests, **kw)]

    ResearchAgent.generate = generate  # type: ignore[method-assign]
    ResearchAgent.generate_batch = generate_batch  # type: ignore[method-assign]
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        return
    kill_phase, current = int(os.environ[KILL_PHASE_ENV]), {"phase": 0}
    run_phase, batch_end = FineTuner.run_phase, DPOModule.on_train_batch_end

    def tracked_run_phase(self: FineTuner, phase: int, *args: Any, **kw: Any) -> dict[str, Any]:
        current["phase"] = phase
        return run_phase(self, phase, *args, **kw)

    def killing_batch_end(self: DPOModule, *args: Any, **kw: Any) -> None:
        batch_end(self, *args, **kw)
        if current["phase"] == kill_phase and not Path(marker).exists():
            Path(marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), getattr(signal, os.environ.get(KILL_SIGNAL_ENV, "SIGKILL")))

    FineTuner.run_phase = tracked_run_phase  # type: ignore[method-assign]
    DPOModule.on_train_batch_end = killing_batch_end  # type: ignore[method-assign]


def _driver_main() -> None:
    """``atlas.train.main`` with the hooks installed (config path absolute: run as a module
    outside ``atlas``, Hydra would look for ``conf`` relative to this file)."""
    import hydra

    from atlas import train

    _install_test_hooks()

    @hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="train")
    def main(cfg: Any) -> float | None:
        return train.run(cfg)["final_score"]

    sys.argv = train.hoist_multirun_flag(sys.argv)
    main()


if __name__ == "__main__":
    _driver_main()
