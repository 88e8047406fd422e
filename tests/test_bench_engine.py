"""``python -m atlas.bench engine``: llama.cpp as the agent's sampler, weighed beside ours.

The checks that matter are the adapter's: a policy LoRA written for llama.cpp must move
llama.cpp's distribution as it moves the torch policy. A random adapter moves the policy by
~0.4 nats a token, so a misplaced tensor (a wrong name, q/k rows left in Hugging Face's rotary
order, a wrong alpha) leaves llama.cpp far from the policy, not within a few thousandths.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama_cpp is not importable: pip install llama-cpp-python")


def test_the_rotary_permutation_interleaves_each_head_s_halves():
    from atlas.bench.engine import _rope_permute

    rows = torch.arange(8.0)[:, None]  # 2 heads of 4 rows: halves (0,1)(2,3) and (4,5)(6,7)
    assert _rope_permute(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_llama_cpp_with_the_written_lora_follows_the_torch_policy(tmp_path):
    from atlas.bench.engine import main

    out = tmp_path / "engine.json"
    res = main(["--lora", "random", "--random-scale", "0.05", "--trajectories", "2",
                "--islands", "2", "--samples", "1", "--max-new-tokens", "6",
                "--paths", "atlas,batched,b1", "--json", str(out)])
    fid = res["fidelity"]
    assert fid["lora_kl_mean"] > 0.1  # the adapter moves the policy a lot
    assert fid["kl_mean"] < 0.05 * fid["lora_kl_mean"]  # and llama.cpp moves with it
    assert fid["top1_agreement"] > 0.9 and fid["tokens"] > 100
    assert res["lora_modules"] == 4 * 30  # q, k, v, o in each of SmolLM2's 30 layers
    paths = [r["path"] for r in res["rows"]]
    assert paths[0].startswith("atlas (") and paths[1:] == ["llama.cpp batched", "llama.cpp b1"]
    for row in res["rows"]:
        assert row["rows"] == 2 and 2 <= row["new_tokens"] <= 12 and row["tokens_per_s"] > 0
    assert set(res["adopt"]) == {"llama.cpp batched", "llama.cpp b1"}
    assert json.loads(out.read_text())["fidelity"] == fid
