"""`python -m atlas.bench sampler` on the tiny model: every row decodes the same round."""

from __future__ import annotations

import torch

from atlas.bench import sampler


def test_sampler_bench_rows_decode_the_same_round():
    threads = torch.get_num_threads()
    try:
        out = sampler.main(["--model", "tiny", "--max-new-tokens", "8", "--repeats", "1",
                            "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    rows = out["rows"]
    assert list(rows) == ["islands one by one, peft layers", "islands one by one, merged copy",
                          "islands in one batch, merged copy",
                          "islands in one batch, in-place merge"]
    assert len({r["tokens"] for r in rows.values()}) == 1  # the same samples every way
    assert next(iter(rows.values()))["speedup"] == 1.0
    assert all(r["tok_s"] > 0 for r in rows.values())
    assert out["inplace"]["drift"] < 1e-6 and out["copy_build_s"] >= 0  # fp32: exact enough
    assert "torch" in out["machine"]
