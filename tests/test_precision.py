"""model.dtype=auto: precision chosen per machine, recorded per run, kept on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlas.agent import precision as P
from atlas.train import run
from tests.conftest import compose_cfg


def test_explicit_dtype_wins_and_bad_names_fail():
    assert P.choose_precision("bfloat16", "cpu").dtype == "bfloat16"
    assert P.choose_precision("float32", "cuda").reason == "set by model.dtype"
    with pytest.raises(ValueError, match=r"model.dtype='fp8' is not supported.*auto"):
        P.choose_precision("fp8", "cpu")


def test_cuda_and_native_bf16_cpus_get_bf16_without_benchmark(monkeypatch):
    assert P.choose_precision("auto", "cuda").dtype == "bfloat16"
    monkeypatch.setattr(P, "cpu_features", lambda: {"capability": "AVX512", "avx512_bf16": True,
                                                    "amx_tile": False})
    monkeypatch.setattr(P, "_time_matmul", lambda dtype: pytest.fail("no benchmark needed"))
    choice = P.choose_precision("auto", "cpu")
    assert choice.dtype == "bfloat16" and "natively" in choice.reason


def test_non_native_cpu_follows_the_micro_benchmark_and_caches_it(monkeypatch, tmp_path):
    monkeypatch.setattr(P, "native_bf16", lambda: False)
    timings = {"torch.float32": 0.5, "torch.bfloat16": 2.0}  # emulated bf16: 4x slower
    monkeypatch.setattr(P, "_time_matmul", lambda dtype: timings[str(dtype)])
    first = P.choose_precision("auto", "cpu", tmp_path)
    assert first.dtype == "float32" and "4.0x slower" in first.reason
    assert len(list(tmp_path.glob("precision-*.json"))) == 1
    timings.update({"torch.float32": 2.0, "torch.bfloat16": 0.5})  # the cache answers now
    assert P.choose_precision("auto", "cpu", tmp_path) == first
    fresh = tmp_path / "other"
    assert P.choose_precision("auto", "cpu", fresh).dtype == "bfloat16"


def test_this_machine_gets_fp32_unless_it_computes_bf16_natively(tmp_path):
    """The real probe and micro-benchmark: on an AVX2-only CPU (no AVX512-BF16/AMX) fp32."""
    choice = P.choose_precision("auto", "cpu", tmp_path)
    assert choice.dtype == ("bfloat16" if P.native_bf16() else choice.dtype)
    if not P.native_bf16():
        assert choice.fp32_ms > 0 and choice.bf16_ms > 0
        assert (choice.dtype == "bfloat16") == (choice.fp32_ms / choice.bf16_ms >= P.BF16_MARGIN)


def test_a_run_records_its_precision_and_a_resume_keeps_it(tmp_path: Path):
    cfg = compose_cfg(["experiment=test", "method=evotune", "model.dtype=auto",
                       "explore.rounds=2"],
                      run_dir=tmp_path)
    results = run(cfg)
    chosen = json.loads((tmp_path / "precision.json").read_text())
    assert results["dtype"] == chosen["dtype"] == P.choose_precision(
        "auto", "cpu", cfg.model.cache_dir).dtype
    assert results["dtype_reason"] == chosen["reason"]
    # a resumed auto run keeps the recorded precision even if the machine would now choose
    # otherwise (here: the record is edited to say bf16)
    other = "bfloat16" if chosen["dtype"] == "float32" else "float32"
    (tmp_path / "precision.json").write_text(json.dumps({**chosen, "dtype": other}))
    state = tmp_path / "checkpoint" / "state.pt"
    assert state.exists()
    (tmp_path / "results.json").unlink()  # as if killed before writing it: the run resumes
    resumed = run(compose_cfg(["experiment=test", "method=evotune", "model.dtype=auto",
                       "explore.rounds=2"],
                              run_dir=tmp_path))
    assert resumed["dtype"] == other and "kept from the run's start" in resumed["dtype_reason"]
