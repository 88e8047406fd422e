"""The agent, DPO and paper benches run on the CPU with the tiny model and print the device,
tokens/s and the ratio to the floor; the paper projection's arithmetic is what it prints."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from atlas.bench import agent as agent_bench
from atlas.bench import dpo as dpo_bench
from atlas.bench import paper as paper_bench
from atlas.bench.floor import CPU_KIND, busy_seconds
from atlas.bench.machine import bench_model_cfg, resolve_bench_device


def _device_line_ok(out: str) -> None:
    line = next(ln for ln in out.splitlines() if ln.startswith("device: "))
    assert line.startswith("device: cpu = ")
    assert f"torch {torch.__version__}" in line and "CUDA " in line


def test_agent_bench_tiny_cpu(capsys):
    res = agent_bench.main(["--model", "tiny", "--device", "cpu", "--batches", "1,4",
                            "--hf-batches", "", "--dtypes", "float32", "--max-new-tokens", "8",
                            "--baseline-tokens", "0", "--no-sandbox", "--floor-tokens", "6",
                            "--threads", "1"])
    out = capsys.readouterr().out
    _device_line_ok(out)
    rows = {r["batch"]: r for r in res["rows"]}
    assert set(rows) == {1, 4}
    for r in rows.values():
        assert r["tokens"] > 0 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        assert f"| atlas sampler (float32) | {r['batch']} | {r['tokens_per_s']:.1f} |" in out
    fl = res["floor"]
    assert fl["batch"] == 4 and fl["floor_kind"] == CPU_KIND
    assert 0 < fl["floor_step_s"] and math.isfinite(fl["ratio"]) and fl["ratio"] > 0
    assert fl["ratio"] == pytest.approx(fl["step_s"] / fl["floor_step_s"])
    assert re.search(r"= \d+\.\d\dx the floor \(self CPU time of aten:: ops", out)
    assert "speed only" not in out  # the tiny model is not labelled as a shape model


def test_agent_bench_1b_shape_shrunk_is_labelled_speed_only(capsys):
    res = agent_bench.main(["--model", "llama3_1b_shape", "--hidden", "64", "--layers", "1",
                            "--device", "cpu", "--batches", "2", "--hf-batches", "",
                            "--dtypes", "float32", "--max-new-tokens", "4",
                            "--baseline-tokens", "0", "--no-sandbox", "--floor-tokens", "0",
                            "--threads", "1"])
    out = capsys.readouterr().out
    assert "model=llama3_1b_shape (hidden_size=64, num_layers=1): speed only " \
           "(random weights)" in out
    assert res["rows"][0]["tokens"] == 8  # random weights over 49,152 ids: no early EOS


def test_shape_model_is_llama_3_2_1b():
    """The full shape: Llama-3.2-1B's layer sizes over the shipped 49,152-id vocabulary."""
    from transformers import LlamaForCausalLM

    from atlas.agent.model import shape_config

    class Vocab:  # what shape_config reads of the shipped tokenizer (49,152 ids)
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 2

        def __len__(self) -> int:
            return 49152

    cfg = shape_config(Vocab())
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == \
        (2048, 16, 32, 8, 8192, 49152)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    small = shape_config(Vocab(), hidden_size=64, num_layers=1)
    assert (small.num_attention_heads, small.num_key_value_heads, small.head_dim,
            small.intermediate_size) == (4, 1, 16, 256)
    h, kv, v = 2048, 8 * 64, 49152
    layer = 2 * h * h + 2 * h * kv + 3 * h * 8192 + 2 * h
    assert sum(p.numel() for p in model.parameters()) == v * h + 16 * layer + h  # tied head


def test_dpo_bench_tiny_cpu(capsys):
    rows = dpo_bench.main(["--model", "tiny", "--device", "cpu", "--pairs", "4",
                           "--batch-size", "2", "--max-length", "256", "--dtypes", "float32",
                           "--settings", "shared", "--threads", "1"])
    out = capsys.readouterr().out
    _device_line_ok(out)
    (r,) = rows
    assert r["pairs"] == 4 and r["per_pair_s"] == pytest.approx(r["seconds"] / 4)
    assert r["tokens"] > 0 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
    assert r["floor_s"] > 0 and r["floor_kind"] == CPU_KIND
    assert f"| {r['tokens_per_s']:.0f} | {r['seconds'] / r['floor_s']:.2f}x |" in out


def test_projection_arithmetic():
    pr = paper_bench.projection(500, 20, [10.0, 4.0, 6.0], 30.0, 16, 256)
    assert pr["rounds_s"] == 10 + 499 * 5
    assert pr["phases"] == 25 and pr["phase_s"] == 30 * 256 / 16
    assert pr["total_s"] == 10 + 499 * 5 + 25 * 480
    assert pr["hours"] == pytest.approx(pr["total_s"] / 3600)
    one = paper_bench.projection(500, 20, [7.0], 12.0, 256, 256)
    assert one["total_s"] == 500 * 7 + 25 * 12  # one timed round counts for all of them


def test_paper_bench_tiny_cpu(capsys):
    res = paper_bench.main(["--model", "tiny", "--device", "cpu", "--rounds-timed", "2",
                            "--max-new-tokens", "16", "--phase-pairs", "4", "--threads", "1",
                            "--floor-tokens", "64",
                            "--set", "explore.workers=1", "--set", "dpo.max_length=512"])
    out = capsys.readouterr().out
    _device_line_ok(out)
    assert "6 islands x 8 samples x 16 tokens a round, DPO every 20 rounds" in out
    r1, r2 = res["rounds"]
    assert r1["samples"] == r2["samples"] == 48 and r1["tokens"] > 0
    ph = res["phase"]
    assert ph["pairs"] == 4 and ph["tokens_per_s"] > 0
    pr = res["projection"]
    expected = r1["wall_s"] + 499 * r2["wall_s"] + 25 * ph["seconds"] * 256 / 4
    assert pr["total_s"] == pytest.approx(expected)
    assert f"total: {pr['total_s']:.0f} s = {pr['hours']:.2f} h a seed" in out
    assert f"499 x {r2['wall_s']:.2f} s" in out and "scaled from 4 to 256 pairs" in out
    fl = res["floor"]
    assert fl["tokens"] == 16 and fl["ratio"] == pytest.approx(fl["round_s"] / fl["round_busy_s"])
    assert f"a round of 16 tokens: {fl['round_s'] * 1e3:.2f} ms vs floor" in out


def test_pairs_span_every_prompt():
    progs = [SimpleNamespace(prompt=f"p{i % 3}", completion=f"c{i}") for i in range(12)]
    pairs = paper_bench.pairs_from(progs, 3)
    assert sorted(p.prompt for p in pairs) == ["p0", "p1", "p2"]
    assert len(paper_bench.pairs_from(progs, 1000)) == 3 * 6  # C(4, 2) per prompt


def test_bench_model_choice(tmp_path):
    assert bench_model_cfg(str(tmp_path))["name_or_path"] == str(tmp_path)
    assert bench_model_cfg("tiny", 48, 3)["hidden_size"] == 48
    with pytest.raises(ValueError, match="neither a conf/model option .*llama3_1b_shape"):
        bench_model_cfg("no_such_model")
    with pytest.raises(ValueError, match="shrink only"):
        bench_model_cfg("smollm2", 64)


def test_cuda_device_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="sees no CUDA device"):
        resolve_bench_device("cuda")
    assert resolve_bench_device("auto") == "cpu"


def test_busy_seconds_counts_device_events_on_cuda():
    """The CUDA floor sums kernel/copy events, never host ops (synthetic events: no GPU here)."""
    from torch.autograd import DeviceType

    def ev(name, dev, us, self_us=0.0):
        return SimpleNamespace(name=name, device_type=dev, self_cpu_time_total=self_us,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [ev("aten::mm", DeviceType.CPU, 900.0, 900.0), ev("gemm", DeviceType.CUDA, 30.0),
              ev("Memcpy HtoD", DeviceType.CUDA, 5.0), ev("aten::add", DeviceType.CPU, 20, 20)]
    assert busy_seconds(events, "cuda") == pytest.approx(35e-6)
    assert busy_seconds(events, "cpu") == pytest.approx(920e-6)
