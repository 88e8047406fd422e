"""scripts/compute_floor.py: the least arithmetic of each part of a committed run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import model_settings

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "bench" / "main_avx2_fp32"


def _script():
    spec = importlib.util.spec_from_file_location("compute_floor",
                                                  ROOT / "scripts" / "compute_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def agent():
    from atlas.agent.research_agent import ResearchAgent

    return ResearchAgent(model_settings("smollm2", dtype="float32"), seed=0)


def test_its_shape_is_the_shipped_models_linear_layers(agent):
    from atlas.bench.floor import SMOLLM2, macs_per_token, model_dims

    body, head = macs_per_token(SMOLLM2)
    base = agent.model.get_base_model()
    assert model_dims(base.config) == SMOLLM2
    layers = sum(m.weight.numel() for name, m in base.model.layers.named_modules()
                 if isinstance(m, torch.nn.Linear) and "lora" not in name)
    assert (layers, base.lm_head.weight.numel()) == (body, head)


def test_each_part_is_counted_from_the_runs_own_records(agent):
    from atlas.bench.floor import SMOLLM2, macs_per_token

    floor = _script()
    body, head = macs_per_token(SMOLLM2)
    rows = floor.parts(RUN, agent.tokenizer)
    events = [json.loads(line) for line in (RUN / "events.jsonl").read_text().splitlines()]
    phases = [e for e in events if e["event"] == "phase"]
    assert [r[0] for r in rows] == ["generation, all rounds", "DPO phase 1",
                                    "gate phase 1 (3 policies)", "DPO phase 2",
                                    "gate phase 2 (3 policies)"]
    # DPO: each step's tokens through the layers, forward and backward; the table not timed
    for row, e in zip(rows[1::2], phases):
        assert row[1] == 2 * e["dpo"]["tokens"] * body
        assert row[2] == pytest.approx(e["seconds_dpo"] - e["dpo"]["reference_table_seconds"])
    # the gate: per item, the prompt and each distinct completion, once per policy
    programs = {r["id"]: r for r in map(json.loads, (RUN / "programs.jsonl").open())}
    items = phases[0]["gate"]["evidence"]["program_ids"]
    tokens = lambda text: len(agent.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    by_hand = 0
    for ids in items:
        prompt = tokens(programs[ids[0]]["prompt"])
        comps = [tokens(c) + 1 for c in dict.fromkeys(programs[j]["completion"] for j in ids)]
        prompt = min(prompt, 768 - max(comps))  # the gate's cut: the prompt loses its left
        by_hand += 3 * (prompt * body + sum(comps) * (body + head))
    assert rows[2][1] == by_hand and rows[2][2] == phases[0]["seconds_gate_parts"]["pass"]
    gen = sum(e["sampler"]["prompt_tokens"] * body + e["sampler"]["new_tokens"] * (body + head)
              for e in events if e["event"] == "round")
    assert rows[0][1] == gen > 0
