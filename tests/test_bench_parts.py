"""atlas.bench.parts and ``python -m atlas.bench dpo --parts``: where a phase's time goes,
each part against its arithmetic floor."""

from __future__ import annotations

import json
import subprocess
import sys

from atlas.bench.floor import SMOLLM2, attention_macs, macs_per_token
from atlas.bench.parts import Part, dpo_parts, gate_part
from atlas.dpo.batching import PromptGroup, SharedPromptCollator, attended_pairs


def _attended_by_hand(groups) -> int:
    """Every (query, key) pair causal attention scores, one position at a time."""
    total = 0
    for g in groups:
        n = len(g.prompt)
        total += sum(q + 1 for q in range(n))  # the prompt: each query reads keys 0..q
        for c in g.completions:  # its first L-1 tokens run at n..n+L-2, after the prompt
            total += sum(q + 1 for q in range(n, n + len(c) - 1))
    return total


def test_attention_counts_every_causal_query_key_pair_once():
    groups = [PromptGroup((1,) * 7, ((2,) * 3, (3,))), PromptGroup((4,), ((5,) * 5, (6,) * 2))]
    assert attended_pairs(groups) == _attended_by_hand(groups) == 28 + (8 + 9) + 0 + 1 + (2 + 3 + 4 + 5) + 2
    # the step's collated batch counts its groups so (a prompt shared by two pairs once)
    encoded = [PromptGroup((1,) * 7, ((2,) * 3, (3,))), PromptGroup((1,) * 7, ((2,) * 3, (4,) * 2))]
    batch = SharedPromptCollator(encoded)([0, 1])
    assert batch["attended"] == _attended_by_hand(batch["groups"]) == 28 + (8 + 9) + 0 + 8
    assert attention_macs(SMOLLM2, 10) == 2 * 30 * 576 * 10


def test_each_part_counts_the_work_the_phase_must_do():
    """Forward: every token through the layers, every completion token through the LM head,
    every causal (query, key) pair through attention's two products; backward: the layers
    again and attention twice; the table: each distinct prompt and completion once; the
    gate: that per policy; the optimiser: no floor."""
    body, head = macs_per_token(SMOLLM2)
    metrics = {"tokens": 1000.0, "scored_tokens": 300.0, "attended": 5000.0,
               "forward_seconds": 2.0, "backward_seconds": 3.0, "optimizer_seconds": 0.1,
               "reference_table_seconds": 1.0, "seconds": 6.5}
    table = [PromptGroup((1,) * 500, ((2,) * 100, (3,) * 50)), PromptGroup((4,) * 200, ((5,) * 10,))]
    parts = {p.name: p for p in dpo_parts(metrics, table, SMOLLM2, head_s=0.4)}
    step = 1000 * body + 300 * head
    attention = attention_macs(SMOLLM2, 5000)
    once = 860 * body + 160 * head + attention_macs(SMOLLM2, _attended_by_hand(table))
    assert parts["forward (layers, LM head, log-probs, loss)"].macs == step + attention
    assert parts["backward"].macs == step + 2 * attention
    assert parts["  of it: LM head and log-probs"].macs == 300 * head
    assert parts["optimiser (clipping, AdamW on LoRA)"].macs == 0
    assert parts["reference table (once a phase)"].macs == once
    assert parts["DPO phase, all of it"].macs == 2 * step + 3 * attention + once
    assert gate_part(9.0, table, 3, SMOLLM2).macs == 3 * once
    row = Part("x", 2.0, 4e9).row(rate=1e9, phase_s=8.0)
    assert row == {"part": "x", "seconds": 2.0, "floor_s": 4.0, "x_floor": 0.5, "share": 0.25}
    assert Part("opt", 0.1, 0.0).row(1e9, 8.0)["x_floor"] is None


def test_the_dpo_bench_prints_the_parts_of_a_real_phase(tmp_path):
    """On the tiny model: the phase's own clock splits its steps into forward, backward and
    optimiser, which add up to no more than the phase; the table prints every part with
    its floor at the rate measured in the same process."""
    out = tmp_path / "parts.json"
    proc = subprocess.run([sys.executable, "-m", "atlas.bench", "dpo", "--model", "tiny",
                           "--pairs", "4", "--dtypes", "float32", "--settings", "shared",
                           "--no-floor", "--parts", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    parts = {r["part"]: r for r in row["parts"]["rows"]}
    steps = sum(parts[k]["seconds"] for k in ("forward (layers, LM head, log-probs, loss)",
                                               "backward", "optimiser (clipping, AdamW on LoRA)"))
    assert 0 < steps <= parts["DPO phase, all of it"]["seconds"]
    assert all(parts[k]["seconds"] > 0 and parts[k]["floor_s"] > 0
               for k in ("forward (layers, LM head, log-probs, loss)", "backward",
                         "reference table (once a phase)", "gate pass (3 policies)"))
    assert row["parts"]["rate_macs_per_s"] > 0
    assert "| backward |" in proc.stdout and "arithmetic floor at" in proc.stdout
