"""gate.score_mode=online: each policy of C_k and the reference writes fresh programs for the
gate prompts, scored in the real sandbox (docs/design.md's on-line inspector variant)."""

from __future__ import annotations

import math

import pytest
import torch

from atlas.agent.adapters import POLICY, REF, get_adapter_state, set_adapter_state
from atlas.agent.research_agent import ResearchAgent
from atlas.dpo import GateConfig, PolicyCandidate, select_and_gate
from atlas.dpo.online_inspection import OnlineInspector
from atlas.dpo.scoring import REFERENCE, PolicySpec, running_policy
from atlas.evolution.database import ProgramDatabase
from atlas.evolution.explorer import Explorer
from atlas.evolution.prompts import build_prompt, prefill_of
from atlas.fine_tuning import FineTuner, PhaseSettings
from atlas.sandbox import Resources, Sandbox, TaskSpec
from atlas.types import GateItem
from tests.conftest import explore_settings, model_settings
from tests.test_evolution_explorer import CFG, ToyBanditTask

TINY = model_settings()  # conf/model/tiny.yaml
GOOD = "\n    return int(contexts.sum(axis=1).argmax())\n```"
JUNK = "\nI would rather not write code."
EXPLORE = explore_settings(**{**CFG, "islands": 2, "islands_per_round": 1, "max_new_tokens": 24})


class ByAdapterAgent(ResearchAgent):
    """The real tiny agent whose *sampler* is scripted (an edge fake): the policy adapter
    writes a valid program, the reference junk, so the on-line score must tell them apart."""

    def generate(self, prompts, num_samples, *, adapter=POLICY, **kw):
        self.seen_adapters.append((adapter, self.model.base_model.active_adapter))
        text = GOOD if adapter == POLICY else JUNK
        return [[text] * num_samples for _ in prompts]


def perturbed(agent: ResearchAgent, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.5
            for k, v in get_adapter_state(agent.model, POLICY).items()}


def prompts_for(agent: ResearchAgent, n: int = 2) -> list[str]:
    spec = ToyBanditTask().prompt_spec()
    system, user, prefill = build_prompt(spec, [])
    return [agent.chat_prompt(system, user + " " * i, prefill) for i in range(n)]


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(TaskSpec(ToyBanditTask.evaluator_factory, {"steps": 20},
                          ToyBanditTask.runner_factory, timeout_s=5.0),
                 resources=Resources(workers=2)) as sb:
        yield sb


def test_prefill_is_recovered_from_the_stored_prompt():
    agent = ResearchAgent(TINY, seed=0)
    system, user, prefill = build_prompt(ToyBanditTask().prompt_spec(), [])
    assert prefill_of(agent.chat_prompt(system, user, prefill)) == prefill
    with pytest.raises(ValueError, match="prefill"):
        prefill_of("no fence here")


def test_real_agent_same_seeds_for_every_policy_and_adapters_restored(sandbox):
    agent = ResearchAgent(TINY, seed=0)
    ref = perturbed(agent, 1)
    set_adapter_state(agent.model, REF, ref)
    policy = perturbed(agent, 2)
    set_adapter_state(agent.model, POLICY, policy)
    prompts = prompts_for(agent)
    # common random numbers: a candidate equal to the reference writes the reference's text
    with running_policy(agent.model, PolicySpec.of(ref)):
        as_candidate = agent.generate(prompts, 2, temperature=0.9, top_p=1.0,
                                      max_new_tokens=16, adapter=PolicySpec.of(ref).adapter,
                                      seed=11)
    as_reference = agent.generate(prompts, 2, temperature=0.9, top_p=1.0, max_new_tokens=16,
                                  adapter=REFERENCE.adapter, seed=11)
    assert as_candidate == as_reference
    other = agent.generate(prompts, 2, temperature=0.9, top_p=1.0, max_new_tokens=16,
                           adapter=POLICY, seed=11)
    assert other != as_reference  # the policy adapter really differs

    explorer = Explorer(ToyBanditTask(), agent, sandbox, ProgramDatabase(EXPLORE),
                        EXPLORE, seed=0)
    inspect = OnlineInspector(explorer, prompts, {"round": 0}, samples=3, temperature=0.9,
                              failure_score=-2.0, seed=5)
    s_ref, s_cand = inspect(REFERENCE, "reference"), inspect(PolicySpec.of(ref), "same_as_ref")
    assert s_ref == s_cand  # same weights, same seeds, same programs, same score
    # the random tiny model writes no valid program: every sample sits at the failure floor
    assert s_ref == pytest.approx(-2.0)
    assert [r["samples"] for r in inspect.records] == [6, 6]
    assert [r["policy"] for r in inspect.records] == ["reference", "same_as_ref"]
    assert all(torch.equal(get_adapter_state(agent.model, POLICY)[k], policy[k]) for k in policy)
    assert all(torch.equal(get_adapter_state(agent.model, REF)[k], ref[k]) for k in ref)


def test_online_gate_promotes_the_policy_that_writes_valid_programs(sandbox):
    agent = ByAdapterAgent(TINY, seed=0)
    agent.seen_adapters = []
    set_adapter_state(agent.model, REF, perturbed(agent, 1))
    final = perturbed(agent, 2)
    set_adapter_state(agent.model, POLICY, final)
    explorer = Explorer(ToyBanditTask(), agent, sandbox, ProgramDatabase(EXPLORE),
                        EXPLORE, seed=0)
    prompts = prompts_for(agent)
    items = [GateItem(prompt=p, completions=[GOOD, JUNK], scores=[0.5, -2.0], preferred=GOOD)
             for p in prompts]
    inspect = OnlineInspector(explorer, prompts, {"round": 0}, samples=2, temperature=0.5,
                              failure_score=-2.0, seed=3)
    gate = GateConfig(score_mode="online", delta=100.0, online_samples=2)
    d = select_and_gate(agent.model, agent.tokenizer, [PolicyCandidate("final", final, 4)],
                        items, gate, online_score=inspect)
    rec = {r["policy"]: r for r in inspect.records}
    assert rec["final"]["valid"] == 4 and rec["reference"]["valid"] == 0
    assert math.isfinite(rec["final"]["best"]) and rec["reference"]["best"] is None
    assert d.ref_score == pytest.approx(-2.0) and d.score > -2.0 + 0.5
    assert d.candidates[0].score == pytest.approx(rec["final"]["score"])
    assert d.accepted and d.chosen == "final" and d.gain > 0.5
    # the candidate sampled with its own state in the policy adapter, the reference with ref
    assert (POLICY, POLICY) in agent.seen_adapters and (REF, REF) in agent.seen_adapters
    assert all(torch.equal(get_adapter_state(agent.model, POLICY)[k], final[k]) for k in final)


def test_online_mode_without_a_sampler_is_a_clear_error():
    agent = ResearchAgent(TINY, seed=0)
    item = GateItem(prompt="p```python\n", completions=["x"], scores=[0.0], preferred="x")
    cand = [PolicyCandidate("final", get_adapter_state(agent.model, POLICY), 1)]
    with pytest.raises(ValueError, match="gate.score_mode=online needs online_score"):
        select_and_gate(agent.model, agent.tokenizer, cand, [item],
                        GateConfig(score_mode="online"))
    with pytest.raises(ValueError, match="Explorer"):
        FineTuner(agent, PhaseSettings({"reference": "adaptive"}, None,
                                       GateConfig(score_mode="online")), 0)
    with pytest.raises(ValueError, match="gate.online_samples"):
        GateConfig(online_samples=0)
    with pytest.raises(ValueError, match="gate.online_temperature"):
        GateConfig(online_temperature=0.0)
    with pytest.raises(ValueError, match="at least one gate prompt"):
        OnlineInspector(None, [], {}, samples=1, temperature=0.5, failure_score=-1.0, seed=0)
