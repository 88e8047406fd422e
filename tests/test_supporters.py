"""Supporter roles: embedded rules, answer validation, config, and the fallback paths
against a real (scripted) OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from atlas.dpo.config import DPOConfig, GateConfig
from atlas.dpo.rules import NO_GAIN
from atlas.supporters import (
    DpoMetrics,
    ExplorationRequest,
    GateDecision,
    GateNumbers,
    InspectorRequest,
    KnobBounds,
    Knobs,
    ProgramView,
    QualityMetricView,
    ScoreStats,
    StrategistRequest,
    make_supporters,
    prompts,
)
from atlas.supporters import requests as sreq
from atlas.supporters.answers import extract_json, parse_strategist
from atlas.supporters.config import RoleConfig, role_configs
from atlas.supporters.openai_backend import SupporterError, forget_negotiated, negotiated_modes
from atlas.supporters.patching import HELPER, add_robust_loss, find_numeric_sites
from atlas.supporters.schemas import ANSWER_SCHEMAS, FALLBACK_CAUSES, ExplorationAdvice
from atlas.tasks.base import PromptSpec
from atlas.types import Evaluation, GateItem, PhaseRecord, Program

BANDIT = '''import numpy as np

def policy(context, history, t, state):
    # sliding-window LinUCB
    window_size = 50
    lam = 1.0
    for i in range(5):
        pass
    recent = history[-window_size:]
    return int(np.argmax(np.asarray(context).sum(axis=0)))
'''

PINN = '''def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    w_ic = 10.0  # initial condition weight
    return (residuals ** 2).mean() + w_ic * (ic_err**2).mean() + np.square(bc_err).mean()
'''


def _explore_req(programs, task="bandit", entry="policy", temperature=0.9) -> ExplorationRequest:
    from atlas.tasks import make_task

    hints = tuple(make_task(task).supporter_hints)  # the task's own hints, as the loop sends
    return ExplorationRequest(task_name=task, island=0, entry_point=entry,
                              temperature=temperature, temperature_bounds=(0.3, 1.5), problem="p",
                              signature=f"def {entry}():", programs=programs, task_hints=hints)


def _strat_req(**kw) -> StrategistRequest:
    base = dict(phase=1, knobs=Knobs(beta=0.1, lr=5e-5, epochs=2, score_threshold=None),
                pairs_built=10, scores=ScoreStats(best=-0.4, median=-0.5, min=-0.7,
                                                  valid_rate=0.5, n=8),
                diversity=0.8, dpo=DpoMetrics(loss=0.6, accuracy=0.8, margin=0.1),
                gate_delta=0.05)
    base.update(kw)
    return StrategistRequest(**base)


def phase_record(phase, pairs=None, dpo=None, gate=None, skip=None) -> PhaseRecord:
    """A phase as FineTuner.history holds it: trained unless ``skip``; ``pairs`` None: no D_k."""
    rec = PhaseRecord(phase=phase, scores={}, improved=True, best_before=None,
                      reference="adaptive", built=pairs is not None, pairs=pairs or 0, dpo=dpo,
                      gate=gate)
    return rec.skip(skip) if skip else rec


def _gate(accepted=True) -> GateNumbers:
    return GateNumbers(gain=0.02, kl=0.01, epsilon=0.0, delta=0.05, accepted=accepted,
                       reason="gain>=eps and kl<=delta" if accepted else "kl>delta")


# ------------------------------------------------------------------ embedded exploration

def test_numeric_sites_are_hyperparameters_not_indices():
    sites = find_numeric_sites(BANDIT)
    assert [(s.name, s.value) for s in sites] == [("window_size", 50.0), ("lam", 1.0)]
    code = "def f(x, alpha=0.5, flag=True, k=1):\n    return g(x, scale=3.0, axis=1)\n"
    assert [(s.name, s.value) for s in find_numeric_sites(code)] == [("alpha", 0.5),
                                                                    ("scale", 3.0)]
    assert find_numeric_sites("def f(:\n") == []


def test_exploration_perturbs_hyperparameters_deterministically():
    sup = make_supporters(role_configs(None), seed=3)
    req = _explore_req([ProgramView(code=BANDIT, score=-0.55, passed=True),
                        ProgramView(code="def policy(:", passed=False,
                                    failure_kind="syntax_error")])
    adv = sup.exploration.advise(req)
    assert adv.backend == "embedded" and adv.fallback_cause is None
    assert len(adv.patches) == 2
    for patch in adv.patches:
        compile(patch, "<patch>", "exec")
        assert patch.count("\n") == BANDIT.count("\n")  # layout and comments kept
        assert "# sliding-window LinUCB" in patch
    changed = sorted({line.strip() for p in adv.patches for line in p.splitlines()}
                     - set(line.strip() for line in BANDIT.splitlines()))
    assert changed in (["window_size = 100", "window_size = 25"], ["lam = 0.5", "lam = 2.0"])
    assert "syntax_error x1" in adv.critique and "-0.55" in adv.critique
    again = make_supporters(role_configs(None), seed=3).exploration.advise(req)
    assert again.patches == adv.patches and again.critique == adv.critique


def test_a_call_that_needs_no_fallback_prints_nothing_at_info(caplog):
    """The console of a run gets a supporter's fallbacks (warnings) and the summary's counts;
    each call's backend is in the events, not a console line per call."""
    import logging

    caplog.set_level(logging.INFO, logger="atlas.supporters")
    adv = make_supporters(role_configs(None), seed=3).exploration.advise(
        _explore_req([ProgramView(code=BANDIT, score=-0.55, passed=True)]))
    assert adv.backend == "embedded" and adv.patches
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_exploration_adds_smooth_huber_to_loss_strategies():
    patched = add_robust_loss(PINN, "pinn_loss_strategy")
    assert patched is not None and patched.count(HELPER + "(") == 4  # def + 3 replaced terms
    ns = {"np": np}
    exec(compile(patched, "<p>", "exec"), ns)  # noqa: S102 - our own patch
    huber = ns[HELPER]
    assert huber(np.array(0.1)) == pytest.approx(0.5 * 0.01, rel=1e-2)  # quadratic near 0
    assert huber(np.array(100.0)) == pytest.approx(99.005, rel=1e-4)  # linear tail, not 1e4
    small = np.full(4, 0.01)
    loss = ns["pinn_loss_strategy"](small, small, small, {})
    assert loss == pytest.approx(0.5 * (1e-4 + 10 * 1e-4 + 1e-4), rel=1e-3)
    assert add_robust_loss(PINN.replace("np.square", "np.clip"), "pinn_loss_strategy") is None
    adv = make_supporters(role_configs(None), seed=0).exploration.advise(
        _explore_req([ProgramView(code=PINN, score=-0.1, passed=True)], task="pinn",
                     entry="pinn_loss_strategy"))
    assert HELPER in adv.patches[0] and "Huber" in adv.critique
    # the rule follows the task's hint, not its name: a loss-named task without it gets none
    plain = _explore_req([ProgramView(code=PINN, score=-0.1, passed=True)], task="bandit",
                         entry="pinn_loss_strategy")
    adv = make_supporters(role_configs(None), seed=0).exploration.advise(plain)
    assert not any(HELPER in p for p in adv.patches) and "Huber" not in adv.critique


@pytest.mark.parametrize("programs,t0,expected", [
    ([ProgramView(code="x", passed=False, failure_kind="timeout")] * 3, 0.9, 0.8),
    ([ProgramView(code=BANDIT, score=-0.5, passed=True)] * 2, 0.9, 1.0),
    ([ProgramView(code=BANDIT, score=-0.5, passed=True)] * 2, 1.5, 1.5),
    ([ProgramView(code="x", passed=False)] * 3, 0.3, 0.3),
    ([], 2.4, 1.5),
])
def test_exploration_temperature_rule_stays_in_bounds(programs, t0, expected):
    adv = make_supporters(role_configs(None), seed=0).exploration.advise(
        _explore_req(programs, temperature=t0))
    assert adv.temperature == pytest.approx(expected)


def test_exploration_without_programs_gives_a_critique_and_no_patches():
    adv = make_supporters(role_configs(None), seed=0).exploration.advise(_explore_req([]))
    assert adv.patches == [] and "seed program" in adv.critique


# ------------------------------------------------------------------ embedded strategist

@pytest.mark.parametrize("kw,changed,check", [
    ({}, [], lambda k: k == Knobs(beta=0.1, lr=5e-5, epochs=2)),
    ({"pairs_built": 1, "knobs": Knobs(beta=0.1, lr=5e-5, epochs=2, score_threshold=-0.45)},
     ["score_threshold"], lambda k: k.score_threshold == -0.7),
    ({"diversity": 0.1}, ["beta"], lambda k: k.beta == pytest.approx(0.2)),
    ({"diversity": 0.1, "knobs": Knobs(beta=1.5, lr=5e-5, epochs=2)}, ["beta"],
     lambda k: k.beta == 2.0),
    ({"gate_decisions": [GateDecision(accepted=False, gain=0.1, kl=0.2)]}, ["lr"],
     lambda k: k.lr == pytest.approx(2.5e-5)),
    # one no-gain rejection is noise; two in a row with a policy that hardly moved are not
    ({"gate_decisions": [GateDecision(accepted=False, reason=NO_GAIN, gain=-0.1, kl=0.01)]},
     [], lambda k: k.lr == 5e-5),
    ({"gate_decisions": [GateDecision(accepted=False, reason=NO_GAIN, gain=-0.1, kl=0.01)] * 2},
     ["lr"], lambda k: k.lr == pytest.approx(1e-4)),
    ({"gate_decisions": [GateDecision(accepted=False, reason=NO_GAIN, gain=-0.1, kl=0.04)] * 2},
     [], lambda k: k.lr == 5e-5),  # KL > delta/2: the policy moved, a bigger step is no cure
    # the gate tests a bound on the gain: its reason, not gain < epsilon, says "no gain"
    ({"gate_epsilon": 0.02, "gate_decisions": [GateDecision(
        accepted=False, reason="rejected: no gain", gain=0.03, kl=0.01)] * 2}, ["lr"],
     lambda k: k.lr == pytest.approx(1e-4)),
    ({"gate_epsilon": 0.02, "gate_decisions": [GateDecision(
        accepted=False, reason="rejected: no held-out gate item", gain=0.0, kl=0.0)] * 2}, [],
     lambda k: k.lr == 5e-5),
    # a decision is read, never re-derived: a gain below epsilon without the gate's reason
    # is not a "no gain" rejection
    ({"gate_epsilon": 0.02, "gate_decisions": [GateDecision(
        accepted=False, gain=-0.1, kl=0.01)] * 2}, [], lambda k: k.lr == 5e-5),
    ({"dpo": DpoMetrics(accuracy=1.0)}, ["epochs"], lambda k: k.epochs == 1 and k.beta == 0.1),
    ({"dpo": DpoMetrics(accuracy=1.0), "knobs": Knobs(beta=0.1, lr=5e-5, epochs=1)}, ["beta"],
     lambda k: k.epochs == 1 and k.beta == pytest.approx(0.15)),
    ({"dpo": DpoMetrics(accuracy=0.55), "knobs": Knobs(beta=0.1, lr=5e-5, epochs=5)}, [],
     lambda k: k.epochs == 5),
    ({"dpo": DpoMetrics(accuracy=0.55)}, ["epochs"], lambda k: k.epochs == 3),
    ({"dpo": DpoMetrics(accuracy=0.3)}, ["lr"], lambda k: k.lr == 2.5e-5 and k.epochs == 2),
    ({"scores": ScoreStats(), "knobs": Knobs(beta=0.1, lr=5e-5, epochs=2, score_threshold=1.0)},
     ["score_threshold"], lambda k: k.score_threshold is None),
    # a threshold is introduced only where passed scores spread around a median
    ({"scores": ScoreStats(best=-0.22, median=-0.375, min=-0.45, n=40, n_passed=17)},
     ["score_threshold"], lambda k: k.score_threshold == -0.375),
    ({"scores": ScoreStats(best=-0.22, median=-0.375, min=-0.375, n=40, n_passed=17)}, [],
     lambda k: k.score_threshold is None),  # median == min: it would filter nothing
    ({"scores": ScoreStats(best=-0.22, median=-0.375, min=-0.45, n=40, n_passed=5)}, [],
     lambda k: k.score_threshold is None),  # too few passed programs
    ({"pairs_built": 12, "knobs": Knobs(beta=0.1, lr=5e-5, epochs=2, score_threshold=-0.6),
      "scores": ScoreStats(best=-0.3, median=-0.4, min=-0.7, n=40, n_passed=20)},
     ["score_threshold"], lambda k: k.score_threshold == -0.4),
    ({"pairs_built": None, "knobs": Knobs(beta=0.1, lr=5e-5, epochs=2, score_threshold=-0.45)},
     [], lambda k: k.score_threshold == -0.45),  # before any D_k: no pair count to react to
])
def test_strategist_rules(kw, changed, check):
    adv = make_supporters(role_configs(None), seed=0).strategist.advise(_strat_req(**kw))
    assert adv.backend == "embedded" and sorted(adv.changed) == sorted(changed)
    assert check(adv.knobs), adv
    assert adv.rationale and (changed or "no change" in adv.rationale)
    assert sorted(adv.reasons) == sorted(changed) and all(adv.reasons.values())
    b = KnobBounds()
    assert b.beta[0] <= adv.beta <= b.beta[1] and b.lr[0] <= adv.lr <= b.lr[1]


def test_bounds_outside_hard_limits_are_rejected_with_the_field():
    with pytest.raises(ValueError, match=r"bounds.lr.*dpo.bounds.lr"):
        KnobBounds(lr=(1e-7, 1e-3))
    with pytest.raises(ValueError):
        ExplorationAdvice(temperature=0.0)


def test_the_exploration_supporter_keeps_the_requests_temperature_bounds():
    """explore.temperature_bounds travels in the request: the rule clamps to it, and a
    model's answer outside it is out of range (clamped with out_of_range=clamp)."""
    from atlas.supporters.answers import parse_exploration
    from atlas.supporters.config import ExplorationConfig

    narrow = _explore_req([], temperature=1.8)
    wide = narrow.model_copy(update={"temperature_bounds": (0.3, 2.0)})
    rule = make_supporters(role_configs(None), seed=0).exploration
    assert rule.advise(narrow).temperature == 1.5 and rule.advise(wide).temperature == 1.8
    answer = json.dumps({"critique": "c", "patches": [], "temperature": 1.9})
    clamp = ExplorationConfig(out_of_range="clamp")
    assert parse_exploration(answer, narrow, clamp).temperature == 1.5
    assert parse_exploration(answer, wide, clamp).temperature == 1.9
    with pytest.raises(SupporterError, match=r"temperature=1.9 outside \[0.3, 1.5\]"):
        parse_exploration(answer, narrow, ExplorationConfig())


# ------------------------------------------------------------------ embedded inspector

@pytest.mark.parametrize("cand,ref,veto", [
    ({"val_ic": 0.5, "val_pde": 1e-4}, {"val_ic": 0.01, "val_pde": 1e-2}, True),  # IC spike
    ({"val_ic": 0.015, "val_pde": 1e-4}, {"val_ic": 0.01, "val_pde": 1e-2}, False),
    ({"val_ic": 3e-7}, {"val_ic": 1e-7}, False),  # x3 but below the absolute floor
    ({"nmr": -0.60}, {"nmr": -0.50}, True),
    ({"nmr": -0.52}, {"nmr": -0.50}, False),
    ({"val_bc": math.inf}, {"val_bc": 0.1}, True),
    ({}, {}, False),
])
def test_inspector_vetoes_component_regressions(cand, ref, veto):
    declared = [QualityMetricView(name=n, direction="max" if n == "nmr" else "min")
                for n in ("val_ic", "val_pde", "val_bc", "nmr")]
    v = make_supporters(role_configs(None), seed=0).inspector.review(
        InspectorRequest(phase=2, gate=_gate(True), candidate_metrics=cand,
                         reference_metrics=ref, quality_metrics=declared))
    assert v.veto is veto and v.accepted is (not veto)
    if veto:
        assert v.reason.startswith("Regression:") and set(v.regressions) <= set(cand)
        json.dumps(v.to_record(), allow_nan=False)  # log-safe even for non-finite metrics


def _preferred(metrics_cand: dict, metrics_ref: dict):
    """One gate item whose candidate-preferred and reference-preferred programs carry these
    evaluator metrics (as the loop's programs do)."""
    progs = [Program(id=i, island=0, round=1, code="x", completion=f"c{i}",
                     evaluation=Evaluation(score=-0.3, passed=True, metrics=m))
             for i, m in enumerate((metrics_cand, metrics_ref))]
    items = [GateItem(prompt="q", completions=["c0", "c1"], scores=[-0.3, -0.3], preferred="c0")]
    decision = GateDecision(gain=0.01, kl=0.001, accepted=True, reason="accepted",
                            epsilon=0.0, delta=0.05, candidate_preferred=[0],
                            reference_preferred=[1])
    return decision, items, progs


def test_inspector_keeps_a_bandit_candidate_better_on_every_declared_metric():
    # measured in a CPU run: vetoed for "nmr_std 0.01 vs 0.07, optimal_rate 0.5 vs 0.22" when
    # directions were guessed from names; nmr_std and timings are not declared quality
    from atlas.tasks.bandit import BanditTask
    cand = {"nmr": -0.22, "nmr_std": 0.01, "regret_first_half": 0.2, "regret_second_half": 0.24,
            "mean_reward": 0.31, "optimal_rate": 0.5, "nmr_seed0": -0.21, "seconds": 4.0}
    ref = {"nmr": -0.375, "nmr_std": 0.07, "regret_first_half": 0.35, "regret_second_half": 0.4,
           "mean_reward": 0.15, "optimal_rate": 0.22, "nmr_seed0": -0.39, "seconds": 1.0}
    req = sreq.inspector_request(2, *_preferred(cand, ref),
                                 quality_metrics=BanditTask.quality_metrics)
    assert set(req.candidate_metrics) == {"nmr", "regret_first_half", "regret_second_half",
                                          "mean_reward", "optimal_rate"}
    assert req.directions["optimal_rate"] == "max" and req.directions["regret_first_half"] == "min"
    v = make_supporters(role_configs(None), seed=0).inspector.review(req)
    assert v.accepted and not v.veto and v.reason.startswith("no regression on")
    # the same candidate with a collapsed optimal-arm rate is vetoed, in the declared direction
    worse = sreq.inspector_request(2, *_preferred({**cand, "optimal_rate": 0.1}, ref),
                                   quality_metrics=BanditTask.quality_metrics)
    v = make_supporters(role_configs(None), seed=0).inspector.review(worse)
    assert v.veto and set(v.regressions) == {"optimal_rate"}
    assert v.regressions["optimal_rate"] == [0.1, 0.22] and "higher is better" in v.reason


def test_inspector_on_pinn_ignores_flags_and_own_loss_but_vetoes_an_ic_spike():
    from atlas.tasks.pinn import PinnTask
    ref = {"val_pde": 1e-2, "val_ic": 0.01, "val_bc": 1e-3, "val_loss": 0.021, "rel_l2": 0.1,
           "candidate_jit": 0.0, "own_val_loss": 0.02, "viscosity": 0.03, "seconds_train": 3.0}
    same = {**ref, "candidate_jit": 1.0, "own_val_loss": 5.0, "seconds_train": 9.0}
    sup = make_supporters(role_configs(None), seed=0)
    req = sreq.inspector_request(2, *_preferred(same, ref), quality_metrics=PinnTask.quality_metrics)
    assert "candidate_jit" not in req.candidate_metrics and "own_val_loss" not in req.reference_metrics
    assert sup.inspector.review(req).accepted
    spike = {**ref, "val_pde": 1e-4, "val_ic": 0.5, "val_loss": 0.5011}  # trivial solution u=0
    v = sup.inspector.review(sreq.inspector_request(2, *_preferred(spike, ref),
                                                    quality_metrics=PinnTask.quality_metrics))
    assert v.veto and not v.accepted and "val_ic" in v.regressions
    assert v.regressions["val_ic"] == [0.5, 0.01] and "val_pde" not in v.regressions
    # the LLM inspector's prompt carries the declaration, with directions and descriptions
    _, user = prompts.inspector(req)
    assert "val_ic: lower is better (initial-condition error" in user
    assert "candidate_jit" not in user and "own_val_loss" not in user
    # no declaration: nothing is compared, the gate's decision stands
    bare = sreq.inspector_request(2, *_preferred(spike, ref))
    assert bare.candidate_metrics == {} and sup.inspector.review(bare).accepted


def test_inspector_never_forces_a_rejected_promotion():
    sup = make_supporters(role_configs(None), seed=0)
    v = sup.inspector.review(InspectorRequest(phase=1, gate=_gate(False),
                                              candidate_metrics={"val_ic": 0.0},
                                              reference_metrics={"val_ic": 1.0}))
    assert v.accepted is False and v.veto is False and "nothing to review" in v.reason
    assert sup.stats()["inspector"]["embedded"] == 1


# ------------------------------------------------------------------ config

def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"supporters.strategist.temprature"):
        role_configs({"strategist": {"temprature": 0.5}})
    with pytest.raises(ValueError, match=r"supporters.exploration.*model"):
        role_configs({"backend": "openai"})
    with pytest.raises(ValueError, match=r"unknown supporters field.*colour"):
        role_configs({"colour": 1})
    with pytest.raises(ValueError, match=r"supporters.inspector.timeout_s"):
        role_configs({"inspector": {"timeout_s": -1}})
    for cfg in ({"json_mode": True}, {"strategist": {"json_mode": True}}):
        with pytest.raises(ValueError, match=r"json_mode was replaced by structured_output"):
            role_configs(cfg)
    with pytest.raises(ValueError, match=r"supporters.strategist.structured_output"):
        role_configs({"strategist": {"structured_output": "grammar"}})


def test_backends_mix_per_role_and_presets_load():
    from omegaconf import OmegaConf
    cfgs = role_configs({"backend": "openai", "model": "m", "temperature": 0.2,
                         "inspector": {"backend": "embedded"},
                         "strategist": {"model": "s", "temperature": 0.9}})
    assert [cfgs[r].backend for r in ("exploration", "strategist", "inspector")] == [
        "openai", "openai", "embedded"]
    assert (cfgs["exploration"].model, cfgs["strategist"].model) == ("m", "s")
    assert (cfgs["exploration"].temperature, cfgs["strategist"].temperature) == (0.2, 0.9)
    paper = role_configs(OmegaConf.load("conf/supporters/ollama_paper.yaml"))
    assert [paper[r].model for r in ("exploration", "strategist", "inspector")] == [
        "gpt-oss:120b", "deepseek-r1:32b", "llama4:latest"]
    assert {paper[r].temperature for r in paper} == {0.7}
    assert {paper[r].base_url for r in paper} == {"http://localhost:11434/v1"}
    emb = role_configs(OmegaConf.load("conf/supporters/embedded.yaml"))
    assert {c.backend for c in emb.values()} == {"embedded"}
    with pytest.raises(ValueError, match="model"):
        role_configs(OmegaConf.load("conf/supporters/openai.yaml"))


# ------------------------------------------------------------------ answer validation

def test_extract_json_handles_fences_think_blocks_and_prose():
    assert extract_json('<think>{"beta": 9}</think>ok ```json\n{"beta": 0.5}\n```') == {
        "beta": 0.5}
    assert extract_json('Sure! {"a": {"b": 1}} trailing') == {"a": {"b": 1}}
    with pytest.raises(SupporterError) as e:
        extract_json("I think beta should be higher.")
    assert e.value.cause == "prose"
    with pytest.raises(SupporterError) as e:
        extract_json("{beta: 0.5,}")
    assert e.value.cause == "malformed"


@pytest.mark.parametrize("answer,cause", [
    ('{"lr": -0.001}', "out_of_range"),
    ('{"epochs": 40}', "out_of_range"),
    ('{"beta": NaN}', "out_of_range"),
    ('{"score_threshold": 3.0}', "out_of_range"),
    ('{"epochs": 2.5}', "malformed"),
    ('{"beta": "high"}', "malformed"),
])
def test_strategist_answer_validation(answer, cause):
    with pytest.raises(SupporterError) as e:
        parse_strategist(answer, _strat_req(), RoleConfig())
    assert e.value.cause == cause


def test_strategist_answer_partial_and_clamped():
    adv = parse_strategist('{"beta": "0.5", "epochs": 3.0, "rationale": "more"}', _strat_req(),
                           RoleConfig())
    assert (adv.beta, adv.lr, adv.epochs, adv.score_threshold) == (0.5, 5e-5, 3, None)
    assert sorted(adv.changed) == ["beta", "epochs"] and adv.backend == "openai"
    clamp = RoleConfig(out_of_range="clamp")
    adv = parse_strategist('{"lr": -1, "epochs": 99, "score_threshold": -5}', _strat_req(), clamp)
    assert (adv.lr, adv.epochs, adv.score_threshold) == (1e-6, 5, -0.7)
    assert "clamped" in adv.rationale


# ------------------------------------------------------------------ request builders

def test_request_builders_read_loop_objects():
    class Task:
        name = "bandit"

        def prompt_spec(self) -> PromptSpec:
            return PromptSpec(system="s", problem="p", signature="def policy():",
                              entry_point="policy", hints=("h",))

    def prog(i, score, code=BANDIT, metrics=None):
        ev = (Evaluation(score=score, passed=True, metrics=metrics or {}) if score is not None
              else Evaluation.failure("timeout", "slow"))
        return Program(id=i, island=0, round=i, code=code, evaluation=ev, completion=f"c{i}")

    progs = [prog(0, -0.5), prog(1, None, code="x"), prog(2, -0.4, metrics={"val_ic": 0.1}),
             prog(3, -0.6, metrics={"val_ic": 0.4})]
    er = sreq.exploration_request(Task(), 0, progs, 0.8, (0.3, 1.5), round=5, best=2,
                                  recent=1)
    assert [p.score for p in er.programs] == [-0.4, -0.5, -0.6] and er.hints == ("h",)
    assert sreq.code_diversity(progs) == pytest.approx(2 / 4)

    dpo = DPOConfig(beta=0.1, lr=5e-5, epochs=1, score_threshold=None,
                    bounds={"beta": (0.05, 5.0), "lr": (1e-6, 1e-3), "epochs": (1, 3)})
    gate = GateConfig(epsilon=0.0, delta=0.05)
    history = [phase_record(1, pairs=6, dpo={"loss": 0.5, "accuracy": 0.9},
                            gate=GateDecision(accepted=False, gain=0.1, kl=0.2, reason="kl")),
               phase_record(2, skip="no score improvement")]
    sr = sreq.strategist_request(3, dpo, gate, progs, {"best": -0.4, "median": -0.5,
                                                       "min": -0.6, "valid_rate": 0.75, "n": 4},
                                 history)
    assert sr.bounds.beta == (0.05, 2.0) and sr.bounds.epochs == (1, 3)
    assert sr.pairs_built == 6 and sr.dpo.accuracy == 0.9 and sr.gate_decisions[0].kl == 0.2
    assert sr.scores.n_passed == 3
    assert sreq.strategist_request(1, dpo, gate, progs, {}, []).pairs_built is None  # no D_k yet
    assert sreq.strategist_request(3, dpo, gate, progs, {}, [phase_record(
        2, pairs=0, skip="no preference pairs")]).pairs_built == 0
    adv = make_supporters(role_configs(None), seed=0).strategist.advise(sr)
    assert adv.lr == pytest.approx(2.5e-5)  # last gate rejected for KL 0.2 > 0.05

    items = [GateItem(prompt="q", completions=["c2", "c3"], scores=[-0.4, -0.6], preferred="c2")]
    decision = GateDecision(gain=0.01, kl=0.01, accepted=True, reason="accepted", epsilon=0.0,
                            delta=0.05, candidate_preferred=[1], reference_preferred=["c2"])
    ir = sreq.inspector_request(3, decision, items, progs, quality_metrics={"val_ic": "min"})
    assert ir.candidate_metrics == {"val_ic": 0.4} and ir.reference_metrics == {"val_ic": 0.1}
    assert make_supporters(role_configs(None), seed=0).inspector.review(ir).veto


# ------------------------------------------------------------------ a scripted HTTP server

class ScriptedServer(ThreadingHTTPServer):
    """/v1/chat/completions on 127.0.0.1 answering from a script of behaviours."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: deque = deque()
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def kill(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 - the start's health request: GET /v1/models
        payload = b'{"object": "list", "data": [{"id": "scripted", "object": "model"}]}'
        self.send_response(200 if self.path.endswith("/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        srv: ScriptedServer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.requests.append(body)
        kind, arg = srv.script.popleft() if srv.script else ("status", 500)
        if kind == "sleep":
            time.sleep(arg)
            kind, arg = "content", '{"veto": false, "reason": "late"}'
        if kind == "status":
            self.send_response(arg)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "scripted failure"}}')
            return
        if kind == "body":
            payload = arg.encode()
        else:
            payload = json.dumps({
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": arg}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server():
    srv = ScriptedServer()
    yield srv
    srv.kill()


def _llm_supporters(url: str, **extra):
    # free text unless a test negotiates: these tests script one answer per request
    cfg = {"backend": "openai", "base_url": url, "model": "scripted", "timeout_s": 2.0,
           "max_retries": 0, "structured_output": "text", "exploration": {"model": "explorer"},
           "strategist": {"model": "strategist", "temperature": 0.3}, **extra}
    return make_supporters(role_configs(cfg), seed=0)


def _assert_counters_add_up(stats: dict) -> None:
    for s in stats.values():
        assert s["calls"] == s["llm_ok"] + s["embedded"] + sum(s["fallbacks"].values())


def test_valid_llm_answers_are_used_and_labelled(server):
    sup = _llm_supporters(server.url, structured_output="json_object")
    patch = BANDIT.replace("50", "20")
    server.script.extend([
        ("content", json.dumps({"critique": "Window too large for drift.",
                                "patches": [f"```python\n{patch}\n```", "def nope(:"],
                                "temperature": 0.7})),
        ("content", '<think>beta up</think>{"beta": 0.7, "epochs": 3, "rationale": "r"}'),
        ("content", '{"veto": true, "reason": "Regression: IC error spike"}'),
    ])
    adv = sup.exploration.advise(_explore_req([ProgramView(code=BANDIT, score=-0.5,
                                                           passed=True)]))
    assert (adv.backend, adv.fallback_cause, adv.temperature) == ("openai", None, 0.7)
    assert adv.patches == [patch] and adv.patches_dropped == 1
    assert adv.critique == "Window too large for drift." and "critique" in adv.raw
    st = sup.strategist.advise(_strat_req())
    assert (st.backend, st.beta, st.epochs, sorted(st.changed)) == ("openai", 0.7, 3,
                                                                   ["beta", "epochs"])
    v = sup.inspector.review(InspectorRequest(phase=1, gate=_gate(True)))
    assert (v.backend, v.veto, v.accepted) == ("openai", True, False)
    models = [r["model"] for r in server.requests]
    assert models == ["explorer", "strategist", "scripted"]
    assert server.requests[1]["temperature"] == 0.3
    assert all(r["response_format"] == {"type": "json_object"} for r in server.requests)
    assert "window_size = 50" in server.requests[0]["messages"][1]["content"]
    strat_prompt = server.requests[1]["messages"][1]["content"]
    assert "beta=0.1, lr=0.00005, epochs=2" in strat_prompt and "epochs integer 1..5" in strat_prompt
    assert "lr 0.000001..0.001" in strat_prompt  # plain decimals: SmolLM2 misread 5e-05
    assert "accepted" in server.requests[2]["messages"][1]["content"]
    stats = sup.stats()
    assert [stats[r]["llm_ok"] for r in ("exploration", "strategist", "inspector")] == [1, 1, 1]
    _assert_counters_add_up(stats)


def test_each_failure_falls_back_to_the_rule_and_is_counted(server):
    sup = _llm_supporters(server.url, timeout_s=0.5)
    server.script.extend([
        ("content", "Lower the learning rate and raise beta a little."),      # prose
        ("content", '{"beta": 0.5, "lr": }'),                                 # malformed
        ("content", '{"beta": 0.5, "lr": -0.01, "epochs": 400}'),             # out of range
        ("sleep", 1.5),                                                       # timeout
        ("body", "<html>502 bad gateway</html>"),                             # not a completion
        ("status", 503),                                                      # server error
    ])
    expected = ["prose", "malformed", "out_of_range", "timeout", "malformed", "http_error"]
    rule = make_supporters(role_configs(None), seed=0).strategist.advise(_strat_req())
    for cause in expected:
        adv = sup.strategist.advise(_strat_req())
        assert (adv.backend, adv.fallback_cause) == ("embedded", cause)
        assert adv.knobs == rule.knobs  # exactly the embedded rule's answer
    server.kill()
    t0 = time.time()
    adv = sup.strategist.advise(_strat_req())
    assert adv.fallback_cause == "unreachable" and time.time() - t0 < 5
    s = sup.stats()["strategist"]
    assert s["calls"] == 7 and s["llm_ok"] == 0
    assert s["fallbacks"] == {"prose": 1, "malformed": 2, "out_of_range": 1, "timeout": 1,
                              "http_error": 1, "unreachable": 1, "breaker_open": 0}
    _assert_counters_add_up(sup.stats())


def test_out_of_range_temperature_and_bad_veto_fall_back(server):
    sup = _llm_supporters(server.url)
    server.script.extend([("content", '{"critique": "c", "patches": [], "temperature": 3.0}'),
                          ("content", '{"veto": "perhaps", "reason": ""}')])
    adv = sup.exploration.advise(_explore_req([]))
    assert adv.fallback_cause == "out_of_range" and adv.temperature == 0.9
    v = sup.inspector.review(InspectorRequest(
        phase=1, gate=_gate(True), candidate_metrics={"val_ic": 1.0},
        reference_metrics={"val_ic": 0.01},
        quality_metrics=[QualityMetricView(name="val_ic", direction="min")]))
    assert (v.fallback_cause, v.veto, v.accepted) == ("malformed", True, False)  # the rule's


def test_retries_are_bounded_and_rejections_never_reach_the_model(server):
    sup = _llm_supporters(server.url, max_retries=1)
    server.script.extend([("status", 500), ("status", 500), ("status", 500)])
    adv = sup.strategist.advise(_strat_req())
    assert adv.fallback_cause == "http_error" and len(server.requests) == 2
    v = sup.inspector.review(InspectorRequest(phase=1, gate=_gate(False)))
    assert v.accepted is False and len(server.requests) == 2  # not asked
    assert sup.stats()["inspector"] == {"backend": "openai", "calls": 1, "llm_ok": 0,
                                        "embedded": 1, "fallbacks": dict.fromkeys(
                                            FALLBACK_CAUSES, 0), "modes": {}}


def test_structured_output_negotiation_is_remembered_per_server(server):
    """auto: json_schema (OpenAI form) first; a server that rejects it with HTTP 500 (as
    llama-cpp-python does) is asked with the schema inside json_object, and every later call
    of every role goes straight to what worked on that base_url."""
    forget_negotiated()
    sup = _llm_supporters(server.url, structured_output="auto")
    server.script.extend([("status", 500),
                          ("content", '{"beta": 0.2, "lr": 5e-5, "epochs": 2, '
                                      '"score_threshold": null, "rationale": "r"}'),
                          ("content", '{"veto": false, "reason": "fine"}')])
    st = sup.strategist.advise(_strat_req())
    assert (st.backend, st.output_mode, st.beta) == ("openai", "json_object_schema", 0.2)
    formats = [r.get("response_format") for r in server.requests]
    assert formats[0]["type"] == "json_schema" and formats[0]["json_schema"]["strict"] is True
    assert formats[0]["json_schema"]["schema"] == ANSWER_SCHEMAS["strategist"]
    assert formats[1] == {"type": "json_object", "schema": ANSWER_SCHEMAS["strategist"]}
    assert negotiated_modes()[server.url] == "json_object_schema"
    v = sup.inspector.review(InspectorRequest(phase=1, gate=_gate(True)))
    assert (v.output_mode, len(server.requests)) == ("json_object_schema", 3)
    assert server.requests[2]["response_format"]["schema"] == ANSWER_SCHEMAS["inspector"]
    assert sup.stats()["strategist"]["modes"] == {"json_object_schema": {"asked": 1, "ok": 1}}
    forget_negotiated(server.url)
    # a server rejecting both schema forms is asked in free text; 503 (overloaded) is not a
    # format rejection: it is a failure, nothing is remembered
    server.script.extend([("status", 400), ("status", 422),
                          ("content", '{"veto": true, "reason": "Regression: x"}'),
                          ("status", 503)])
    sup2 = _llm_supporters(server.url, structured_output="auto")
    v = sup2.inspector.review(InspectorRequest(phase=1, gate=_gate(True)))
    assert (v.output_mode, v.veto) == ("text", True) and "response_format" not in \
        server.requests[-1]
    assert negotiated_modes()[server.url] == "text"
    forget_negotiated(server.url)
    v = sup2.inspector.review(InspectorRequest(phase=1, gate=_gate(True)))
    assert v.fallback_cause == "http_error" and server.url not in negotiated_modes()
    forget_negotiated()


def test_stats_survive_a_resume():
    a = make_supporters(role_configs(None), seed=0)
    a.strategist.advise(_strat_req())
    b = make_supporters(role_configs(None), seed=0)
    b.load_stats(json.loads(json.dumps(a.stats())))
    assert b.stats() == a.stats() and b.stats()["strategist"]["calls"] == 1


def test_tuple_assigned_hyper_parameters_are_tunable_sites() -> None:
    """The bandit seed program binds its knobs in one tuple assignment."""
    from atlas.supporters.patching import find_numeric_sites, perturb

    code = "def policy(c, h, t, s):\n    window, alpha, lam = 50, 1.0, 0.5\n    return 0\n"
    sites = find_numeric_sites(code)
    assert [(s.name, s.value) for s in sites] == [("window", 50.0), ("alpha", 1.0), ("lam", 0.5)]
    patched, text = perturb(code, sites[2], 2.0)
    assert text == "1.0" and "window, alpha, lam = 50, 1.0, 1.0" in patched


def test_strategist_acts_on_cpu_run_telemetry():
    """Phase telemetry shaped like the CPU bandit runs (seed-copying agent, 32 candidates per
    phase, supporter patches around the seed's -0.375): the rules act where it calls for it."""
    seed = BANDIT
    def prog(i, score, code, source="agent"):
        ev = (Evaluation(score=score, passed=True) if score is not None
              else Evaluation.failure("exception", "boom"))
        return Program(id=i, island=0, round=1, code=code, evaluation=ev, source=source)

    dpo = DPOConfig(beta=0.1, lr=5e-5, epochs=1, score_threshold=None, bounds={})

    # phase 1: 9 seed copies pass, 23 distinct failures; 8 patches spread around the seed
    p1 = ([prog(i, -0.375, seed) for i in range(9)]
          + [prog(100 + i, None, f"def policy(): return {i}") for i in range(23)]
          + [prog(200 + i, s, f"# patch {i}\n" + seed, "supporter") for i, s in
             enumerate((-0.30, -0.22, -0.45, -0.41, -0.33, -0.39, -0.26, -0.5))])
    stats1 = {"best": -0.22, "median": -0.375, "min": -0.5, "valid_rate": 17 / 40, "n": 40}
    strat = make_supporters(role_configs(None), seed=0).strategist
    a1 = strat.advise(sreq.strategist_request(1, dpo, GateConfig(epsilon=0.0, delta=0.05), p1,
                                              stats1, []))
    assert a1.changed == ["score_threshold"] and a1.score_threshold == -0.375
    assert "median" in a1.reasons["score_threshold"]
    # phase 2: 23 of 32 agent programs pass, 3 distinct (measured diversity 0.375); the last
    # phase's DPO accuracy 0.92 (first step at chance) is not saturation, 24 pairs are plenty
    p2 = ([prog(i, -0.375, seed if i % 3 else seed + f"# v{i % 2}\n") for i in range(23)]
          + [prog(100 + i, None, f"def policy(): return {i % 9}") for i in range(9)])
    hist = [phase_record(1, pairs=24, dpo={"accuracy": 0.917},
                         gate=GateDecision(accepted=True, gain=1e-4, kl=8e-4))]
    dpo = dataclasses.replace(dpo, score_threshold=-0.375)
    req2 = sreq.strategist_request(2, dpo, GateConfig(epsilon=0.0, delta=0.05), p2,
                                   {"best": -0.375, "median": -0.375, "min": -0.375,
                                    "valid_rate": 0.72, "n": 32}, hist)
    assert req2.diversity < 0.5
    a2 = strat.advise(req2)
    assert a2.changed == ["beta"] and a2.beta == pytest.approx(0.2)
    assert "diversity" in a2.reasons["beta"]



def test_strategist_on_the_recorded_cpu_run():
    """The programs a real CPU bandit run wrote (atlas/bench/data, 2 phases of 4 rounds): phase
    1 (9 seed copies passed, 78% distinct) calls for nothing; phase 2 (23 of 32 passed, 37.5%
    distinct: the agent repeats itself) raises beta, with its reason."""
    from pathlib import Path
    from statistics import median

    def score_stats(programs):  # atlas.fine_tuning.score_stats, without importing torch
        scores = sorted(p.score for p in programs if p.passed)
        return {"best": scores[-1], "median": median(scores), "min": scores[0],
                "valid_rate": len(scores) / len(programs), "n": len(programs)}

    path = Path(sreq.__file__).parents[1] / "bench" / "data" / "bandit_cpu_programs.jsonl"
    progs = []
    for r in map(json.loads, path.read_text().splitlines()):
        ev = r["evaluation"]
        progs.append(Program(
            id=r["id"], island=r["island"], round=r["round"], code=r["code"],
            evaluation=Evaluation(score=-math.inf if ev["score"] is None else ev["score"],
                                  passed=ev["passed"], failure_kind=ev.get("failure_kind", "ok")),
            prompt=r.get("prompt") or "", completion=r.get("completion") or "",
            source=r.get("source", "agent")))

    dpo = DPOConfig(beta=0.1, lr=5e-5, epochs=1, score_threshold=None, bounds={})

    strat = make_supporters(role_configs(None), seed=0).strategist
    history: list[PhaseRecord] = []
    changed = []
    for phase, (a, b) in enumerate([(1, 4), (5, 8)], 1):
        pp = [p for p in progs if a <= p.round <= b]
        req = sreq.strategist_request(phase, dpo, GateConfig(epsilon=0.0, delta=0.05), pp,
                                      score_stats([p for p in pp if p.source != "seed"]),
                                      history)
        adv = strat.advise(req)
        changed.append((round(req.diversity, 3), adv.changed))
        # what that run recorded after each phase: D_k size and mean DPO accuracy
        history.append(phase_record(phase, pairs=(24, 17)[phase - 1],
                                    dpo={"accuracy": (0.917, 0.889)[phase - 1]}))
    assert changed == [(0.781, []), (0.375, ["beta"])]
    assert "diversity 0.38" in adv.reasons["beta"] and adv.beta == pytest.approx(0.2)


def test_a_chat_backend_from_another_package_is_built_by_import_path(monkeypatch):
    """supporters.<role>.backend may name any chat backend class (built by Hydra's instantiate):
    linefit.chat.Scripted answers the strategist; atlas parses, bounds and counts the answer
    like an LLM server's, labels it with the backend's name, and a role it cannot answer falls
    back to the rule with its cause counted."""
    from tests.test_task_contract import EXTERNAL

    monkeypatch.syspath_prepend(str(EXTERNAL))
    sup = make_supporters(role_configs({"backend": "linefit.chat.Scripted"}), seed=0)
    adv = sup.strategist.advise(_strat_req())
    assert adv.backend == "linefit.chat.Scripted" and adv.fallback_cause is None
    assert adv.knobs.beta == 0.2 and adv.changed == ["beta"] and adv.output_mode == "scripted"
    # no scripted inspector answer: the rule decides, and the cause is counted
    verdict = sup.inspector.review(InspectorRequest(phase=1, gate=_gate(True)))
    assert verdict.backend == "embedded" and verdict.fallback_cause == "unreachable"
    stats = sup.stats()
    assert stats["strategist"]["llm_ok"] == 1 and stats["inspector"]["fallbacks"]["unreachable"] == 1
    with pytest.raises(ValueError, match=r"supporters.strategist.backend='nopkg.Chat' cannot be built"):
        make_supporters(role_configs({"strategist": {"backend": "nopkg.Chat"}}), seed=0)
    with pytest.raises(ValueError, match="not embedded, openai or the import path"):
        role_configs({"backend": "open ai"})
