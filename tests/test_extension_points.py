"""docs/gate.md, "Adding a gate rule or a method": each place a new rule or method must reach
is checked here, so a contributor who misses one gets a failing test instead of a run whose
records, supporters or summary describe something else."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from pathlib import Path

import pytest
import yaml

from atlas.config import GATE_DECIDES, check_ignored_overrides
from atlas.dpo import rules
from atlas.dpo.config import GateConfig
from atlas.learning import FINE_TUNED, NEVER_TRAINED, NO_LLM
from atlas.report import METHOD_ORDER
from atlas.results import phase_line, summarise
from atlas.schema import ConfigError, MethodConfig
from atlas.supporters import requests as sreq
from atlas.types import GateDecision
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = (-1.0, 0.0, 0.005, 0.02, 0.5, math.nan)
KLS = (0.0, 0.01, 0.1, 10.0, math.nan)


# -- a gate rule ----------------------------------------------------------------------------
def test_every_rule_written_in_the_rules_module_is_registered() -> None:
    written = {c for _, c in inspect.getmembers(rules, inspect.isclass)
               if issubclass(c, rules.GateRule) and not inspect.isabstract(c)}
    assert written == {type(r) for r in rules.RULES.values()}
    assert all(name == r.name for name, r in rules.RULES.items())
    assert rules.DEFAULT_RULE == GateConfig().rule == "eq5"


def test_gate_rule_takes_each_registered_rule_and_names_them_when_refused() -> None:
    assert all(GateConfig(rule=name).rule == name for name in rules.RULES)
    with pytest.raises(ValueError, match=r"gate\.rule='median' is not one of \['eq5'\]"):
        GateConfig(rule="median")


@pytest.mark.parametrize("name", sorted(rules.RULES))
def test_a_rule_reads_only_what_it_names_and_a_method_without_the_gate_ignores_it(
        name: str) -> None:
    rule = rules.RULES[name]
    settings = {f.name for f in dataclasses.fields(GateConfig)}
    assert set(rule.reads) <= settings, "reads names a gate setting GateConfig lacks"
    assert {"rule", *rule.reads} <= set(GATE_DECIDES)
    gate = GateConfig(rule=name)
    for gain in NUMBERS:
        for kl in KLS:
            # ``judge`` hands the rule the settings it names and no others: reading another
            # one is a KeyError here
            v = rules.judge(gate, gain=gain, lower=gain, kl=kl)
            assert isinstance(v, rules.Verdict) and v.reason
            assert v.reason.startswith("accepted" if v.accepted else "rejected")
    nan = math.nan
    assert not rules.judge(gate, gain=nan, lower=nan, kl=nan).accepted  # nothing measured


@pytest.mark.parametrize("name", sorted(rules.RULES))
def test_a_rule_explains_each_rejection_it_gives_in_its_own_words(name: str) -> None:
    rule, gate = rules.RULES[name], GateConfig(rule=name)
    rejections = {}
    for gain in NUMBERS:
        for kl in KLS:
            v = rules.judge(gate, gain=gain, lower=gain, kl=kl)
            if not v.accepted:
                rejections.setdefault(v.reason, (gain, kl))
    assert rejections, "a rule that never rejects is no test"
    for reason, (gain, kl) in rejections.items():
        record = GateDecision(accepted=False, reason=reason, gain=gain, kl=kl,
                              lower_bound=gain, epsilon=gate.epsilon,
                              delta=gate.delta).to_dict()
        words = rule.explain(record)
        assert words.startswith(reason), words
        event = {"phase": 1, "gate": record, "promoted": False}
        assert phase_line(event, name)["why"] == words


def test_the_summary_words_a_rejection_through_the_runs_rule(tmp_path: Path,
                                                             monkeypatch) -> None:
    """The summary never words a rejection itself: it asks the rule named by the run's
    recorded ``gate.rule`` (an old run that recorded none: the default)."""
    monkeypatch.setattr(rules.Eq5, "explain", lambda self, gate: f"eq5 says {gate['reason']}")
    gate = GateDecision(accepted=False, reason=rules.NO_GAIN, gain=0.01, kl=0.001,
                        lower_bound=-0.02, epsilon=0.01, delta=0.05).to_dict()
    program = {"id": 0, "island": 0, "round": 0, "code": "def f():\n    return 0\n",
               "source": "seed", "evaluation": {"score": -1.0, "passed": True}}
    for recorded in ({"rule": "eq5", "epsilon": 0.01}, {"epsilon": 0.01}):
        run = tmp_path / str(len(recorded))
        run.mkdir()
        events = [{"event": "config", "config": {"gate": recorded}},
                  {"event": "phase", "phase": 1, "round": 2, "gate": gate, "promoted": False}]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (run / "programs.jsonl").write_text(json.dumps(program) + "\n")
        line = summarise(run, {})["reference_log"][0]
        assert line["outcome"] == "rejected" and line["why"] == "eq5 says rejected: no gain"


def test_the_supporters_read_the_decision_never_the_rule() -> None:
    """The inspector's request carries the numbers the decision was judged by; the
    strategist's "no gain" is the decision's reason (tests/test_supporters.py)."""
    d = GateDecision(accepted=True, reason=rules.ACCEPTED, gain=0.03, kl=0.02, epsilon=0.3,
                     delta=0.7)
    g = sreq.inspector_request(1, d, [], []).gate
    assert (g.gain, g.kl, g.epsilon, g.delta, g.accepted, g.reason) == (
        0.03, 0.02, 0.3, 0.7, True, rules.ACCEPTED)


def test_a_gate_setting_a_method_never_applies_is_refused() -> None:
    cfg = compose_cfg(["method=evodpo"])
    for setting in ("rule", *rules.read_by_rules()):
        value = getattr(GateConfig(), setting)
        with pytest.raises(ConfigError, match=rf"gate\.{setting}=.* no effect with "
                                              r"method=evodpo"):
            check_ignored_overrides(cfg, [f"gate.{setting}={value}"])


# -- a method --------------------------------------------------------------------------------
def _methods() -> dict[str, MethodConfig]:
    return {p.stem: MethodConfig.from_cfg(yaml.safe_load(p.read_text()))
            for p in sorted((ROOT / "conf" / "method").glob("*.yaml"))}


def test_every_method_has_its_place_in_the_reports() -> None:
    """A method is an arm of the report's paired differences and of the learning table: its
    role there follows from its switches (no LLM, never fine-tuned, fine-tuned)."""
    methods = _methods()
    assert all(m.name == option for option, m in methods.items())
    assert sorted(METHOD_ORDER) == sorted(methods)
    for name, m in methods.items():
        role = (NO_LLM if not m.uses_llm else NEVER_TRAINED if not m.fine_tune else "fine-tuned")
        assert (name in FINE_TUNED) == (role == "fine-tuned"), name
        assert role == "fine-tuned" or name == role, name
