"""W&B dashboards: what a run sends to W&B, read back from the offline run files.

The ``.wandb`` file of an offline run is W&B's transaction log (LevelDB log framing around
``wandb.proto`` Records); wandb >= 0.2x has no Python reader for it any more, so
``read_offline_run`` parses the framing here and decodes the records with wandb's own
protobuf classes. Two levels: a unit test drives ``Telemetry`` with a real offline
``WandbLogger`` and hand-made phase records (gate, strategist, promotion: keys the tiny model
never reaches), and a real ``python -m atlas.train -m`` sweep (3 methods x 2 seeds, tiny
model) checks one W&B run per job, grouped by the sweep folder, with the programs table.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from atlas.telemetry import (
    EVENTS,
    PHASE_COLUMNS,
    PROGRAM_COLUMNS,
    PROGRAMS,
    Telemetry,
    logger_metrics,
    program_rows,
    read_jsonl,
)
from atlas.train import finish_logger
from atlas.types import Evaluation, Program

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("evotune", "evodpo", "atlas")
SEEDS = (0, 1)
SWEEP_NAME = "wb_sweep"
# experiment=test picks logger=none; the command line's logger=wandb wins
SWEEP_OVERRIDES = ["experiment=test", "logger=wandb",
                   f"method={','.join(METHODS)}", f"seed={','.join(map(str, SEEDS))}",
                   "explore.rounds=2", "explore.phase_every=1", "progress=false",
                   # a 4x cheaper bandit evaluation: the sweep takes ~25 s instead of ~80 s
                   "task.env_seeds=[0]", "task.T=500",
                   # ATLAS skips a phase without a score gain (App. B.4) and then never asks
                   # its strategist; whether the tiny model gains depends on the sweep's fresh
                   # secret, so the sweep trains every phase and the strategist always speaks
                   # (the skipped-phase charts are checked by the unit test above)
                   "method.skip_without_improvement=false"]


# -- reading an offline run back ------------------------------------------------------------

_BLOCK, _HEADER = 32768, 7  # LevelDB log: 32 KiB blocks, 7-byte chunk headers
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list[Any]:
    """Every ``wandb.proto`` Record of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, buf = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding
            pos += room
            continue
        if pos + _HEADER + length > len(data):  # a chunk wandb-core is still writing
            break
        buf += data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _value(item: Any) -> Any:
    return json.loads(item.value_json) if item.value_json else None


def read_offline_run(run_dir: Path, wait_s: float = 30.0) -> dict[str, Any]:
    """The one offline W&B run under ``run_dir/wandb``: id, group, name, config, history rows,
    summary, metric definitions, exit code and its files folder.

    ``wandb.finish`` can return before wandb-core has flushed the log (seen: a 7-byte file
    right after it), so this waits up to ``wait_s`` for the run's exit record, and reads again
    when a record is cut where wandb-core's write stood."""
    from google.protobuf.message import DecodeError

    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected one offline W&B run under {run_dir}, found {files}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            run = _parse_run(files[0])
        except DecodeError:
            if time.monotonic() > deadline:
                raise
        else:
            if run["exit_code"] is not None or time.monotonic() > deadline:
                return run
        time.sleep(0.2)


def _parse_run(path: Path) -> dict[str, Any]:
    files = [path]
    run: dict[str, Any] = {"history": [], "summary": {}, "config": {}, "metrics": [],
                           "exit_code": None, "files": files[0].parent / "files"}
    for r in _records(files[0]):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.update(id=r.run.run_id, group=r.run.run_group, name=r.run.display_name,
                       job_type=r.run.job_type, project=r.run.project)
            run["config"].update({i.key: _value(i) for i in r.run.config.update})
        elif kind == "config":
            run["config"].update({i.key: _value(i) for i in r.config.update})
        elif kind == "history":
            run["history"].append({_key(i): _value(i) for i in r.history.item})
        elif kind == "summary":
            run["summary"].update({_key(i): _value(i) for i in r.summary.update})
        elif kind == "metric":
            run["metrics"].append((r.metric.name or r.metric.glob_name, r.metric.step_metric))
        elif kind == "exit":
            run["exit_code"] = r.exit.exit_code
    return run


def series(run: dict[str, Any], key: str) -> list[Any]:
    return [row[key] for row in run["history"] if key in row]


def read_table(run: dict[str, Any], key: str) -> dict[str, Any]:
    """A logged ``wandb.Table`` (columns, data) from the run's media files."""
    rows = [row for row in run["history"] if row.get(f"{key}/_type") == "table-file"]
    assert len(rows) == 1, f"table {key!r} logged {len(rows)} times"
    return json.loads((run["files"] / rows[0][f"{key}/path"]).read_text())


# -- the real sweep (shared with tests/test_report.py) --------------------------------------

def sweep_env(base: Path) -> dict[str, str]:
    """Offline W&B whose caches and settings stay inside the test's temp folder."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1",
               WANDB_DIR=str(base), WANDB_CACHE_DIR=str(base / "wandb-cache"),
               WANDB_CONFIG_DIR=str(base / "wandb-config"),
               WANDB_DATA_DIR=str(base / "wandb-data"))
    env.pop("SLURM_JOB_ID", None)
    return env


def build_sweep(base: Path) -> Path:
    """Run ``python -m atlas.train -m`` over 3 methods x 2 seeds (tiny model, W&B offline)
    once per test session; later calls return the same sweep folder."""
    sweep = base / "multirun" / SWEEP_NAME
    done = base / f"{SWEEP_NAME}.done"
    if done.exists():
        return sweep
    cmd = [sys.executable, "-m", "atlas.train", "-m", *SWEEP_OVERRIDES,
           f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=base, env=sweep_env(base), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    done.write_text(proc.stdout)
    return sweep


def job_dirs(sweep: Path) -> dict[tuple[str, int], Path]:
    """(method, seed) -> run folder of the sweep."""
    out = {}
    for d in sorted(p for p in sweep.iterdir() if p.is_dir()):
        config = read_jsonl(d / EVENTS)[0]["config"]
        out[(config["method"]["name"], int(config["seed"]))] = d
    return out


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sweep(tmp_path_factory.getbasetemp())


# -- pure functions -------------------------------------------------------------------------

def test_logger_metrics_turn_strategist_changes_into_per_knob_series() -> None:
    record = {"event": "phase", "phase": 3, "promoted": True, "skipped": False,
              "gate": {"kl": 0.02, "gain": 0.1, "accepted": True, "reason": "accepted",
                       "candidates": [{"name": "final"}]},
              "strategist": {"changed": ["beta", "lr"], "values": {"beta": 0.2}}}
    m = logger_metrics("phase", {k: v for k, v in record.items() if k != "skipped"})
    assert m["phase/phase"] == 3.0 and m["phase/promoted"] == 1.0 and m["phase/skipped"] == 0.0
    assert m["phase/gate/kl"] == 0.02 and m["phase/gate/gain"] == 0.1
    assert m["phase/gate/accepted"] == 1.0 and m["phase/strategist/values/beta"] == 0.2
    assert {k: m[f"phase/interventions/{k}"] for k in ("beta", "lr", "epochs", "score_threshold")} \
        == {"beta": 1.0, "lr": 1.0, "epochs": 0.0, "score_threshold": 0.0}
    assert not any("candidates" in k or "reason" in k or "event" in k for k in m)
    # no strategist (evotune / evodpo): no intervention series at all, not a row of zeros
    assert not any("interventions" in k for k in logger_metrics("phase", {"phase": 1}))


def test_program_rows_keep_the_best_when_over_the_wandb_limit() -> None:
    def prog(i: int, score: float | None, passed: bool) -> dict[str, Any]:
        return {"id": i, "island": 0, "round": 1, "code": f"c{i}",
                "evaluation": {"score": score, "passed": passed, "failure_kind": "ok" if passed else "syntax_error"}}

    programs = [prog(0, None, False), prog(1, -0.5, True), prog(2, -0.2, True), prog(3, -0.9, True)]
    assert [r[0] for r in program_rows(programs, limit=10)] == [0, 1, 2, 3]
    assert [r[0] for r in program_rows(programs, limit=2)] == [2, 1]
    row = program_rows(programs, limit=10)[0]
    assert dict(zip(PROGRAM_COLUMNS, row)) == {"id": 0, "island": 0, "round": 1, "phase": 0,
                                               "source": "agent", "score": None, "passed": False,
                                               "failure_kind": "syntax_error", "code": "c0"}


# -- Telemetry -> real offline WandbLogger -> read back --------------------------------------

def _program(pid: int, score: float, passed: bool, kind: str = "ok") -> Program:
    return Program(id=pid, island=pid % 2, round=1, code=f"def policy():\n    return {pid}\n",
                   evaluation=Evaluation(score=score, passed=passed, failure_kind=kind),
                   source="agent", phase=1)


def _offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process logs to W&B as a sweep job would: offline, into ``tmp_path``."""
    for k, v in sweep_env(tmp_path).items():
        if k.startswith("WANDB"):
            monkeypatch.setenv(k, v)


def test_telemetry_sends_gate_interventions_and_tables_to_wandb(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _offline_wandb(tmp_path, monkeypatch)
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="atlas-test", name="unit", group="unit-group", save_dir=str(tmp_path),
                         offline=True, job_type="atlas")
    tel = Telemetry(tmp_path, logger)
    tel.programs([_program(0, -0.6, True), _program(1, -math.inf, False, "syntax_error"),
                  _program(2, -0.4, True)])
    for r, rate in ((1, 0.5), (2, 0.75)):
        tel.event("round", round=r, phase=1, valid_rate=rate, best=-0.4 - 0.1 * (2 - r),
                  failures={"syntax_error": 1}, islands={"0": {"best": -0.6, "median": -0.6},
                                                   "1": {"best": -0.4 - r, "median": None}})
    tel.event("phase", round=2, phase=1, pairs=3, promoted=True, vetoed=False,
              dpo={"loss": 0.65, "accuracy": 0.5},
              gate={"accepted": True, "reason": "accepted", "kl": 0.03, "gain": 0.25,
                    "candidates": [{"name": "final", "kl": 0.03}]},
              strategist={"changed": ["beta"], "values": {"beta": 0.2, "lr": 5e-5}})
    tel.event("phase", round=4, phase=2, skipped=True, reason="no score improvement this phase")
    tel.event("exploration", round=2, island=0, critique="not charted")
    tel.event("end", results={"final_score": -0.4, "initial_score": -0.6, "promotions": 1})
    tel.close()
    finish_logger(logger)

    run = read_offline_run(tmp_path)
    assert (run["name"], run["group"], run["job_type"], run["exit_code"]) == ("unit", "unit-group", "atlas", 0)
    assert series(run, "round/valid_rate") == [0.5, 0.75]
    assert series(run, "round/islands/1/best") == [-1.4, -2.4]
    assert series(run, "round/failures/syntax_error") == [1, 1]
    assert series(run, "phase/phase") == [1, 2]
    assert series(run, "phase/gate/kl") == [0.03] and series(run, "phase/gate/gain") == [0.25]
    assert series(run, "phase/promoted") == [1] and series(run, "phase/skipped") == [0, 1]
    assert series(run, "phase/dpo/loss") == [0.65]
    assert series(run, "phase/interventions/beta") == [1] and series(run, "phase/interventions/lr") == [0]
    assert not any(k.startswith("exploration") for row in run["history"] for k in row)
    assert ("round/*", "round/round") in run["metrics"] and ("phase/*", "phase/phase") in run["metrics"]

    programs = read_table(run, "programs")
    assert programs["columns"] == list(PROGRAM_COLUMNS)
    assert [(r[0], r[5], r[6], r[7]) for r in programs["data"]] == \
        [(0, -0.6, True, "ok"), (1, None, False, "syntax_error"), (2, -0.4, True, "ok")]
    phases = read_table(run, "phases")
    assert phases["columns"] == list(PHASE_COLUMNS)
    first, second = (dict(zip(PHASE_COLUMNS, row)) for row in phases["data"])
    assert (first["gate_reason"], first["kl"], first["promoted"], first["interventions"]) == \
        ("accepted", 0.03, True, "beta")
    assert (second["skipped"], second["reason"]) == (True, "no score improvement this phase")
    assert run["summary"]["results/final_score"] == -0.4
    assert run["summary"]["results/promotions"] == 1


def test_finish_logger_marks_a_failed_job_and_closes_its_run(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _offline_wandb(tmp_path, monkeypatch)
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="atlas-test", name="crash", save_dir=str(tmp_path), offline=True)
    logger.log_metrics({"round/valid_rate": 0.0}, step=1)
    finish_logger(logger, "failed")
    assert wandb.run is None  # the next job of a sweep starts a fresh run
    assert read_offline_run(tmp_path)["exit_code"] == 1


def test_the_reader_reads_a_log_cut_mid_write_up_to_its_last_whole_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_offline_run`` polls a file wandb-core may be writing: a poll that lands inside a
    chunk must give the records before it, never parse a cut one."""
    _offline_wandb(tmp_path, monkeypatch)
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="atlas-test", name="cut", save_dir=str(tmp_path), offline=True)
    for step in range(50):
        logger.log_metrics({"round/best": float(step), "note": "x" * 200}, step=step)
    finish_logger(logger, "success")
    assert len(series(read_offline_run(tmp_path), "round/best")) == 50
    path = next(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    data, cut = path.read_bytes(), tmp_path / "cut.wandb"
    whole = len(_records(path))
    counts = []
    for end in range(_HEADER + 1, len(data), 97):
        cut.write_bytes(data[:end])
        counts.append(len(_records(cut)))
    assert counts == sorted(counts) and counts[0] < counts[-1] < whole


# -- the real sweep --------------------------------------------------------------------------

def test_every_sweep_job_is_its_own_wandb_run_grouped_by_the_sweep(sweep: Path) -> None:
    jobs = job_dirs(sweep)
    assert sorted(jobs) == sorted((m, s) for m in METHODS for s in SEEDS)
    runs = {job: read_offline_run(d) for job, d in jobs.items()}
    assert len({r["id"] for r in runs.values()}) == len(jobs)  # distinct runs, not one reused
    assert {r["group"] for r in runs.values()} == {SWEEP_NAME}
    for (method, seed), run in runs.items():
        assert run["name"] == jobs[(method, seed)].name and run["job_type"] == method
        assert run["config"]["seed"] == seed and run["config"]["method"]["name"] == method
        assert run["exit_code"] == 0 and run["project"] == "atlas"
        # where the run came from (atlas/provenance.py), as results.json has it
        results = json.loads((jobs[(method, seed)] / "results.json").read_text())
        assert run["config"]["provenance"] == results["provenance"]
        assert run["config"]["provenance"]["device"] == "cpu"


def test_sweep_runs_chart_rounds_phases_and_log_the_programs_table(sweep: Path) -> None:
    for (method, _seed), d in job_dirs(sweep).items():
        run = read_offline_run(d)
        events = read_jsonl(d / EVENTS)
        rounds = [e for e in events if e["event"] == "round"]
        phases = [e for e in events if e["event"] == "phase"]
        assert len(rounds) == 2 and len(phases) == 2
        assert series(run, "round/round") == [1, 2]
        assert series(run, "round/valid_rate") == pytest.approx([e["valid_rate"] for e in rounds])
        for island in ("0", "1"):  # experiment=test: two islands
            assert series(run, f"round/islands/{island}/best") == \
                pytest.approx([e["islands"][island]["best"] for e in rounds])
        assert series(run, "round/best") == pytest.approx([e["best"] for e in rounds])
        assert series(run, "phase/phase") == [1, 2]
        assert series(run, "phase/skipped") == [float(bool(e.get("skipped"))) for e in phases]
        assert series(run, "phase/scores/n") == [e["scores"]["n"] for e in phases]
        has_strategist = method == "atlas"
        assert bool(series(run, "phase/interventions/beta")) is has_strategist
        assert bool(series(run, "phase/strategist/values/beta")) is has_strategist

        programs = read_jsonl(d / PROGRAMS)
        table = read_table(run, "programs")
        assert table["columns"] == list(PROGRAM_COLUMNS)
        assert len(table["data"]) == len(programs) > 0
        by_id = {row[0]: dict(zip(PROGRAM_COLUMNS, row)) for row in table["data"]}
        for p in programs:
            row = by_id[p["id"]]
            assert (row["code"], row["score"], row["passed"], row["source"]) == \
                (p["code"], p["evaluation"]["score"], p["evaluation"]["passed"], p["source"])
        assert len(read_table(run, "phases")["data"]) == 2
        results = json.loads((d / "results.json").read_text())
        assert run["summary"]["results/final_score"] == pytest.approx(results["final_score"])
        assert run["summary"]["results/candidates"] == results["candidates"]


# -- W&B online: checked at start, a lost server said once (issue 49) ------------------------
class _Answers(__import__("http.server").server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")


@pytest.fixture
def answering_url():
    """A real HTTP server on loopback that answers every GET."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_http_url():
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _online_env(tmp_path: Path, url: str, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_BASE_URL=url, NETRC=str(tmp_path / "no-netrc"), HF_HOME=str(tmp_path / "hf"),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    if key:
        env["WANDB_API_KEY"] = key
    return env


@pytest.mark.parametrize("case", ["no key", "refused", "silent", "WANDB_MODE=online"])
def test_wandb_online_is_checked_at_start_in_one_line(case: str, tmp_path: Path,
                                                      silent_http_url: str) -> None:
    """Before the model loads, within the probe's 3 s: no key names `wandb login`; a server that
    refuses or never answers names the offline fix; WANDB_MODE=online names WANDB_MODE."""
    from tests.test_supporters_health import _closed_port

    url = silent_http_url if case == "silent" else f"http://127.0.0.1:{_closed_port()}"
    env = _online_env(tmp_path, url, None if case == "no key" else "k" * 40)
    mode = ["logger.mode=online"]
    if case == "WANDB_MODE=online":
        env["WANDB_MODE"], mode = "online", []
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "atlas.train",
                           "experiment=test", "logger=wandb", *mode,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    source = "WANDB_MODE=online" if case == "WANDB_MODE=online" else "logger.mode=online"
    assert line.startswith(f"logger=wandb runs online ({source}) but "), line
    if case == "no key":
        assert "no W&B API key is set" in line and "run `wandb login` once" in line
    else:
        assert {"refused": f"the W&B server {url} refused the connection",
                "silent": f"the W&B server {url} did not answer within 3 s",
                "WANDB_MODE=online": "refused the connection"}[case] in line
        assert "upload later with `wandb sync <run dir>/wandb/offline-run-*`" in line
    fix = "WANDB_MODE=offline" if case == "WANDB_MODE=online" else (
        "logger.mode=offline (or WANDB_MODE=offline)")
    assert f"log offline with {fix}" in line, line
    imported = {x.rsplit("|", 1)[-1].strip() for x in proc.stderr.splitlines()
                if x.startswith("import time:")}
    assert not imported & {"torch", "wandb", "lightning"}  # before the model (and wandb) load
    assert took < 30, took  # ~1 s, ~4 s when silent, on an idle machine
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_wandb_online_with_a_key_and_an_answering_server_passes_the_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answering_url) -> None:
    from atlas.loggers import WANDB_TARGET, LoggerSpec, wandb_problem

    _server, url = answering_url
    for k, v in _online_env(tmp_path, url, "k" * 40).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    online = LoggerSpec(WANDB_TARGET, {"name": "wandb", "mode": "online"})
    assert wandb_problem(online) is None
    # the key may come from the netrc file `wandb login` writes, for the server's host
    monkeypatch.delenv("WANDB_API_KEY")
    assert "no W&B API key" in wandb_problem(online)
    (tmp_path / "no-netrc").write_text(f"machine {url.split('//')[1]} login user password "
                                       f"{'k' * 40}\n")
    assert wandb_problem(online) is None
    assert wandb_problem(LoggerSpec(WANDB_TARGET, {"name": "wandb", "mode": "offline"})) is None


def test_a_server_lost_mid_run_is_said_once_and_logging_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answering_url, caplog) -> None:
    """The watch an online run gets (``atlas.loggers.wandb_logger``), on a real W&B logger
    (offline: no W&B server can run here) and a real server that goes away after round 3:
    one warning naming the server, the folder and `wandb sync`, and every round still logged."""
    _offline_wandb(tmp_path, monkeypatch)
    from lightning.pytorch.loggers import WandbLogger

    from atlas.loggers import ServerWatch, _watched

    server, url = answering_url
    logger = _watched(WandbLogger(project="atlas-test", name="lost", save_dir=str(tmp_path),
                                  offline=True), ServerWatch(url, tmp_path / "wandb", every_s=0))
    for step in range(1, 7):
        if step == 4:
            server.shutdown()
            server.server_close()
        logger.log_metrics({"round/round": float(step), "round/best": -1.0 / step}, step=step)
    finish_logger(logger, "success")
    said = [r.getMessage() for r in caplog.records if "W&B: the server" in r.getMessage()]
    assert len(said) == 1, said
    assert f"W&B: the server {url} refused the connection" in said[0]
    assert f"`wandb sync {tmp_path / 'wandb' / 'latest-run'}`" in said[0]
    assert series(read_offline_run(tmp_path), "round/round") == [1, 2, 3, 4, 5, 6]
