"""A run's trained policy can be taken away: ``adapters/policy`` and ``adapters/reference`` in
the run folder load with PEFT alone over the base model and give the run's own
log-probabilities.

One tiny ATLAS run, in process so that its agent can be asked for its log-probabilities
after the run. ``gate.epsilon=-1`` and a wide ``gate.delta`` make the gate accept, so the
reference is a promoted candidate (neither the base model nor, in general, the final policy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from peft import PeftModel

from atlas.agent.adapters import POLICY, REF, adapter
from atlas.agent.tiny import build_tiny_model
from atlas.config import validate
from atlas.dpo.batching import encode_texts
from atlas.dpo.logprobs import completion_logits
from atlas.loop import EvolutionLoop
from tests.conftest import compose_cfg, pin_secret

OVERRIDES = ["experiment=test", "method=atlas", "progress=false", "explore.rounds=2",
             "explore.phase_every=1", "task.env_seeds=[0]", "task.T=500",
             "method.skip_without_improvement=false", "gate.epsilon=-1", "gate.delta=100",
             "dpo.lr=1e-3", "dpo.bounds.lr=[1e-4,1e-3]"]  # a visible step on the tiny model
PROMPT = "Write a policy for the bandit."
TOLERANCE = 2e-6  # fp32, the same weights: a few ulp of summation order (logits_to_keep)
COMPLETION = "```python\ndef policy(context, arms):\n    return 0\n```"


def peft_token_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-probabilities of the completion tokens, by plain torch on any causal LM."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).logits.float()
    logps = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = batch["input_ids"][:, 1:]
    picked = logps.gather(-1, targets[..., None]).squeeze(-1)
    return picked[batch["completion_mask"][:, 1:].bool()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, EvolutionLoop, dict]:
    run_dir = tmp_path_factory.mktemp("take_away")
    # a phase that trains may still be vetoed by the inspector, which compares the programs
    # each policy prefers on this secret's environments: a fixed secret, a fixed outcome
    pin_secret(run_dir)
    cfg = compose_cfg(OVERRIDES, run_dir=run_dir)
    loop = EvolutionLoop(validate(cfg), OmegaConf.to_container(cfg, resolve=True), run_dir)
    try:
        results = loop.run()
    finally:
        loop.close()
    return run_dir, loop, results


def test_the_adapters_load_with_peft_alone_and_give_the_runs_logprobs(finished_run) -> None:
    run_dir, loop, results = finished_run
    agent = loop.agent
    assert results["promotions"] >= 1, results["reference_log"]
    batch = encode_texts(agent.tokenizer, [agent.chat_prompt("", PROMPT)], [COMPLETION], 256)
    ours = {}
    with torch.no_grad():
        for name in (POLICY, REF, None):
            with adapter(agent.model, name):
                ours[name] = completion_logits(agent.model, batch).token_logps()
    # the run moved both adapters away from the base model (by ~1e-4 on the tiny model), far
    # more than the tolerance the loaded adapters are held to (the reference is the policy
    # itself when the last phase promoted its final policy)
    moved = {name: float((ours[name] - ours[None]).abs().max()) for name in (POLICY, REF)}
    assert min(moved.values()) > 100 * TOLERANCE, moved

    meta = json.loads((run_dir / "adapters" / "base_model.json").read_text())
    sizes = meta["base_model"]
    assert sizes["source"] == "tiny" and sizes["dtype"] == "float32"
    assert meta["folders"]["reference"].startswith("the reference: phase ")
    for name, folder in ((POLICY, "policy"), (REF, "reference")):
        base, _ = build_tiny_model(hidden_size=sizes["hidden_size"],
                                   num_layers=sizes["num_layers"],
                                   num_heads=sizes["num_heads"], seed=0)
        loaded = PeftModel.from_pretrained(base, str(run_dir / "adapters" / folder)).eval()
        theirs = peft_token_logps(loaded, batch)
        assert theirs.shape == ours[name].shape
        torch.testing.assert_close(theirs, ours[name], rtol=0, atol=TOLERANCE)
