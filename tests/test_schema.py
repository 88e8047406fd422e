"""One schema per config group (atlas/schema.py): defaults equal to the YAML, one error style."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from atlas.dpo import DPOConfig, GateConfig
from atlas.knobs import DEFAULT_BOUNDS, HARD_BOUNDS, KNOBS
from atlas.schema import ExploreConfig, MethodConfig, ModelConfig, RunConfig, SandboxConfig
from atlas.supporters.config import ExplorationConfig, InspectorConfig, StrategistConfig
from atlas.supporters.schemas import KNOB_FIELDS, Knobs
from atlas.tasks.bandit import DEFAULTS as BANDIT
from atlas.tasks.binpacking import DEFAULTS as BINPACKING
from atlas.types import ReferenceMode

CONF = Path(__file__).resolve().parents[1] / "conf"


def _yaml(path: str) -> dict[str, Any]:
    data = OmegaConf.to_container(OmegaConf.load(CONF / path), resolve=False)
    data.pop("name", None)
    return data


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


@pytest.mark.parametrize("code,path", [
    (dataclasses.asdict(DPOConfig()), "dpo/default.yaml"),
    (dataclasses.asdict(GateConfig()), "gate/default.yaml"),
    (BANDIT, "task/bandit.yaml"),
    (BINPACKING, "task/binpacking.yaml"),
])
def test_python_defaults_are_the_yaml_values(code: dict[str, Any], path: str) -> None:
    """A default kept for use from Python states the YAML's value, never another one (the
    bandit's noise_sigma was 1.0 in code and 3.0 in conf/task/bandit.yaml)."""
    yaml = _yaml(path)
    assert set(yaml) == set(code)
    assert {k: _plain(code[k]) for k in yaml} == yaml


def test_supporter_role_defaults_are_the_yaml_values() -> None:
    yaml = _yaml("supporters/embedded.yaml")
    for role, model in (("exploration", ExplorationConfig), ("strategist", StrategistConfig),
                        ("inspector", InspectorConfig)):
        block = {k: v for k, v in yaml[role].items() if not str(v).startswith("${")}
        assert {k: model().model_dump()[k] for k in block} == block, role


def test_hydra_only_groups_take_their_values_from_the_yaml() -> None:
    """Their schemas declare types and bounds but no values: a field no option sets fails."""
    for schema in (MethodConfig, ExploreConfig, SandboxConfig, RunConfig):
        required = [f.name for f in dataclasses.fields(schema)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        assert required, schema
    with pytest.raises(ValueError, match=r"method\.gate is missing"):
        MethodConfig(name="m", reference="fixed", supporters=False, skip_without_improvement=False)


def test_knobs_are_defined_once() -> None:
    assert set(KNOB_FIELDS) == set(KNOBS) == set(Knobs.model_fields)
    # the strategist's default range sits inside the hard limits, knob by knob
    assert DPOConfig().bounds == DEFAULT_BOUNDS and set(DEFAULT_BOUNDS) == set(HARD_BOUNDS)
    assert all(HARD_BOUNDS[k][0] <= lo <= hi <= HARD_BOUNDS[k][1]
               for k, (lo, hi) in DEFAULT_BOUNDS.items())


@pytest.mark.parametrize("make,exc,message", [
    (lambda: DPOConfig(beta=-1), ValueError, "dpo.beta must be > 0.0, got -1"),
    (lambda: DPOConfig(max_length="long"), TypeError,
     "dpo.max_length must be an integer, got 'long'; set dpo.max_length=<an integer>"),
    (lambda: DPOConfig(shared_prompt="yes"), TypeError, "dpo.shared_prompt must be true or false"),
    (lambda: DPOConfig(padded="yes"), TypeError, "dpo.padded must be true, false or auto"),
    (lambda: GateConfig(padded=1), TypeError, "gate.padded must be true, false or auto"),
    (lambda: DPOConfig(betta=1), ValueError, "unknown dpo field(s) ['betta']: dpo.betta is not a "
                                             "known field"),
    (lambda: GateConfig(score_mode="vibes"), ValueError,
     "gate.score_mode='vibes' is not one of ['offline', 'online']"),
    (lambda: GateConfig(holdout=1.0), ValueError,
     "gate.holdout must be < 1.0 (D_k needs prompts too), got 1.0"),
    (lambda: MethodConfig(name="m", reference="sometimes", gate=False, supporters=False,
                          skip_without_improvement=False), ValueError,
     "method.reference='sometimes' is not one of ['fixed', 'adaptive']"),
    (lambda: ModelConfig(source="hf", cache_dir="c", dtype="auto", lora_r=4, lora_alpha=8,
                         lora_dropout=0.0, lora_targets=["q_proj"]), ValueError,
     "model.source=hf needs model.name_or_path"),
    (lambda: RunConfig(seed="abc", device="cpu", resume=True, progress=False), TypeError,
     "seed='abc' must be an integer; set e.g. seed=0"),
])
def test_every_group_phrases_errors_the_same_way(make: Any, exc: type, message: str) -> None:
    with pytest.raises(exc) as err:
        make()
    assert message in str(err.value)


def test_sandbox_workers_are_a_count_or_auto_one_per_core_up_to_a_round() -> None:
    """``explore.workers``: a positive count as given; ``auto`` one per usable core, never
    more than a round's candidates (islands_per_round x samples_per_prompt: 2 x 4 here)."""
    explore = _yaml("explore/default.yaml") | {"islands_per_round": 2, "samples_per_prompt": 4}
    assert explore["workers"] == "auto"
    auto = ExploreConfig(**explore)
    assert [auto.sandbox_workers(c) for c in (1, 2, 5, 8, 16)] == [1, 2, 5, 8, 8]
    assert ExploreConfig(**(explore | {"workers": 3})).sandbox_workers(16) == 3
    for bad in (0, -1, "many", True, 2.5):
        with pytest.raises(TypeError, match="explore.workers must be a positive integer or "
                                            "auto, got"):
            ExploreConfig(**(explore | {"workers": bad}))


def test_reference_mode_reads_and_prints_as_the_yaml_spelling() -> None:
    assert ReferenceMode("fixed") is ReferenceMode.FIXED and ReferenceMode.ADAPTIVE == "adaptive"
    assert f"{ReferenceMode.ADAPTIVE}" == str(ReferenceMode.ADAPTIVE) == "adaptive"
    with pytest.raises(ValueError, match=r"method\.reference='x' is not one of"):
        ReferenceMode.parse("x")


def test_each_schema_names_exactly_the_keys_its_yaml_options_set() -> None:
    """The YAML documents every field and the schema types every field: neither has a key
    the other lacks (a schema field no option sets would fail as missing; a YAML key the
    schema lacks as unknown)."""
    from atlas.compose import schema
    from atlas.schema import LoggerConfig

    tree = schema()
    for name, cls in (("method", MethodConfig), ("model", ModelConfig),
                      ("explore", ExploreConfig), ("sandbox", SandboxConfig),
                      ("logger", LoggerConfig), ("dpo", DPOConfig), ("gate", GateConfig)):
        keys = set(tree[name]) - ({"_target_"} if name == "logger" else set())  # the factory
        assert {f.name for f in dataclasses.fields(cls)} == keys, name
    top = {k for k, v in tree.items() if not isinstance(v, dict)}
    assert {f.name for f in dataclasses.fields(RunConfig)} <= top
