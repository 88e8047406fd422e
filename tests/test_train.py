"""End-to-end runs of the loop: the run folder holds everything the issue lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atlas.sandbox.secret import fingerprint
from atlas.telemetry import read_jsonl
from atlas.train import run
from tests.conftest import ROOT, as_from_a_terminal, compose_cfg

RESULT_KEYS = {"task", "method", "seed", "initial_score", "final_score", "improvement_pct",
               "rounds", "candidates", "valid_rate_first_round", "valid_rate_last_round",
               "wall_seconds", "phases", "promotions", "accept_rate", "intervention_rates"}


def _check_run_folder(run_dir: Path, rounds: int, samples: int, islands_per_round: int) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    assert RESULT_KEYS <= set(results)
    events = read_jsonl(run_dir / "events.jsonl")
    assert all("event" in e for e in events)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "config" and kinds[-1] == "end"
    assert [e["round"] for e in events if e["event"] == "round"] == list(range(1, rounds + 1))
    programs = read_jsonl(run_dir / "programs.jsonl")
    agent = [p for p in programs if p["source"] == "agent"]
    assert len(agent) == rounds * samples * islands_per_round == results["candidates"] - sum(
        1 for p in programs if p["source"] == "supporter")
    for p in programs:
        assert {"island", "parents", "code", "evaluation", "prompt", "completion"} <= set(p)
        assert "failure_kind" in p["evaluation"] and "score" in p["evaluation"]
    assert all(p["parents"] for p in agent)  # every sampled program names the programs it saw
    assert len({p["id"] for p in programs}) == len(programs)
    return results


@pytest.mark.parametrize("method, workers", [("evotune", None), ("evodpo", "auto")])
def test_tiny_run_writes_results_events_and_programs(method: str, workers: str | None,
                                                     tmp_path: Path, capsys) -> None:
    from atlas.loop import usable_cores

    more = [f"explore.workers={workers}"] if workers else []
    cfg = compose_cfg(["experiment=test", f"method={method}", *more], run_dir=tmp_path)
    results = run(cfg)
    # experiment=test's one worker, or auto: one per usable core, at most a round's candidates
    assert results["sandbox_workers"] == (1 if workers is None else min(
        usable_cores(), cfg.explore.islands_per_round * cfg.explore.samples_per_prompt))
    out = capsys.readouterr().out
    assert "initial" in out and "final" in out and "valid programs" in out
    checked = _check_run_folder(tmp_path, cfg.explore.rounds, cfg.explore.samples_per_prompt,
                                cfg.explore.islands_per_round)
    assert checked["method"] == method and results["seed"] == 0
    assert results["phases"] == cfg.explore.rounds // cfg.explore.phase_every
    # the initial score is the seed program's, scored on this run's hidden environments (a
    # fresh task secret per single run moves it by a few hundredths around -0.375)
    seeds = {p["evaluation"]["score"] for p in read_jsonl(tmp_path / "programs.jsonl")
             if p["source"] == "seed"}  # one copy per island, all scored alike
    assert seeds == {results["initial_score"]}
    assert -0.45 < results["initial_score"] < -0.3
    # the secret's fingerprint, so a report can check pairing (atlas.pairing), never the secret
    secret = (tmp_path / ".task_secret").read_text()
    assert results["secret_fingerprint"] == fingerprint(secret)
    assert secret.strip() not in (tmp_path / "results.json").read_text()
    # the adapters to take away (tests/test_take_away.py loads them); the reference is the
    # base model until a promotion (EvoTune: always)
    adapters = json.loads((tmp_path / "adapters" / "base_model.json").read_text())
    promoted = method != "evotune" and results["promotions"] > 0
    assert adapters["folders"]["reference"].startswith(
        "the reference: phase " if promoted else "the reference: base")
    for folder in ("policy", "reference"):
        assert (tmp_path / "adapters" / folder / "adapter_model.safetensors").is_file()


def test_unknown_task_fails_before_loading_anything(tmp_path: Path) -> None:
    cfg = compose_cfg(["experiment=test"], run_dir=tmp_path)
    cfg.task.name = "chemistry"
    with pytest.raises(ValueError, match="chemistry"):
        run(cfg)
    assert not (tmp_path / "events.jsonl").exists()


SMALL_REAL = ["model=smollm2", "explore.islands=2", "explore.rounds=2", "explore.phase_every=1",
              "explore.samples_per_prompt=6", "explore.max_new_tokens=200",
              "explore.temperatures=[0.3,0.5]", "dpo.max_pairs=4", "dpo.checkpoints=1",
              "gate.subset_size=2", "method.skip_without_improvement=false"]


@pytest.mark.slow
def test_evodpo_on_smollm2_trains_and_promotes_every_phase(tmp_path: Path) -> None:
    """The real agent: DPO phases train on its own programs and EvoDPO promotes each one."""
    cfg = compose_cfg(["experiment=test", "method=evodpo", *SMALL_REAL], run_dir=tmp_path)
    results = run(cfg)
    phases = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "phase"]
    trained = [p for p in phases if not p.get("skipped")]
    assert trained, f"no phase trained: {[p.get('reason') for p in phases]}"
    for p in trained:
        assert p["pairs"] >= 1 and p["dpo"]["steps"] >= 1
        assert p["gate"]["reason"] == "accepted: gate disabled" and p["promoted"]
        assert {c["name"] for c in p["gate"]["candidates"]} >= {"final"}
    assert results["promotions"] == len(trained) and results["accept_rate"] == 1.0
    assert results["valid_rate"] is not None and results["valid_rate"] > 0


@pytest.mark.slow
def test_atlas_online_gate_on_smollm2(tmp_path: Path) -> None:
    """gate.score_mode=online in a real run: every policy of C_k and the reference wrote
    fresh programs for G_k, scored in the sandbox, and the gate decided on those scores."""
    cfg = compose_cfg(["experiment=test", "method=atlas", *SMALL_REAL, "gate.score_mode=online",
                       "gate.online_samples=2"], run_dir=tmp_path)
    run(cfg)
    phases = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "phase"]
    gated = [p for p in phases if p.get("gate")]
    assert gated, f"no phase reached the gate: {[p.get('reason') for p in phases]}"
    for p in gated:
        online = p["gate"]["online"]
        names = [c["name"] for c in p["gate"]["candidates"]]
        assert [r["policy"] for r in online] == [*names, "reference"]
        n_prompts = len(p["gate"]["candidate_preferred"])
        assert all(r["samples"] == 2 * n_prompts for r in online)
        by_name = {r["policy"]: r["score"] for r in online}
        assert p["gate"]["ref_score"] == pytest.approx(by_name["reference"])
        for c in p["gate"]["candidates"]:
            assert c["score"] == pytest.approx(by_name[c["name"]])


# ---- one run per folder (issue 22, item 5) ----------------------------------------------------
CLI = [sys.executable, "-m", "atlas.train"]
SHORT = ["experiment=test", "method=evotune", "progress=false", "explore.rounds=2", "explore.phase_every=2",
         "task.T=200", "task.env_seeds=[0]"]
# long enough (~15 s of rounds on an idle 2-core machine) for a second command or a signal
# to arrive while it runs
LONG = [*SHORT, "explore.rounds=100", "explore.phase_every=100"]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"the run ended (rc={proc.returncode}) before {what}"
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


def _events(run_dir: Path) -> list[dict]:
    rows = []
    path = run_dir / "events.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            pass
    return rows


def test_a_locked_run_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    from atlas.runfolder import LOCK_FILE, RunFolderError, locked

    with locked(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(RunFolderError) as err:  # a second open of the file: flock conflicts
            with locked(tmp_path):
                pass
        assert str(err.value) == (
            f"run folder {tmp_path} is in use by process {os.getpid()}, which is running this "
            f"run; wait for it to finish or stop it (kill {os.getpid()}) and re-run to resume, "
            f"or choose another run folder with name=<new> (hydra.sweep.dir=<dir> under -m)")
        out = subprocess.run([*CLI, *SHORT, f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2  # hydra.run.dir given: name=<new> would not move the run
        assert out.stderr.strip().splitlines() == [str(err.value).replace(
            "name=<new> (hydra.sweep.dir=<dir> under -m)", "hydra.run.dir=<another dir>")], \
            out.stderr
        assert not (tmp_path / "events.jsonl").exists()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: no PID left behind


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path: Path) -> None:
    """flock is released by the kernel when its holder dies (kill -9 included); the PID the
    dead process wrote is stale and never mentioned."""
    code = ("import os, signal, sys; from atlas.runfolder import locked; "
            "cm = locked(sys.argv[1]); cm.__enter__(); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    from atlas.runfolder import LOCK_FILE, locked

    assert (tmp_path / LOCK_FILE).read_text().strip().isdigit()  # the dead holder's PID
    with locked(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_two_commands_into_one_folder_do_not_double_the_records(tmp_path: Path) -> None:
    """The issue's cases: the same command twice at once, and two sweeps launched into one
    sweep folder. The second stops in one line naming the first's PID; the first's records
    hold every round and every program once."""
    sweep = tmp_path / "sweep"
    first = subprocess.Popen([*CLI, "-m", *LONG, "seed=0", f"hydra.sweep.dir={sweep}"],
                             cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    def job() -> Path:  # bandit_evotune_s0_<the overrides>
        return next(iter(sorted(sweep.glob("bandit_evotune_s0*"))), sweep / "none")

    try:
        _wait_for(lambda: any(e["event"] == "seed" for e in _events(job())), first, 300,
                  "the first run's seed event")
        same = subprocess.run([*CLI, *LONG, "seed=0", f"hydra.run.dir='{job()}'"], cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=120)
        other_sweep = subprocess.run([*CLI, "-m", *LONG, "seed=0", f"hydra.sweep.dir={sweep}"],
                                     cwd=ROOT, env=_env(), capture_output=True, text=True,
                                     timeout=120)
        # 100 rounds keep it running while the others are refused; the bound catches a
        # hang (at a load average of 10-19 on 2 cores the run took over 600 s)
        out, err = first.communicate(timeout=1500)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    holder = f"is in use by process {first.pid}, which is running this run"
    assert same.returncode == 2 and len(same.stderr.strip().splitlines()) == 1, same.stderr
    assert holder in same.stderr and "hydra.run.dir=<another dir>" in same.stderr
    assert other_sweep.returncode == 1 and holder in other_sweep.stderr, other_sweep.stderr
    assert "Traceback" not in same.stderr + other_sweep.stderr
    # the refused commands wrote to their own stderr only, not into the first run's log
    log = (job() / "train.log").read_text()
    assert "is in use by process" not in log and "stopped" not in log, log[-3000:]
    events = _events(job())
    assert [e["event"] for e in events].count("seed") == 1
    assert [e["round"] for e in events if e["event"] == "round"] == list(range(1, 101))
    programs = read_jsonl(job() / "programs.jsonl")
    assert len({p["id"] for p in programs}) == len(programs)
    results = json.loads((job() / "results.json").read_text())
    assert results["candidates"] == results["candidate_budget"]


def test_a_sweep_job_that_fails_at_start_says_so_at_once(tmp_path: Path) -> None:
    """Hydra's launcher reports a failed job only when the whole batch has ended: each job's
    error is logged when it fails (before the next job starts) and in its folder's train.log.
    (A value validation rejects stops the sweep before any job: tests/test_sweeps.py; here each
    job's folder holds a run of another configuration, found only when the job starts.)"""
    from omegaconf import OmegaConf

    from tests.conftest import compose_cfg

    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        folder = sweep / f"bandit_evotune_s{seed}"
        (folder / "checkpoint").mkdir(parents=True)
        (folder / "checkpoint" / "state.pt").write_bytes(b"")
        old = OmegaConf.to_container(compose_cfg(["experiment=test", "method=evotune", f"seed={seed}",
                                                  "dpo.beta=0.3"], run_dir=folder), resolve=True)
        (folder / "events.jsonl").write_text(json.dumps({"event": "config", "config": old}) + "\n")
    out = subprocess.run([*CLI, "-m", "experiment=test", "method=evotune", "seed=0,1",
                          f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()  # the console log, in order
    starts = [i for i, line in enumerate(lines) if "#0 : " in line or "#1 : " in line]
    failed = [i for i, line in enumerate(lines) if "[ERROR] - this job stopped: " in line
              and "holds a run made with another configuration (dpo.beta: 0.3 -> 0.1" in line]
    assert len(starts) == 2 and len(failed) == 2, out.stdout
    assert starts[0] < failed[0] < starts[1] < failed[1]
    for seed in (0, 1):
        log = (sweep / f"bandit_evotune_s{seed}" / "train.log").read_text()
        assert "this job stopped: " in log and "add hydra.sweep.dir=<another dir>" in log


# ---- interrupts, a full disk, a broken checkpoint: one line, a resumable run ------------------
def _no_tmp_files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.name.endswith(".tmp") or ".tmp" in p.suffixes]


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_a_round_stops_in_one_line_and_resumes(tmp_path: Path, presses: int) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group (the sandbox workers
    too) while a round is in flight. Exit 130, one line, the checkpoint of the last finished
    round, no temporary file; the same command then resumes and finishes. A second Ctrl-C
    while it stops changes nothing: one line, 130, no traceback from the shutdown."""
    cmd = [*CLI, *LONG, f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    try:
        # round 2's event comes after round 1's checkpoint (a round's event is written before
        # its checkpoint, so the first event alone can race the save): now inside round 2's
        # save or a later round
        _wait_for(lambda: sum(e["event"] == "round" for e in _events(tmp_path)) >= 2, proc, 300,
                  "the second round event")
        for _ in range(presses):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.3)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    both = out + err  # Hydra logs to stdout
    assert proc.returncode == 130, both[-3000:]
    assert "Traceback" not in both and "KeyboardInterrupt" not in both, both[-3000:]
    stops = [line for line in both.splitlines() if "stopped" in line]
    assert len(stops) == 1 and "SIGINT: stopped" in stops[0], both[-3000:]
    assert stops[0].endswith("keeps the checkpoint of the last finished round; re-run the same "
                             "command to resume")
    assert _no_tmp_files(tmp_path) == []
    from atlas import checkpoint

    assert 2 <= checkpoint.load(tmp_path)["next_round"] < 100
    resumed = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from round" in resumed.stdout + resumed.stderr
    assert [e["round"] for e in _events(tmp_path) if e["event"] == "round"] == list(range(1, 101))


def test_an_unreadable_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    out = subprocess.run([*CLI, *SHORT, f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"checkpoint {tmp_path}/checkpoint/state.pt is unreadable ("), last
    assert last.endswith(f"delete {tmp_path}/checkpoint to restart this run from round 0, or "
                         f"pass resume=false"), last


DISK_FULL_ENV = "ATLAS_TEST_DISK_FULL_AT_SAVE"  # driver: the n-th checkpoint save hits ENOSPC


def test_a_full_disk_while_checkpointing_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    """The third checkpoint save (after round 2) fails with ENOSPC half-way through writing:
    one line naming the file and the fix, exit 1, the checkpoint of round 1 intact, no
    temporary file, precision.json not rewritten by the re-run; the re-run finishes."""
    cmd = [sys.executable, "-m", "tests.test_train", *SHORT, "explore.rounds=3",
           f"hydra.run.dir={tmp_path}"]
    out = subprocess.run(cmd, cwd=ROOT, env={**_env(), DISK_FULL_ENV: "3"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"the disk is full (No space left on device) writing {tmp_path}/checkpoint/"
                    f"state.pt: free space on it; {tmp_path} keeps the checkpoint of the last "
                    f"finished round; re-run the same command to resume"), last
    log = next(tmp_path.glob("*.log"))  # Hydra names it after the job: test_train.log here
    assert "the disk is full" in log.read_text()
    assert _no_tmp_files(tmp_path) == []
    from atlas import checkpoint

    assert checkpoint.load(tmp_path)["next_round"] == 2
    precision = (tmp_path / "precision.json").stat().st_mtime_ns
    again = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "precision.json").stat().st_mtime_ns == precision
    assert [e["round"] for e in _events(tmp_path) if e["event"] == "round"] == [1, 2, 3]


def _driver_main() -> None:
    """``python -m tests.test_train <overrides>``: ``atlas.train`` whose n-th checkpoint save
    (``$ATLAS_TEST_DISK_FULL_AT_SAVE``) fails as a full disk does, after writing some bytes."""
    import errno

    import hydra

    from atlas import checkpoint, train

    at = int(os.environ.get(DISK_FULL_ENV, "0"))
    real, saves = checkpoint.torch, {"n": 0}

    class FullDiskTorch:  # torch, as atlas.checkpoint sees it, on a disk that fills up
        def __getattr__(self, name: str):
            return getattr(real, name)

        @staticmethod
        def save(obj, fh, *args, **kwargs) -> None:
            saves["n"] += 1
            if saves["n"] == at:
                fh.write(b"\x80\x02half a pickle")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real.save(obj, fh, *args, **kwargs)

    if at:
        checkpoint.torch = FullDiskTorch()

    @hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="train")
    def main(cfg) -> float | None:
        return train.run_command(cfg)

    main()


if __name__ == "__main__":
    _driver_main()
