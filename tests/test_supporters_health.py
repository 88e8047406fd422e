"""A supporter server that cannot answer is a finding: real servers on 127.0.0.1.

At start: a closed port, a server answering 404 and one that accepts connections but never
answers each stop ``python -m atlas.train`` in one line naming the roles, the URL and the fix,
within the health request's timeout; ``on_unreachable=fallback`` runs on the embedded rules
and counts the calls. During a run: the circuit breaker stops asking a server that stopped
answering, says so once, and asks again after its cool-down.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from atlas.supporters import make_supporters
from atlas.supporters.config import role_configs
from atlas.supporters.health import check_supporters, found_down, probe
from tests.conftest import QUICK_BANDIT
from tests.test_supporters import ScriptedServer, _strat_req

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


class _NotFound(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(404)

    do_POST = do_GET


@pytest.fixture
def not_found_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def silent_url():
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()


def _train(tmp_path: Path, *overrides: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "atlas.train", "experiment=test", "method=atlas",
         "progress=false", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _openai(url: str, *extra: str) -> list[str]:
    return ["supporters=openai", f"supporters.base_url={url}", "supporters.model=m",
            "supporters.max_retries=0", "supporters.health_timeout_s=2", *extra]


@pytest.mark.parametrize("kind", ["closed", "404", "silent"])
def test_a_dead_server_stops_the_run_in_one_line(kind, tmp_path, not_found_url, silent_url):
    url = {"closed": f"http://127.0.0.1:{_closed_port()}/v1", "404": not_found_url,
           "silent": silent_url}[kind]
    t0 = time.time()
    proc = _train(tmp_path, *_openai(url))
    took = time.time() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    line = lines[0]
    assert line.startswith("supporter exploration, strategist, inspector: the server at " + url)
    assert "supporters.on_unreachable=fallback" in line and "supporters.base_url" in line
    assert {"closed": "Connection refused", "404": "HTTP 404",
            "silent": "within 2 s"}[kind] in line
    assert took < 30, took  # start-up (~3 s) + at most the 2 s health timeout, on a busy machine
    assert not (tmp_path / "run" / "results.json").exists()


def test_one_role_can_be_pointed_elsewhere_and_named(not_found_url):
    roles = role_configs({"backend": "embedded", "strategist": {"backend": "openai",
                                                                "base_url": not_found_url,
                                                                "model": "m"}})
    with pytest.raises(ValueError, match=r"^supporter strategist: .*fix supporters\.strategist"
                                         r"\.base_url, or set supporters\.strategist\."
                                         r"on_unreachable=fallback"):
        check_supporters(roles)


def test_probe_answers_none_for_a_live_server():
    srv = ScriptedServer()
    try:
        assert probe(srv.url, 2.0) is None
    finally:
        srv.kill()


def test_fallback_runs_on_the_rules_and_counts_the_calls(tmp_path):
    """on_unreachable=fallback: the run finishes; no call waits on the dead server; the
    summary and results.json count every call as fallen back.

    Pinned so that every count holds for every task secret and load: each phase asks the
    strategist (``skip_without_improvement=false``: B.4 would skip the phases in which no
    patch beat the seed, and with them the strategist's only calls); the phases build no pairs
    (the tiny agent writes nothing valid and patches are not preferences), so no DPO, gate or
    inspector runs; and the breaker the health check opened stays open however long a loaded
    machine makes the run (after the 120 s default cool-down a call would ask the dead server,
    ``unreachable``, not ``breaker_open``)."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    proc = _train(tmp_path, *_openai(url, "supporters.on_unreachable=fallback",
                                     "supporters.breaker_cooldown_s=86400"),
                  "explore.rounds=2", "explore.phase_every=1",
                  "method.skip_without_improvement=false",
                  "supporters.exploration.as_preferences=false",
                  # no score matters here: the quick bandit, and room for a loaded machine
                  # (at load ~14 on 2 cores the default bandit's seed took more than 12 s)
                  *QUICK_BANDIT, "task.timeout_s=60", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    phases = [e for e in events if e["event"] == "phase"]
    assert [e["phase"] for e in phases] == [1, 2] and results["phases"] == 2
    assert all(e["strategist"]["fallback_cause"] == "breaker_open" for e in phases)
    assert all(e["reason"] == "no preference pairs could be built" for e in phases)
    calls = results["supporter_calls"]
    stats = results["supporters"]
    # one island served per round (experiment=test), one strategist call per phase
    assert (stats["exploration"]["calls"], stats["strategist"]["calls"]) == (2, 2)
    assert stats["inspector"]["calls"] == 0
    for role in ("exploration", "strategist"):
        assert stats[role]["embedded"] == 0
        assert calls[role] == {"answered": 0, "invalid": 0, "fell_back": stats[role]["calls"]}
        assert calls[role]["fell_back"] == stats[role]["fallbacks"]["breaker_open"]
    assert "supporters exploration 0 answered, 0 invalid, 2 fell back" in proc.stdout
    # every run records where it came from (atlas/provenance.py): the tiny model, on the CPU
    prov = results["provenance"]
    assert (prov["device"], prov["dtype"]) == ("cpu", "float32")
    assert prov["versions"]["torch"] and "jax" in prov["versions"] and prov["cpu"]
    assert len(prov["git_commit"]) == 40 and isinstance(prov["git_dirty"], bool)
    log = proc.stdout + proc.stderr
    warned = [x for x in log.splitlines() if "cannot be reached" in x]
    assert len(warned) == 1 + 3, log[-3000:]  # the health line, one per role's breaker


def test_circuit_breaker_stops_asking_a_server_that_hangs(silent_url, caplog):
    """Three timeouts in a row open the breaker: the next calls do not wait on the server,
    it says so once, and after the cool-down one call asks again."""
    sup = make_supporters(role_configs({"backend": "openai", "base_url": silent_url, "model": "m",
                            "timeout_s": 0.3, "max_retries": 0, "structured_output": "text",
                            "breaker_failures": 3, "breaker_cooldown_s": 1.0}), seed=0)
    caplog.set_level(logging.INFO, logger="atlas.supporters")
    causes = [sup.strategist.advise(_strat_req()).fallback_cause for _ in range(3)]
    assert causes == ["timeout"] * 3
    t0 = time.time()
    causes = [sup.strategist.advise(_strat_req()).fallback_cause for _ in range(20)]
    assert causes == ["breaker_open"] * 20 and time.time() - t0 < 0.5
    opened = [r for r in caplog.records if "calls in a row got no answer" in r.getMessage()]
    assert len(opened) == 1 and opened[0].levelno == logging.WARNING
    time.sleep(1.05)
    assert sup.strategist.advise(_strat_req()).fallback_cause == "timeout"  # asked again
    assert sup.strategist.advise(_strat_req()).fallback_cause == "breaker_open"  # reopened
    s = sup.stats()["strategist"]
    assert s["fallbacks"]["timeout"] == 4 and s["fallbacks"]["breaker_open"] == 21
    assert s["calls"] == 25
    assert sup.stats()["exploration"]["calls"] == 0  # a role's breaker is its own


def test_breaker_closes_when_the_server_answers_again():
    srv = ScriptedServer()
    try:
        sup = make_supporters(role_configs({"backend": "openai", "base_url": srv.url, "model": "m",
                                "timeout_s": 2.0, "max_retries": 0, "structured_output": "text",
                                "breaker_failures": 2, "breaker_cooldown_s": 0.3}), seed=0)
        srv.script.extend([("status", 503), ("status", 503),
                           ("content", '{"beta": 0.2, "epochs": 2, "rationale": "r"}'),
                           ("status", 503)])
        got = [sup.strategist.advise(_strat_req()).fallback_cause for _ in range(3)]
        assert got == ["http_error", "http_error", "breaker_open"] and len(srv.requests) == 2
        time.sleep(0.35)
        assert sup.strategist.advise(_strat_req()).fallback_cause is None  # closed again
        assert sup.strategist.advise(_strat_req()).fallback_cause == "http_error"  # 1 in a row
        assert sup.strategist.advise(_strat_req()).fallback_cause != "breaker_open"
    finally:
        srv.kill()


def test_health_fallback_opens_the_breaker_from_the_first_call():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    cfg = {"backend": "openai", "base_url": url, "model": "m", "on_unreachable": "fallback"}
    assert set(check_supporters(role_configs(cfg))) == {"exploration", "strategist", "inspector"}
    assert "Connection refused" in found_down(url)
    sup = make_supporters(role_configs(cfg), seed=0)
    assert sup.strategist.advise(_strat_req()).fallback_cause == "breaker_open"
