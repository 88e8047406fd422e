"""Sweeps through Hydra's submitit launchers: local processes and a real SLURM cluster.

Two kinds of programs are swept. A toy Hydra app (written to a temp dir, seconds per job)
checks the launcher mechanics with our own launcher presets (conf/hydra/launcher), including
SLURM pre-emption: a real USR2 makes submitit checkpoint and requeue the job, and the requeued
job must continue in the SAME run folder. Then the same for the real `python -m atlas.train
experiment=test`: a two-seed sweep on each launcher and a pre-empted, requeued, resumed run.
Tests marked `slurm` need a running cluster (`sudo bash scripts/slurm_local.sh start`, or
ATLAS_SLURM_START=1 lets the fixture start it as root) and are skipped with the reason
otherwise. There is no slurmdbd, so jobs are checked with `scontrol show job`, not `sacct`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SLURM_SCRIPT = ROOT / "scripts" / "slurm_local.sh"
# what the local single-node cluster can satisfy (the preset asks for more)
SLURM_SMALL = ["hydra/launcher=slurm", "hydra.launcher.partition=debug",
               "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
               "hydra.launcher.timeout_min=30"]
# (submitit calls a signal a time-out, not a pre-emption, when the job has run more than
# min(0.8 * limit, limit - 10 min); with timeout_min <= 10 every signal counts as a time-out)

APP = '''
import json, os, time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="app")
def main(cfg):
    """Rounds of sleep with an atomic per-round checkpoint, like atlas.loop."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    ckpt = run_dir / "checkpoint.json"
    start = json.loads(ckpt.read_text())["next_round"] if ckpt.exists() else 0
    attempt = {"start_round": start, "output_dir": str(run_dir.resolve()),
               "sweep_dir": HydraConfig.get().sweep.dir, "stamp": cfg.stamp,
               "job_id": os.environ.get("SLURM_JOB_ID"),
               "restarts": os.environ.get("SLURM_RESTART_COUNT"), "pid": os.getpid()}
    with open(run_dir / "attempts.jsonl", "a") as fh:
        fh.write(json.dumps(attempt) + "\\n")
    for r in range(start, cfg.rounds):
        time.sleep(cfg.sleep_s)
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"next_round": r + 1}))
        os.replace(tmp, ckpt)
    (run_dir / "results.json").write_text(json.dumps({"seed": cfg.seed, "rounds": cfg.rounds}))
    return cfg.seed


if __name__ == "__main__":
    main()
'''

APP_CONF = f'''
seed: 0
name: toy
rounds: 2
sleep_s: 0.1
stamp: ${{now:%H%M%S.%f}}   # a timestamp, to see whether a requeued job re-resolves it
hydra:
  searchpath: [file://{CONF}]   # our launcher presets (conf/hydra/launcher)
  job:
    chdir: false
  sweep:
    dir: multirun/${{name}}
    subdir: toy_s${{seed}}
'''


def _env() -> dict[str, str]:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1")
    env.pop("SLURM_JOB_ID", None)  # pytest itself might run inside a SLURM job
    return env


@pytest.fixture
def toy_app(tmp_path: Path) -> Path:
    """A seconds-sized Hydra app with a deterministic sweep folder; returns its path."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.yaml").write_text(APP_CONF)
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    return tmp_path / "app.py"


def _run(cmd: list[str], cwd: Path, timeout: float,
         **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env={**_env(), **env}, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _attempts(run_dir: Path) -> list[dict]:
    path = run_dir / "attempts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# -- the preset -------------------------------------------------------------------------------

def test_slurm_preset_composes_and_is_overridable() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = compose("train", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
        over = compose("train", return_hydra_config=True, overrides=[
            "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=1", "hydra.launcher.timeout_min=720",
            "hydra.launcher.max_num_timeout=5", "hydra.launcher.setup=[module load cuda]"])
    lb, lo = base.hydra.launcher, over.hydra.launcher
    assert lb._target_.endswith("SlurmLauncher")
    assert (lb.timeout_min, lb.cpus_per_task, lb.mem_gb, lb.gpus_per_node) == (240, 2, 8, None)
    assert (lb.signal_delay_s, lb.max_num_timeout, lb.array_parallelism) == (120, 3, 16)
    assert lb.additional_parameters.requeue is True
    assert list(lb.setup) == ["export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"]
    assert (lo.partition, lo.gpus_per_node, lo.timeout_min, lo.max_num_timeout) == \
        ("gpu", 1, 720, 5)
    assert list(lo.setup) == ["module load cuda"]
    # the sweep folder has no timestamp: a re-run / requeue finds the same folder
    assert "now:" not in OmegaConf.to_yaml(base.hydra.sweep)  # to_yaml does not resolve


# -- submitit_local -----------------------------------------------------------------------------

def test_toy_sweep_submitit_local(toy_app: Path) -> None:
    """Two real jobs through submitit's local executor, each in its own seed folder."""
    _run([sys.executable, str(toy_app), "-m", "seed=0,1", "hydra/launcher=submitit_local"],
         cwd=toy_app.parent, timeout=180)
    sweep = toy_app.parent / "multirun" / "toy"
    results = {d.name: json.loads((d / "results.json").read_text())
               for d in sorted(sweep.glob("toy_s*"))}
    assert results == {"toy_s0": {"seed": 0, "rounds": 2}, "toy_s1": {"seed": 1, "rounds": 2}}
    pids = {_attempts(sweep / n)[0]["pid"] for n in results}
    assert len(pids) == 2 and os.getpid() not in pids  # two separate job processes
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2


def test_atlas_train_sweep_submitit_local(tmp_path: Path) -> None:
    """`python -m atlas.train experiment=test -m seed=0,1` through submitit_local."""
    # Jobs run side by side: one torch thread each, as the slurm preset's setup line does
    # (two jobs x all cores on 2 cores ran 2x slower: 57 s instead of 29 s)
    _run([sys.executable, "-m", "atlas.train", "-m", "experiment=test", "method=evotune",
          "seed=0,1", "hydra/launcher=submitit_local"], cwd=tmp_path, timeout=900, OMP_NUM_THREADS="1")
    sweep = tmp_path / "multirun" / "test"
    runs = sorted(sweep.glob("*_s[01]"))
    assert [r.name for r in runs] == ["bandit_evotune_s0", "bandit_evotune_s1"]
    results = [json.loads((r / "results.json").read_text()) for r in runs]
    assert [(r["task"], r["method"], r["seed"]) for r in results] == \
        [("bandit", "evotune", 0), ("bandit", "evotune", 1)]


# -- a real SLURM cluster -----------------------------------------------------------------------

def _cluster_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:  # a configured cluster whose controller is down makes sinfo retry for ~20 s
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and bool(re.search(r"idle|mixed|allocated", out.stdout))


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """Skip unless a SLURM cluster answers; with ATLAS_SLURM_START=1 (as root) start ours."""
    if not _cluster_up() and os.environ.get("ATLAS_SLURM_START") == "1":
        subprocess.run(["bash", str(SLURM_SCRIPT), "start"], check=False, timeout=600)
    if shutil.which("sinfo") is None:
        pytest.skip("SLURM is not installed (no `sinfo`); run `sudo bash scripts/slurm_local.sh start`")
    if not _cluster_up():
        pytest.skip("no idle SLURM node answers `sinfo`; run `sudo bash scripts/slurm_local.sh start`")


def _job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job` of one job (`<id>` or `<array id>_<task>`) as a dict; no slurmdbd
    here, so no `sacct`. The job may still be COMPLETING just after its result was written."""
    info: dict[str, str] = {}
    for _ in range(60):
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                             text=True, timeout=30).stdout.splitlines()
        info = dict(kv.split("=", 1) for kv in out[0].split() if "=" in kv) if out else {}
        if info.get("JobState") not in ("RUNNING", "COMPLETING"):
            break
        time.sleep(0.5)
    return info


@pytest.mark.slurm
def test_toy_sweep_slurm(slurm_cluster: None, toy_app: Path) -> None:
    """Two jobs as one sbatch job array on the cluster, through our `slurm` preset."""
    _run([sys.executable, str(toy_app), "-m", "seed=0,1", *SLURM_SMALL],
         cwd=toy_app.parent, timeout=300)
    sweep = toy_app.parent / "multirun" / "toy"
    results = [json.loads((sweep / f"toy_s{s}" / "results.json").read_text()) for s in (0, 1)]
    assert [r["seed"] for r in results] == [0, 1]
    jobs = [_attempts(sweep / f"toy_s{s}")[0]["job_id"] for s in (0, 1)]
    assert all(j and j.isdigit() for j in jobs) and jobs[0] != jobs[1]
    for j in jobs:  # really ran under slurmd, and finished
        assert _job_info(j).get("JobState") == "COMPLETED"
    # submitit's own record: one array <id>_0, <id>_1 with the sbatch script we configured
    logs = sorted(p.name for p in (sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(logs) == 2 and logs[0].split("_")[0] == logs[1].split("_")[0]
    sbatch = next((sweep / ".submitit").glob("*/*submission.sh")).read_text()
    assert "#SBATCH --partition=debug" in sbatch and "#SBATCH --signal=USR2@120" in sbatch
    assert "#SBATCH --requeue" in sbatch and "export OMP_NUM_THREADS" in sbatch


def _wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.5)
    out = proc.communicate()[0][-3000:] if proc is not None and proc.poll() is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{out}")


def _signal_and_finish(toy_app: Path, overrides: list[str], signal_at_round: int,
                       timeout: float) -> tuple[list[dict], str, str]:
    """Run a one-job sweep on the cluster; once it has checkpointed ``signal_at_round`` rounds
    send USR2 (unless ``signal_at_round`` is 0: SLURM signals by itself). Returns the job's
    attempts, its id and submitit's log."""
    run_dir = toy_app.parent / "multirun" / "toy" / "toy_s0"
    cmd = [sys.executable, str(toy_app), "-m", "seed=0", "sleep_s=1", *SLURM_SMALL, *overrides]
    master = subprocess.Popen(cmd, cwd=toy_app.parent, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if signal_at_round:
            ckpt = run_dir / "checkpoint.json"
            _wait_for(lambda: ckpt.exists()
                      and json.loads(ckpt.read_text())["next_round"] >= signal_at_round,
                      120, f"the first attempt to checkpoint round {signal_at_round}", master)
            job_id = _attempts(run_dir)[0]["job_id"]
            subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
        out, _ = master.communicate(timeout=timeout)
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
    assert master.returncode == 0, out[-3000:]
    attempts = _attempts(run_dir)
    log = "".join(p.read_text() for p in (run_dir.parent / ".submitit").glob("*/*_log.*"))
    return attempts, attempts[0]["job_id"], log


def _assert_resumed_in_place(attempts: list[dict], job_id: str, rounds: int,
                             run_dir: Path, requeues: int | None = 1) -> None:
    """Every attempt ran as the same SLURM job, in the same folder, from the last checkpoint."""
    assert len(attempts) >= 2 if requeues is None else len(attempts) == requeues + 1, attempts
    n = len(attempts) - 1
    assert _job_info(job_id).get("Restarts") == str(n)
    assert [a["job_id"] for a in attempts] == [job_id] * (n + 1)
    assert [a["restarts"] for a in attempts] in ([None, *map(str, range(1, n + 1))],
                                                 [str(i) for i in range(n + 1)])
    # the same run folder: the sweep dir has no timestamp and the subdir only overrides
    assert {a["output_dir"] for a in attempts} == {str(run_dir.resolve())}
    starts = [a["start_round"] for a in attempts]
    assert starts[0] == 0 and all(0 < b < rounds for b in starts[1:])
    assert starts == sorted(starts)  # each attempt resumed from the checkpoint, none restarted
    assert json.loads((run_dir / "results.json").read_text()) == {"seed": 0, "rounds": rounds}
    # Why no ${now:} in our sweep folder: a requeued job re-resolves every interpolation the
    # launching process did not (Hydra only carries over the launcher's resolver cache).
    assert attempts[1]["stamp"] != attempts[0]["stamp"]


@pytest.mark.slurm
def test_preemption_requeues_into_same_run_folder(slurm_cluster: None, toy_app: Path) -> None:
    """A real USR2 (what SLURM sends a job it pre-empts): submitit calls the launcher's
    checkpoint hook, requeues the job, and the requeued job resumes from the run's
    checkpoint in the same folder; a pre-emption does not use up max_num_timeout."""
    attempts, job_id, log = _signal_and_finish(
        toy_app, ["rounds=8"], signal_at_round=2, timeout=300)
    _assert_resumed_in_place(attempts, job_id, 8, toy_app.parent / "multirun/toy/toy_s0")
    assert "Caught signal SIGUSR2 on" in log and "this job is preempted" in log


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_signal_requeues_and_resumes(slurm_cluster: None, toy_app: Path) -> None:
    """No test-side signal: a 1-minute time limit and signal_delay_s=30 make SLURM itself send
    USR2 (its periodic check sends it 6-30 s into each attempt here); the job is requeued
    until it finishes, in the same folder, within max_num_timeout requeues."""
    attempts, job_id, log = _signal_and_finish(
        toy_app, ["rounds=30", "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=30",
                  "hydra.launcher.max_num_timeout=6"], signal_at_round=0, timeout=500)
    _assert_resumed_in_place(attempts, job_id, 30, toy_app.parent / "multirun/toy/toy_s0",
                             requeues=None)
    assert "this job is timed-out" in log
    assert "#SBATCH --signal=USR2@30" in next(
        (toy_app.parent / "multirun/toy/.submitit").glob("*/*submission.sh")).read_text()


@pytest.mark.slurm
def test_atlas_train_sweep_slurm(slurm_cluster: None, tmp_path: Path) -> None:
    """`python -m atlas.train experiment=test -m seed=0,1` as a job array on the cluster."""
    _run([sys.executable, "-m", "atlas.train", "-m", "experiment=test", "method=evotune",
          "seed=0,1", *SLURM_SMALL], cwd=tmp_path, timeout=900)
    sweep = tmp_path / "multirun" / "test"
    runs = sorted(sweep.glob("*_s[01]"))
    assert [r.name for r in runs] == ["bandit_evotune_s0", "bandit_evotune_s1"]
    seeds = [json.loads((r / "results.json").read_text())["seed"] for r in runs]
    assert seeds == [0, 1]
    tasks = sorted(p.name[: -len("_0_result.pkl")]
                   for p in (sweep / ".submitit").glob("*/*_result.pkl"))  # "<array id>_<i>"
    assert len(tasks) == 2 and tasks[0].split("_")[0] == tasks[1].split("_")[0]
    assert [_job_info(t).get("JobState") for t in tasks] == ["COMPLETED", "COMPLETED"]


@pytest.mark.slurm
def test_atlas_train_preemption_resumes_slurm(slurm_cluster: None, tmp_path: Path) -> None:
    """USR2 to a running `atlas.train` job: it is requeued and the requeued job resumes the
    loop from its last round checkpoint in the same run folder (rounds neither lost nor
    repeated in events.jsonl)."""
    rounds = 30
    cmd = [sys.executable, "-m", "atlas.train", "-m", "experiment=test", "method=evotune",
           "seed=0", f"explore.rounds={rounds}", *SLURM_SMALL]
    master = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sweep = tmp_path / "multirun" / "test"
    try:
        _wait_for(lambda: any(sweep.glob("*_s0*/checkpoint/state.pt")), 300,
                  "the loop's first round checkpoint", master)
        (run_dir,) = (p.parents[1] for p in sweep.glob("*_s0*/checkpoint/state.pt"))
        (task,) = (p.name[: -len("_0_log.out")] for p in sweep.glob(".submitit/*/*_log.out"))
        subprocess.run(["scancel", "--signal=USR2", task], check=True, timeout=30)
        out, _ = master.communicate(timeout=400)
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
    assert master.returncode == 0, out[-3000:]
    assert _job_info(task).get("Restarts") == "1"
    log = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.*"))
    assert "this job is preempted" in log and f"Requeued job {task.split('_')[0]}" in log
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["seed"], results["rounds"]) == (0, rounds)
    assert "resumed from round" in (run_dir / "train.log").read_text()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["round"] for e in events if e["event"] == "round"] == list(range(1, rounds + 1))
    assert [e["event"] for e in events].count("end") == 1
    # .task_secret: the sweep's shared task secret (docs/sandbox.md), one per sweep
    assert sorted(p.name for p in sweep.iterdir()) == sorted([".submitit", ".task_secret",
                                                               "multirun.yaml", run_dir.name])


# -- a sweep checked before it queues ------------------------------------------------------------

def _sweep_line(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "atlas.train", "-m", "experiment=test",
                           *overrides], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    return proc, time.time() - t0


def test_every_job_of_a_sweep_is_validated_before_any_is_launched(tmp_path: Path) -> None:
    """Job 3's seed is out of range: one line naming the job, the field and the fix, and no
    job of the sweep starts (no sweep folder, no submitit folder)."""
    proc, took = _sweep_line(tmp_path, "seed=0,1,-1", "method=evotune,atlas",
                             "hydra/launcher=submitit_local")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("sweep job 5 of 6 (seed=-1 method=evotune): seed=-1 is outside "
                               "0..4294967295")
    assert lines[0].endswith("nothing was launched")
    assert not (tmp_path / "multirun").exists()
    assert took < 60, took  # six composes and validations, no model


def test_a_method_no_op_in_one_job_of_a_sweep_is_found_first(tmp_path: Path) -> None:
    proc, _ = _sweep_line(tmp_path, "explore.rounds=4,1", "explore.phase_every=2")
    assert proc.returncode == 2 and "sweep job 2 of 2 (explore.rounds=1): explore.phase_every" \
        "=2 > explore.rounds=1" in proc.stderr
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slurm
def test_a_request_no_node_meets_stops_before_submission(slurm_cluster: None,
                                                         tmp_path: Path) -> None:
    """64 CPUs a job on the local node: one line naming both fields and the largest node."""
    from atlas.sweep import slurm_nodes

    (cpus, mem), *_ = sorted(slurm_nodes(), reverse=True)
    proc, took = _sweep_line(tmp_path, "seed=0,1", "hydra/launcher=slurm",
                             "hydra.launcher.partition=debug",
                             f"hydra.launcher.cpus_per_task={cpus + 62}", "hydra.launcher.mem_gb=1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"hydra.launcher.cpus_per_task={cpus + 62} and "
                               f"hydra.launcher.mem_gb=1 fit no node of partition debug (sinfo: "
                               f"the largest has {cpus} CPUs and {mem:.1f} GB)")
    assert lines[0].endswith("nothing was submitted") and took < 60
    assert not (tmp_path / "multirun").exists()
    proc, _ = _sweep_line(tmp_path, "seed=0", "hydra/launcher=slurm",
                          f"hydra.launcher.mem_gb={int(mem) + 100}")
    assert f"hydra.launcher.mem_gb={int(mem) + 100} fit no node" in proc.stderr


@pytest.mark.slurm
def test_a_busy_cluster_is_not_an_error(slurm_cluster: None) -> None:
    """Every CPU of the node taken by a running job: a request the node can meet still passes."""
    from atlas.sweep import launcher_problem, slurm_nodes

    (cpus, _), *_ = sorted(slurm_nodes(), reverse=True)
    job = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-c", str(cpus), "--mem=100M",
                          "-o", "/dev/null", "--wrap", "sleep 60"], capture_output=True, text=True, timeout=30,
                         check=True).stdout.strip()
    try:
        _wait_for(lambda: _job_info(job).get("JobState") == "RUNNING", 60, "the blocking job")
        assert launcher_problem(["experiment=test", "hydra/launcher=slurm",
                                 f"hydra.launcher.cpus_per_task={cpus}",
                                 "hydra.launcher.mem_gb=1"]) is None
    finally:
        subprocess.run(["scancel", job], timeout=30, check=False)


@pytest.mark.slurm
@pytest.mark.slow
def test_the_documented_slurm_preset_runs_a_two_job_sweep(slurm_cluster: None,
                                                          tmp_path: Path) -> None:
    """`-m seed=0,1 hydra/launcher=slurm` exactly as documented, on the 2-CPU local node: the
    preset's request (from a job's measured needs) fits, and both jobs finish."""
    proc, _ = _sweep_line(tmp_path, "seed=0,1", "hydra/launcher=slurm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((tmp_path / "multirun" / "test").glob("*_s[01]"))
    assert [json.loads((r / "results.json").read_text())["seed"] for r in runs] == [0, 1]


def test_a_sweep_of_an_external_task_is_validated_with_its_search_path(tmp_path: Path) -> None:
    """The jobs' overrides come back from Hydra's parser escaped (`pkg\\://`): the task's
    config folder is still found, so job 2's seed is the first problem."""
    env = {**_env(), "PYTHONPATH": str(ROOT / "tests" / "external_task")}
    proc = subprocess.run([sys.executable, "-m", "atlas.train", "-m", "experiment=test",
                           "task=linefit", "hydra.searchpath=[pkg://linefit.conf]", "seed=0,-1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().startswith(
        "sweep job 2 of 2 (seed=-1): seed=-1 is outside"), proc.stderr[-2000:]


def test_the_study_fixes_ten_fresh_seeds_that_its_sweep_expands_and_checks() -> None:
    """experiment=study's seeds live in its config (hydra.sweeper.params): ten, none of the
    development seeds 0-4; the sweep's check expands them (a bad value names job 1 of 20), and
    a seed on the command line wins over them."""
    from atlas.sweep import check_sweep, sweep_jobs, with_sweeper_params

    jobs = sweep_jobs(with_sweeper_params(["experiment=study", "method=atlas,sample"]))
    seeds = sorted({int(o.split("=")[1]) for job in jobs for o in job if o.startswith("seed=")})
    assert len(jobs) == 20 and seeds == list(range(10, 20)) and not set(seeds) & set(range(5))
    assert sweep_jobs(with_sweeper_params(["experiment=study", "seed=3"])) == [
        ["seed=3", "experiment=study"]]
    line = check_sweep(["experiment=study", "method=atlas,sample", "dpo.beta=-1"])
    assert line is not None and line.startswith("sweep job 1 of 20 (seed=10 method=atlas)")


# -- a SLURM sweep that cannot be submitted: one line, status 2, nothing written ------------------

FAKE_SLURM = {  # what a machine's PATH holds: (tool, its stderr, its status)
    "no SLURM on PATH": {},
    "a controller sinfo cannot reach": {
        "sbatch": ("", 0), "srun": ("", 0),
        "sinfo": ("sinfo: error: Unable to contact slurm controller (connect failure)", 1)},
    "a refused submission": {
        "srun": ("", 0), "sinfo": ("", 0),
        "sbatch": ("sbatch: error: Batch job submission failed: Invalid partition name "
                   "specified", 1)},
}
EXPECTED_CAUSE = {
    "no SLURM on PATH": "no SLURM on this machine (sbatch and srun are not on PATH)",
    "a controller sinfo cannot reach": "the SLURM controller does not answer (sinfo: error: "
                                       "Unable to contact slurm controller (connect failure))",
    "a refused submission": "sbatch refuses the jobs' request (sbatch: error: Batch job "
                            "submission failed: Invalid partition name specified); fix the "
                            "hydra.launcher field it names",
}


def _slurm_sweep(tmp_path: Path, tools: dict[str, str], system_path: bool = False
                 ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The README's SLURM sweep run in an empty folder with only ``tools`` (name: shell body)
    on PATH (and the system's folders when ``system_path``, for submitit's own commands)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in tools.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    path = f"{bin_dir}:/usr/bin:/bin" if system_path else str(bin_dir)
    proc = subprocess.run([sys.executable, "-m", "atlas.train", "-m", "experiment=test",
                           "seed=0,1", "hydra/launcher=slurm"], cwd=work,
                          env={**_env(), "PATH": path}, capture_output=True, text=True,
                          timeout=180)
    return work, proc


@pytest.mark.parametrize("case", list(FAKE_SLURM))
def test_a_slurm_sweep_that_cannot_be_submitted_stops_in_one_line(case: str,
                                                                  tmp_path: Path) -> None:
    """`-m ... hydra/launcher=slurm` as the README writes it, where SLURM cannot take the jobs:
    fake sinfo/sbatch/srun on PATH (or none at all). One line with status 2 naming the cause
    and the ways out, before Hydra announces a job, and no multirun/ or .submitit/ left."""
    work, proc = _slurm_sweep(tmp_path, {tool: f"echo '{said}' >&2\nexit {status}"
                                         for tool, (said, status) in FAKE_SLURM[case].items()})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and not proc.stdout, proc.stderr[-3000:]
    assert lines[0].startswith(f"hydra/launcher=slurm cannot submit here: {EXPECTED_CAUSE[case]}")
    for way in ("bash scripts/slurm_local.sh start", "drop hydra/launcher=slurm",
                "hydra/launcher=submitit_local"):
        assert way in lines[0]
    assert lines[0].endswith("nothing was submitted")
    assert list(work.iterdir()) == []  # no multirun/, no .submitit/


def test_a_submission_refused_after_the_test_passes_stops_in_one_line(tmp_path: Path) -> None:
    """A limit that only the real submission counts (an array above MaxArraySize): a fake
    sbatch accepts ``--test-only`` and refuses the job array. One line with status 2 naming
    sbatch's reason and the ways out; the .submitit/ and sweep folders it wrote are gone."""
    said = "sbatch: error: Batch job submission failed: Invalid job array specification"
    work, proc = _slurm_sweep(tmp_path, {
        "srun": "exit 0", "sinfo": "exit 0",
        "sbatch": ('case "$*" in *--test-only*) echo "sbatch: Job 1 to start at now" >&2; '
                   f'exit 0;; esac\necho \'{said}\' >&2\nexit 1')}, system_path=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("hydra/launcher=slurm cannot submit here: sbatch refused the "
                               f"submission ({said}); fix the hydra.launcher field it names")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert lines[0].endswith("nothing was submitted")
    assert list(work.iterdir()) == []  # no multirun/, no .submitit/
