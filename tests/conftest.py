"""Shared fixtures: composing the Hydra config the way `python -m atlas.train` does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

if TYPE_CHECKING:
    from atlas.schema import ExploreConfig, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# The bandit at a test's scale, for runs that exercise the loop rather than the bandit's own
# numbers: at the default horizon (2,000 steps on 4 environments, each step a round trip to
# the sandboxed candidate) a valid program takes ~4 s to score, here ~0.3 s. Not for tests
# that need a phase to improve (the strategist speaks only then): at this horizon a patch of
# the seed beats it on some task secrets only (unless the test pins one on which it does).
QUICK_BANDIT = ["task.T=300", "task.env_seeds=[0,1]"]

# A run draws a fresh task secret (its hidden environments, validation points) unless its
# folder holds one: whether a patch beats the seed, hence whether ATLAS trains a phase and asks
# its strategist (paper B.4), then differs from run to run. A test that counts what only some
# secrets give pins this one (``pin_secret``); a test that must not depend on the scores at
# all says so in its settings instead (``method.skip_without_improvement=false``).
PINNED_SECRET = "95b89c2694b7b53cad777f70306eebacbadbfb63efc9c94a89f7ba48317e9810"


def pin_secret(run_dir: Path, secret: str = PINNED_SECRET) -> Path:
    """Give the run folder ``run_dir`` its task secret before the run starts (a run reads
    ``<run folder>/.task_secret`` first, ``atlas.sandbox.secret.run_secret``); returns the
    file."""
    from atlas.sandbox.secret import SECRET_FILE, check_secret

    check_secret(secret, "pin_secret")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SECRET_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return path


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT: the child starts with SIGINT at
    its default disposition, as a command typed in a terminal does. A suite started as a
    background job (``cmd &`` without job control, as in scripts and CI runners) hands its
    children SIGINT ignored, and atlas rightly leaves an ignored SIGINT alone
    (``atlas.interrupt``): the Ctrl-C would then do nothing and the test would read a run
    that was never stopped."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def compose_cfg(overrides: list[str] | None = None, run_dir: Path | None = None) -> DictConfig:
    """Compose conf/train.yaml with overrides; ``run_dir`` replaces Hydra's runtime folder."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides or []))
    with open_dict(cfg):
        cfg.run_dir = str(run_dir) if run_dir is not None else "unused"
    return cfg


@pytest.fixture
def compose_config():
    return compose_cfg


def model_settings(option: str = "tiny", **fields: Any) -> ModelConfig:
    """The ``model`` group of ``conf/model/<option>.yaml`` with ``fields`` replaced, typed and
    checked as a run's (``atlas.config.validate``)."""
    from omegaconf import OmegaConf

    from atlas.schema import ModelConfig

    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{option}.yaml"))
    return ModelConfig.from_cfg({**yaml, **fields})


def explore_settings(**fields: Any) -> ExploreConfig:
    """The ``explore`` group of ``conf/explore/default.yaml`` with ``fields`` replaced, typed
    and checked as a run's (``atlas.config.validate``)."""
    from omegaconf import OmegaConf

    from atlas.schema import ExploreConfig

    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "explore" / "default.yaml"))
    return ExploreConfig.from_cfg({**yaml, **fields})


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    """A real llama-cpp-python OpenAI-compatible server on 127.0.0.1 serving the SmolLM2
    GGUF, one per test module; yields its ``.../v1`` URL."""
    from tests.test_supporters_server import start_llama_server, stop_llama_server

    proc, url = start_llama_server(tmp_path_factory.mktemp("llama"))
    try:
        yield url
    finally:
        stop_llama_server(proc)
