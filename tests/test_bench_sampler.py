"""`python -m atlas.bench sampler` on the tiny model: every row decodes the same round.

The exactness test pins fp32: ``--dtype auto`` picks bf16 on a CPU that computes it natively,
and there an in-place merge and unmerge leaves the base weights changed (that is measured,
not asserted away, by the bf16 test).
"""

from __future__ import annotations

import torch

from atlas.bench import sampler


def test_sampler_bench_rows_decode_the_same_round():
    threads = torch.get_num_threads()
    try:
        out = sampler.main(["--model", "tiny", "--max-new-tokens", "8", "--repeats", "1",
                            "--threads", "1", "--dtype", "float32"])
    finally:
        torch.set_num_threads(threads)
    rows = out["rows"]
    assert list(rows) == ["islands one by one, peft layers", "islands one by one, merged copy",
                          "islands in one batch, merged copy",
                          "islands in one batch, lookup",
                          "islands in one batch, graph step",
                          "islands in one batch, in-place merge"]
    assert len({r["tokens"] for r in rows.values()}) == 1  # the same samples every way
    assert next(iter(rows.values()))["speedup"] == 1.0
    assert all(r["tok_s"] > 0 for r in rows.values())
    assert out["inplace"]["drift"] < 1e-6 and out["copy_build_s"] >= 0  # fp32: exact enough
    assert "torch" in out["machine"]


def test_in_place_merge_changes_bf16_base_weights_and_the_default_copy_does_not():
    """Why the default decodes over a merged copy: in bf16, merge + unmerge drifts."""
    threads = torch.get_num_threads()
    try:
        out = sampler.main(["--model", "tiny", "--max-new-tokens", "4", "--repeats", "1",
                            "--threads", "1", "--dtype", "bfloat16"])
    finally:
        torch.set_num_threads(threads)
    assert out["inplace"]["drift"] > 0
    assert out["copy_drift"] == 0.0
