"""``method=atlas`` end to end, in-process through ``atlas.train.run`` (what ``python -m
atlas.train`` calls), with the tiny agent and the supporters on every backend path:

- against a real OpenAI-compatible server (llama-cpp-python serving the SmolLM2 GGUF on
  127.0.0.1), the code path a user with Ollama takes; the valid-answer rate is printed (-s);
- fault injection during a run: the real server killed after the first call, and a scripted
  endpoint that answers garbage, too slowly, or with HTTP 500: the run finishes and every
  failure is a counted fallback with its cause;
- the embedded supporters on both tasks: results.json carries the paper's Table 3/5 fields.

The tiny agent writes no valid programs, so a phase's only DPO pairs are the exploration
supporter's patches against its failed completions (``experiment=test``'s smoke run trains on
them: tests/test_first_day.py); ``test_atlas_trains_with_smollm2`` (slow) covers a phase
trained on the agent's own programs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import atlas.train
from atlas.results import KNOBS
from atlas.supporters.roles import ExplorationSupporter
from atlas.supporters.schemas import FALLBACK_CAUSES
from tests.conftest import QUICK_BANDIT, compose_cfg, pin_secret
from tests.test_supporters import ScriptedServer
from tests.test_supporters_server import start_llama_server, stop_llama_server

requires_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama_cpp is not importable: pip install 'llama-cpp-python[server]'")

# two rounds, a phase after each: two exploration calls and up to two strategist calls
SHORT = ["experiment=test", "method=atlas", "progress=false", "explore.rounds=2",
         "explore.phase_every=1"]


def _openai(url: str, timeout_s: float = 60.0) -> list[str]:
    """The ``supporters=openai`` overrides a user types, pointed at ``url``."""
    return ["supporters=openai", f"supporters.base_url={url}", "supporters.model=smollm2",
            "supporters.api_key=none", "supporters.max_retries=0",
            f"supporters.timeout_s={timeout_s}", "supporters.max_tokens=96",
            "+supporters.exploration.max_tokens=192"]


def _run(tmp_path: Path, overrides: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one job; returns (results.json as written, events.jsonl records)."""
    t0 = time.time()
    returned = atlas.train.run(compose_cfg(overrides, run_dir=tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["final_score"] == pytest.approx(returned["final_score"])
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    print(f"\n[{' '.join(overrides)}] {time.time() - t0:.1f}s")
    return results, events


def _check_counters(stats: dict[str, Any], backend: str) -> None:
    assert set(stats) == {"exploration", "strategist", "inspector"}
    for role, s in stats.items():
        assert s["backend"] == backend, role
        assert set(s["fallbacks"]) == set(FALLBACK_CAUSES), role
        assert s["calls"] == s["llm_ok"] + s["embedded"] + sum(s["fallbacks"].values()), role


def _check_table_fields(results: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """The atlas-only fields of results.json agree with the phase events they summarise."""
    phases = [e for e in events if e["event"] == "phase"]
    assert results["phases"] == len(phases) >= 1
    trained = [e for e in phases if not e.get("skipped")]
    assert results["phases_trained"] == len(trained)
    assert results["phases_skipped"] == len(phases) - len(trained)
    assert set(results["interventions"]) == set(results["intervention_rates"]) == set(KNOBS)
    assert "accept_rate" in results and "vetoes" in results and "promotions" in results
    if not trained:  # no denominators: rates are None, never a made-up 0
        assert results["accept_rate"] is None
        assert all(v is None for v in results["intervention_rates"].values())
    for e in phases:  # every phase says why it was skipped, or what the strategist did
        assert e.get("skipped") is not None or "strategist" in e
        if e.get("skipped"):
            assert e["reason"]
        if "strategist" in e:
            assert e["strategist"]["backend"] in ("embedded", "openai")
            assert set(e["strategist"]["changed"]) <= set(KNOBS)


# ------------------------------------------------------------------ embedded supporters

@pytest.mark.parametrize("task", ["bandit", "pinn"])
def test_atlas_embedded_runs_on_both_tasks(tmp_path, task):
    # timeout 60 s: on a shared 2-core machine a x2 window patch of the bandit seed (~1 s
    # alone) was measured past the 10 s default, which is load, not what this test checks.
    # The pinned secret is one on which a rule's patch beats the seed on both tasks (the
    # bandit at QUICK_BANDIT's horizon: window 25 scores -0.449, the seed -0.529): on a
    # fresh one neither phase may improve, and ATLAS then never asks its strategist (B.4).
    # The quick bandit: at the default horizon, at load ~12 on 2 cores, the seed alone
    # outlasted the 60 s limit
    pin_secret(tmp_path)
    quick = QUICK_BANDIT if task == "bandit" else []
    results, events = _run(tmp_path, ["experiment=test", "method=atlas", f"task={task}",
                                      "progress=false", "task.timeout_s=60", *quick])
    assert results["method"] == "atlas" and results["task"] == task
    assert results["rounds"] == 4 and results["phases"] == 2
    _check_counters(results["supporters"], "embedded")
    stats = results["supporters"]
    assert all(s["llm_ok"] == 0 and s["embedded"] == s["calls"] for s in stats.values())
    exploration = [e for e in events if e["event"] == "exploration"]
    assert len(exploration) == stats["exploration"]["calls"] == 4  # one island served per round
    assert all(e["backend"] == "embedded" and e["fallback_cause"] is None for e in exploration)
    # the rule-based patches are real candidates: they are scored and one of them beats the seed
    assert sum(e["patches"] for e in exploration) >= 1
    assert results["final_score"] > results["initial_score"]
    # ... but the agent wrote no valid program, and its own column says so
    assert results["valid_rate"] == 0
    assert results["final_agent"] == results["initial_score"]
    assert results["improvement_agent_pct"] == 0
    # equal budgets: supporter programs are paid out of the agent's samples (test config:
    # 4 rounds x 1 island x 4 samples), the last round's patches are dropped
    by_source = results["candidates_by_source"]
    assert results["candidates"] == by_source["agent"] + by_source["supporter"] == 16
    assert results["candidate_budget"] == 16 and by_source["supporter"] >= 1
    assert exploration[-1]["patches"] == 0 and exploration[-1]["patches_dropped_for_budget"] >= 1
    rounds = [e for e in events if e["event"] == "round"]
    for prev, cur in zip(rounds, rounds[1:]):
        assert cur["candidates"] == 4 - prev["supporter_candidates"]
    _check_table_fields(results, events)
    # the phases that improved, and only they, consulted the strategist; the counter saw it
    phases = [e for e in events if e["event"] == "phase"]
    consulted = [e["phase"] for e in phases if "strategist" in e]
    assert consulted == [e["phase"] for e in phases if e["improved"]]
    assert len(consulted) == stats["strategist"]["calls"] >= 1


def test_a_round_s_patches_are_scored_side_by_side(tmp_path, monkeypatch):
    """Two islands a round, two patches each: every patch of a round reaches the sandbox
    before the round waits for any score (they were scored one after another), and they are
    still filed in island order."""
    from atlas.evolution import patches

    log: list[tuple[str, int]] = []
    submit, outcome = patches._submit, patches.outcome

    def submitting(*args, **kwargs):
        log.append(("submit", len(log)))
        return submit(*args, **kwargs)

    def waiting(fut):
        log.append(("wait", len(log)))
        return outcome(fut)

    monkeypatch.setattr(patches, "_submit", submitting)
    monkeypatch.setattr(patches, "outcome", waiting)
    pin_secret(tmp_path)  # which patches a rule proposes follows the islands' best scores
    _, events = _run(tmp_path, ["experiment=test", "method=atlas", "task=bandit",
                                "progress=false", "task.timeout_s=60",
                                "explore.islands_per_round=2", "explore.samples_per_prompt=4",
                                *QUICK_BANDIT])
    exploration = [e for e in events if e["event"] == "exploration"]
    filed = sum(e["patches"] for e in exploration)
    kinds = [k for k, _ in log]
    assert filed >= 3 and kinds.count("submit") == kinds.count("wait") == filed
    # per round: its submits, then its waits (never a wait between two submits of a round)
    runs = "".join("s" if k == "submit" else "w" for k in kinds)
    rounds = [r for r in runs.replace("ws", "w|s").split("|") if r]
    assert all(r == "s" * r.count("s") + "w" * r.count("w") for r in rounds)
    assert any(r.count("s") >= 3 for r in rounds)  # two islands' patches in one round
    for rnd in (e for e in events if e["event"] == "round"):
        served = [e["island"] for e in exploration if e["round"] == rnd["round"]]
        assert served == rnd["islands_served"] and len(served) == 2


# ------------------------------------------------------------------ a real llama.cpp server

@pytest.mark.server
@requires_llama
def test_atlas_against_a_real_server(tmp_path, llama_url):
    results, events = _run(tmp_path, SHORT + _openai(llama_url))
    stats = results["supporters"]
    _check_counters(stats, "openai")
    _check_table_fields(results, events)
    exp = stats["exploration"]
    assert exp["calls"] == 2 and exp["embedded"] == 0
    asked = sum(s["llm_ok"] + sum(s["fallbacks"].values()) for s in stats.values())
    assert asked >= 2  # every exploration call went to the server
    for s in stats.values():  # loopback server up the whole run: no transport failure
        assert s["fallbacks"]["unreachable"] == 0
    exploration = [e for e in events if e["event"] == "exploration"]
    assert len(exploration) == 2
    for e in exploration:  # labelled honestly: the model's answer, or the rule and why
        assert (e["backend"] == "openai") == (e["fallback_cause"] is None)
        assert e["fallback_cause"] in (None, *FALLBACK_CAUSES)
        assert e["critique"]
    ok = sum(s["llm_ok"] for s in stats.values())
    print(f"[smollm2 supporters in a method=atlas run] valid answers {ok}/{asked}: " + "; ".join(
        f"{n} {s['llm_ok']}/{s['calls']} {({k: v for k, v in s['fallbacks'].items() if v})}"
        for n, s in stats.items()))


@pytest.mark.server
@requires_llama
def test_server_killed_mid_run_falls_back_as_unreachable(tmp_path, monkeypatch):
    proc, url = start_llama_server(tmp_path)
    original = ExplorationSupporter.advise

    def advise_then_kill(self, req):  # the real call; the server dies right after the first
        out = original(self, req)
        stop_llama_server(proc)
        return out

    monkeypatch.setattr(ExplorationSupporter, "advise", advise_then_kill)
    try:
        results, events = _run(tmp_path / "run", SHORT + ["explore.rounds=3"] + _openai(url))
    finally:
        stop_llama_server(proc)
    assert proc.poll() is not None
    stats = results["supporters"]
    _check_counters(stats, "openai")
    exploration = [e for e in events if e["event"] == "exploration"]
    assert [e["round"] for e in exploration] == [1, 2, 3]
    assert exploration[0]["fallback_cause"] != "unreachable"  # the server was up for round 1
    for e in exploration[1:]:  # afterwards: the embedded rule, labelled with the cause
        assert e["backend"] == "embedded" and e["fallback_cause"] == "unreachable"
        assert e["critique"]
    assert stats["exploration"]["fallbacks"]["unreachable"] == 2
    strat = stats["strategist"]  # every phase runs after round 1's call: the server is gone
    assert strat["fallbacks"]["unreachable"] == strat["calls"] - strat["embedded"]
    assert results["rounds"] == 3 and results["phases"] == 3
    _check_table_fields(results, events)


# ------------------------------------------------------------------ a misbehaving endpoint

class _Scripted(ScriptedServer):
    def handle_error(self, request, client_address) -> None:
        """The client gave up on the slow answer before it was written: expected, not news."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def test_garbage_slow_and_failing_answers_during_a_run(tmp_path):
    srv = _Scripted()
    # exploration round 1: prose; strategist phase 1: too slow; exploration round 2: a body
    # that is not a chat completion; then HTTP 500 for everything left (strategist phase 2).
    # The script is served in call order, so the calls are pinned for every task secret:
    # each phase asks the strategist (no B.4 skip when no patch beat the seed), and no phase
    # builds pairs (patches are not preferences; the tiny agent writes nothing valid), so no
    # gate accepts and no inspector call takes an answer meant for exploration
    srv.script.extend([("content", "Sure! Here are some thoughts on your policy."),
                       ("sleep", 3.0), ("body", "{not json")])
    try:
        results, events = _run(tmp_path, SHORT + _openai(srv.url, timeout_s=1.0) + [
            "method.skip_without_improvement=false",
            "supporters.exploration.as_preferences=false",
            *QUICK_BANDIT, "task.timeout_s=60"])  # no score matters; a loaded machine
    finally:
        srv.kill()
    stats = results["supporters"]
    _check_counters(stats, "openai")
    causes = [e["fallback_cause"] for e in events if e["event"] == "exploration"]
    assert causes == ["prose", "malformed"]
    assert stats["exploration"]["fallbacks"]["prose"] == 1
    assert stats["exploration"]["fallbacks"]["malformed"] == 1
    strat = stats["strategist"]
    assert strat["llm_ok"] == 0 and strat["calls"] == 2  # one per phase
    assert strat["fallbacks"]["timeout"] == 1  # the slow answer
    assert strat["fallbacks"]["http_error"] == strat["calls"] - 1  # HTTP 500 afterwards
    assert strat["fallbacks"]["unreachable"] == 0
    assert stats["inspector"]["calls"] == 0
    phases = [e for e in events if e["event"] == "phase" and "strategist" in e]
    assert [e["strategist"]["fallback_cause"] for e in phases] == ["timeout", "http_error"]
    # every request the loop sent was a well-formed chat completion request for the role model
    assert srv.requests and all(r["model"] == "smollm2" and len(r["messages"]) == 2
                                for r in srv.requests)
    _check_table_fields(results, events)


# ------------------------------------------------------------------ a trained atlas phase

@pytest.mark.slow
def test_atlas_trains_with_smollm2(tmp_path):
    """SmolLM2 writes some valid programs, so a phase trains: DPO, gate, inspector, promotion.

    One phase after two rounds, trained even without a new best (a supporter patch usually
    sets the best, so paper B.4's skip would leave nothing to test). ~10 min on a busy CPU.
    """
    results, events = _run(tmp_path, [
        "method=atlas", "task=bandit", "progress=false", "logger=none", "explore.rounds=2",
        "explore.phase_every=2", "explore.samples_per_prompt=4", "explore.max_new_tokens=200",
        "dpo.max_pairs=4", "gate.subset_size=2", "method.skip_without_improvement=false"])
    _check_counters(results["supporters"], "embedded")
    _check_table_fields(results, events)
    assert results["valid_rate"] > 0
    assert results["phases_trained"] >= 1
    trained = [e for e in events if e["event"] == "phase" and not e.get("skipped")]
    for e in trained:
        assert e["pairs"] >= 1 and e["dpo"] and e["gate"] is not None
        assert e["promoted"] == (e["gate"]["accepted"] and not e["vetoed"])
    assert results["accept_rate"] == results["promotions"] / len(trained)
    assert results["supporters"]["inspector"]["calls"] == sum(
        1 for e in trained if e["gate"]["accepted"])
