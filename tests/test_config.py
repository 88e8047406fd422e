"""Compose-based tests of the config tree (lightning-hydra-template style)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from atlas.config import ConfigError, validate
from tests.conftest import ROOT, compose_cfg


@pytest.mark.parametrize("task", ["bandit", "pinn"])
@pytest.mark.parametrize("method", ["evotune", "evodpo", "atlas"])
def test_every_task_and_method_composes_and_validates(task: str, method: str) -> None:
    cfg = compose_cfg([f"task={task}", f"method={method}"])
    validate(cfg)
    assert cfg.task.name == task and cfg.method.name == method
    expected = {"evotune": ("fixed", False, False), "evodpo": ("adaptive", False, False),
                "atlas": ("adaptive", True, True)}[method]
    assert (cfg.method.reference, cfg.method.gate, cfg.method.supporters) == expected


def test_defaults_run_on_cpu_with_the_default_agent() -> None:
    cfg = compose_cfg()
    assert cfg.model.source == "smollm2" and cfg.device == "auto"
    assert cfg.explore.islands == 6
    assert cfg.explore.rounds // cfg.explore.phase_every >= 2  # at least two fine-tuning phases
    assert cfg.supporters.backend == "embedded" and cfg.logger.mode == "offline"


def test_paper_experiment_values() -> None:
    cfg = compose_cfg(["experiment=paper", "method=atlas"])
    assert cfg.explore.islands == 6 and cfg.explore.phase_every == 20
    assert set(cfg.explore.temperatures) == {0.9}
    assert cfg.model.source == "hf" and "Llama-3.2-1B-Instruct" in cfg.model.name_or_path
    assert cfg.model.dtype == "bfloat16" and cfg.device == "cuda"
    assert cfg.supporters.exploration.model == "gpt-oss:120b"
    assert cfg.supporters.strategist.model == "deepseek-r1:32b"
    assert cfg.supporters.inspector.model == "llama4:latest"
    assert {cfg.supporters[r].temperature for r in ("exploration", "strategist", "inspector")} == {0.7}
    bandit = compose_cfg(["experiment=paper", "task=bandit"]).task
    assert (bandit.K, bandit.d, bandit.T) == (5, 5, 2000)
    pinn = compose_cfg(["experiment=paper", "task=pinn"]).task
    assert (pinn.n_steps, pinn.depth, pinn.width) == (500, 4, 32)


def test_unknown_group_option_fails_with_its_name() -> None:
    with pytest.raises(ConfigCompositionException, match="nosuchtask"):
        compose_cfg(["task=nosuchtask"])


def test_wrong_override_key_fails_with_its_name() -> None:
    with pytest.raises(ConfigCompositionException, match="not_a_field"):
        compose_cfg(["dpo.not_a_field=3"])


@pytest.mark.parametrize("override,field", [
    ("method.reference=sometimes", "method.reference"),
    ("dpo.beta=-1", "dpo.beta"),
    ("explore.islands=8", "explore.temperatures"),
    ("model.source=hf", "model.name_or_path"),
])
def test_invalid_values_name_the_field(override: str, field: str) -> None:
    cfg = compose_cfg([override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(cfg)


def test_unknown_task_name_is_rejected() -> None:
    cfg = compose_cfg()
    with open_dict(cfg):
        cfg.task.name = "chemistry"
    with pytest.raises(ConfigError, match="known tasks"):
        validate(cfg)


def test_cli_help_and_cfg_job_work() -> None:
    for args in (["--help"], ["--cfg", "job", "method=atlas", "task=pinn"]):
        out = subprocess.run([sys.executable, "-m", "atlas.train", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.method.name == "atlas" and cfg.task.name == "pinn"


def test_cli_wrong_override_fails_at_start_with_a_message() -> None:
    out = subprocess.run([sys.executable, "-m", "atlas.train", "task=nosuchtask"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "nosuchtask" in out.stderr and "task" in out.stderr
