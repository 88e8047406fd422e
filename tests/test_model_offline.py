"""A hub id with no local weights and no network fails in one line naming the field, in
seconds; weights already in the hub cache still load without the network."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atlas.agent import model as model_mod
from atlas.agent.model import ModelUnavailable, load_base_model
from atlas.config import ConfigError
from atlas.schema import ModelConfig
from tests.conftest import model_settings

BOGUS = "atlas-test/no-such-model-xyz"
ROOT = Path(__file__).resolve().parents[1]


def _hf(name: str) -> ModelConfig:
    return model_settings(source="hf", name_or_path=name, dtype="float32")


@pytest.mark.parametrize("offline", ["1", ""])
def test_bogus_hub_id_fails_fast_in_one_line(offline, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "")
    if not offline:  # this machine has no hub access; where it has, the hub's 404 is the path
        monkeypatch.setattr(model_mod, "HUB_PROBE_TIMEOUT", 2.0)
    t0 = time.perf_counter()
    with pytest.raises(ModelUnavailable) as err:
        load_base_model(_hf(BOGUS))
    assert time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert "\n" not in msg
    assert f"model.name_or_path={BOGUS!r}" in msg and "local folder" in msg
    assert isinstance(err.value, ConfigError) and isinstance(err.value, ValueError)


def test_unreachable_hub_is_reported_as_such(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(model_mod, "hub_reachable", lambda timeout=0: False)
    with pytest.raises(ModelUnavailable, match="did not answer within"):
        load_base_model(_hf(BOGUS))


def test_hub_probe_gives_up_on_a_silent_endpoint(monkeypatch):
    """A host that never answers (TEST-NET-1 is unroutable) counts as offline after the timeout."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://192.0.2.1")
    t0 = time.perf_counter()
    assert model_mod.hub_reachable(timeout=0.5) is False
    assert time.perf_counter() - t0 < 2


def _fill_hub_cache(cache: Path, repo: str) -> None:
    """A tiny model saved in huggingface_hub's cache layout (what a download leaves)."""
    from atlas.agent.tiny import build_tiny_model

    snap = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / "0"
    model, tok = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2)
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    refs = cache / f"models--{repo.replace('/', '--')}" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("0")


@pytest.mark.parametrize("offline", ["1", ""])
def test_cached_hub_id_loads_without_network(offline, tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = "atlas-test/cached-tiny"
    _fill_hub_cache(tmp_path, repo)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(model_mod, "hub_reachable", lambda timeout=0: False)
    before = constants.HF_HUB_OFFLINE
    model, tok = load_base_model(_hf(repo))
    assert model.config.hidden_size == 16 and tok.padding_side == "left"
    assert constants.HF_HUB_OFFLINE is before  # offline mode lasted for the load only


def test_entry_point_prints_one_line_without_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "atlas.train", "experiment=test", "model=llama3_1b",
         f"model.name_or_path={BOGUS}", "method=evotune", "logger=none",
         f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if f"model.name_or_path={BOGUS!r}" in ln]
    assert len(lines) == 1 and "local folder" in lines[0], proc.stderr[-2000:]
    assert time.perf_counter() - t0 < 90  # imports and config only: no hub retries


def test_tokenizers_load_with_the_space_clean_up_off(tmp_path):
    """A tokenizer config may switch on ``clean_up_tokenization_spaces`` (Llama 3's do),
    which strips the space before quotes and dots. Where transformers applies it (every
    tokenizer before 5.7, non-BPE ones since), a program's ``' '`` decodes as ``''``;
    ``load_tokenizer`` turns it off. A word-level tokenizer shows it on any version."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from atlas.agent.model import load_tokenizer

    words = ["[UNK]", "sep", "=", "'", "from", ".", "import", "x"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                            clean_up_tokenization_spaces=True).save_pretrained(tmp_path)
    code = "sep = ' ' from . import x"

    def round_trip(tok) -> str:
        return tok.decode(tok.encode(code, add_special_tokens=False))

    assert round_trip(AutoTokenizer.from_pretrained(tmp_path)) == "sep ='' from. import x"
    ours = load_tokenizer(tmp_path)
    assert ours.clean_up_tokenization_spaces is False and round_trip(ours) == code
    # a local folder as model.name_or_path: the run's tokenizer comes through the same door
    from atlas.agent.tiny import build_tiny_model

    build_tiny_model(seed=0)[0].save_pretrained(tmp_path)
    _, run_tok = load_base_model(_hf(str(tmp_path)))
    assert round_trip(run_tok) == code
