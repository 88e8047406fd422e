"""Batched nucleus sampling of n completions per prompt, built for a small LM on CPU.

Why not ``model.generate``: the n samples of one prompt share the prompt, so we prefill it
once and copy its KV cache n times; rows that finish (EOS or a stop string) leave the batch
instead of decoding padding; the KV cache is a preallocated buffer (no ``torch.cat`` per
step); sampling draws one uniform per row instead of ``multinomial`` over the vocabulary;
and bf16 linear layers run on pre-packed oneDNN weights (``fastlinear``). On the CPU a pass
feeds each row guessed tokens as well (prompt lookup, ``atlas.agent.lookup``) and keeps the
sampler's own draws up to the first that differs: several tokens a pass, the same tokens.
Tokens/s counts only real generated tokens.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from atlas.agent import graph_step
from atlas.agent.fastlinear import merged_lora, packed_linears
from atlas.agent.graph_step import CHECK_EVERY, DecodeStep, llama_parts, static_weights
from atlas.agent.lookup import DRAFT_TOKENS, Drafts

TOPK_TRIES = (64, 1024)  # nucleus searched among these top-k first; full sort as a last resort
THREAD_POLL = 8  # decode steps between looks at the thread budget


def _set_threads(threads: Callable[[], int] | None, stats: SampleStats) -> None:
    if threads is not None:
        n = max(1, int(threads()))
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
    if not stats.threads or stats.threads[-1] != torch.get_num_threads():
        stats.threads.append(torch.get_num_threads())


@contextmanager
def _restore_threads(n: int) -> Iterator[None]:
    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


@dataclass
class SampleStats:
    """What one ``sample`` call did, for benchmarks and telemetry."""

    prompts: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0  # real generated tokens (EOS included, padding never counted)
    steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    packed: bool = False  # bf16 CPU linear layers ran on oneDNN-packed weights
    merged: bool = False  # LoRA layers ran as one linear layer over a merged weight copy
    device: str = ""  # where the model decoded
    path: str = ""  # "lookup" | "compact" (rows leave the batch) | "graph" | "cuda-graph"
    fallback: str = ""  # why the path asked for did not run (then ``path`` says what did)
    setup_seconds: float = 0.0  # one-off: weight buffers refreshed, CUDA graph captured
    step_attention: str = ""  # graph paths: "grouped" | "layer" (graph_step.STEP_ATTENTION)
    drafted: int = 0  # lookup path: guessed tokens run through the model
    accepted: int = 0  # lookup path: guessed tokens the sampler drew as they were guessed
    finish: list[str] = field(default_factory=list)  # per row: "eos" | "stop" | "length"
    threads: list[int] = field(default_factory=list)  # torch threads used, each time they changed

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def add_to(self, event: dict | None) -> dict:
        """A round event's ``sampler`` fields with this call added (a round that decodes its
        islands one by one makes several calls): which path ran (and why another did not),
        where, rows, prompt and generated tokens, steps, set-up, prefill and decode seconds,
        generated tokens per second of prefill + decode."""
        e = dict(event or {"path": "", "fallback": "", "device": self.device, "calls": 0,
                           "rows": 0, "prompt_tokens": 0, "new_tokens": 0, "steps": 0,
                           "setup_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "tok_s": 0.0})
        paths = [p for p in (e["path"].split("+") if e["path"] else []) if p]
        e["path"] = "+".join(paths + ([self.path] if self.path not in paths else []))
        e["fallback"] = e["fallback"] or self.fallback
        if self.step_attention:
            e["step_attention"] = self.step_attention
        if self.path == "lookup":
            e["drafted"] = e.get("drafted", 0) + self.drafted
            e["accepted"] = e.get("accepted", 0) + self.accepted
        e["calls"] += 1
        for key, value in (("rows", self.rows), ("prompt_tokens", self.prompt_tokens),
                           ("new_tokens", self.new_tokens), ("steps", self.steps)):
            e[key] += value
        for key, value in (("setup_s", self.setup_seconds), ("prefill_s", self.prefill_seconds),
                           ("decode_s", self.decode_seconds)):
            e[key] = round(e[key] + value, 4)
        seconds = e["prefill_s"] + e["decode_s"]
        e["tok_s"] = round(e["new_tokens"] / seconds, 2) if seconds > 0 else 0.0
        return e


class _BufferLayer(DynamicLayer):
    """A KV layer backed by a preallocated buffer; ``update`` writes in place, returns a view."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int,
                 zeros: bool = False) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        alloc = keys.new_zeros if zeros else keys.new_empty
        self.kbuf = alloc((b, h, capacity, d))
        self.vbuf = alloc((b, h, capacity, d))
        self.kbuf[:, :, :n].copy_(keys)
        self.vbuf[:, :, :n].copy_(values)
        self.length = n
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.kbuf[:, :, : self.length]
        self.values = self.vbuf[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        s = key_states.shape[-2]
        if self.length + s > self.kbuf.shape[2]:
            raise RuntimeError("KV buffer overflow: capacity was sized for max_new_tokens")
        self.kbuf[:, :, self.length : self.length + s].copy_(key_states)
        self.vbuf[:, :, self.length : self.length + s].copy_(value_states)
        self.length += s
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf = self.kbuf.index_select(0, indices)
        self.vbuf = self.vbuf.index_select(0, indices)
        self._views()


class _RaggedLayer(_BufferLayer):
    """A KV layer whose rows keep their own lengths (the lookup path): a pass writes each
    row's new keys and values at that row's ``slots`` and attention reads the buffer up to
    ``length`` (set per pass) under the pass's mask, so a row's rejected guesses are simply
    overwritten. Zeros, not empty: a masked slot weighs 0 in attention, and 0 * NaN is NaN."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__(keys, values, capacity, zeros=True)
        self.slots: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        at = self.slots[:, None, :, None].expand(-1, key_states.shape[1], -1,
                                                 key_states.shape[-1])
        self.kbuf.scatter_(2, at, key_states.to(self.kbuf.dtype))
        self.vbuf.scatter_(2, at, value_states.to(self.vbuf.dtype))
        self._views()
        return self.keys, self.values


def next_tokens(logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float,
                generator: torch.Generator | None, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row: greedy when a row's temperature is <= 0, else nucleus (top-p).

    Inverse-CDF sampling with one uniform per row: deterministic under ``generator`` and far
    cheaper than ``torch.multinomial`` over a 49k vocabulary. ``temperature`` is one value or
    one per row (a batch that serves several islands); ``u``: the rows' uniforms, drawn by
    the caller when rows follow different generators (then ``generator`` is unused).
    """
    rows = logits.shape[0]
    if not isinstance(temperature, torch.Tensor):
        if temperature <= 0:
            return logits.argmax(dim=-1)
        scale: float | torch.Tensor = temperature
        greedy = None
    else:
        temps = temperature.to(device=logits.device, dtype=torch.float32).reshape(rows, 1)
        greedy = temps[:, 0] <= 0
        if bool(greedy.all()):
            return logits.argmax(dim=-1)
        scale = torch.where(temps > 0, temps, torch.ones_like(temps))
        greedy = greedy if bool(greedy.any()) else None
    probs = torch.softmax(logits.float() / scale, dim=-1)
    if u is None:
        u = torch.rand((rows, 1), generator=generator, device=probs.device)
    if top_p >= 1.0:
        cdf = probs.cumsum(dim=-1)
        choice = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=probs.shape[-1] - 1)
        picked = choice.squeeze(1)
    else:
        picked = _nucleus(probs, top_p, u)
    return picked if greedy is None else torch.where(greedy, logits.argmax(dim=-1), picked)


def _nucleus(probs: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    vals = idx = cum = None
    for k in TOPK_TRIES:  # small nuclei are the rule: try a cheap top-k before a full sort
        if k >= probs.shape[-1]:
            break
        vals, idx = probs.topk(k, dim=-1, sorted=True)
        cum = vals.cumsum(dim=-1)
        if bool((cum[:, -1] >= top_p).all()):
            break
        vals = None
    if vals is None:
        vals, idx = probs.sort(dim=-1, descending=True)
        cum = vals.cumsum(dim=-1)
    keep = (cum - vals) < top_p  # the mass before a token is below top_p: the first always stays
    vals = vals * keep
    cdf = vals.cumsum(dim=-1)
    choice = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=vals.shape[-1] - 1)
    return idx.gather(1, choice).squeeze(1)


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def _final_text(tokenizer: PreTrainedTokenizerBase, toks: list[int], finish: str,
                stop: Sequence[str]) -> str:
    """A row's completion: its tokens decoded without the EOS, cut before a stop string."""
    text = tokenizer.decode(toks[:-1] if finish == "eos" else toks, skip_special_tokens=True)
    return _cut_at_stop(text, stop)[0] if stop else text


def _eos_ids(model, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def validate_sampling(num_samples: int, temperature: float, top_p: float,
                      max_new_tokens: int) -> None:
    """Reject bad sampling settings with a message naming the argument and its range."""
    if int(num_samples) < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")


@dataclass(frozen=True)
class Request:
    """One prompt's share of a batched call: its samples, temperature and random stream.

    Requests of one call decode as one batch; each draws its uniforms from its own
    generator seeded with ``seed``, so a request's samples are those it would get alone
    (up to float rounding that batch composition can change; see ``sample_requests``).
    """

    prompt: str
    num_samples: int
    temperature: float
    seed: int | None = None


@torch.inference_mode()
def sample(model, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], num_samples: int,
           *, temperature: float, top_p: float, max_new_tokens: int,
           stop: Sequence[str] | None = None, seed: int | None = None,
           pack: bool = True, threads: Callable[[], int] | None = None,
           on_done: Callable[[int, str], None] | None = None, path: str = "auto",
           uniforms: torch.Tensor | None = None) -> tuple[list[list[str]], SampleStats]:
    """Sample ``num_samples`` completions for each prompt; returns texts and ``SampleStats``.

    Completions are the generated text only, cut before the first stop string (EOS removed).
    Rows of the batch are (prompt, sample) pairs, prompt-major; all rows share one random
    stream seeded with ``seed``. Same seed, same output.
    ``threads``: polled every ``THREAD_POLL`` decode steps for the torch threads to use now
    (the cores sandbox workers leave free); the caller's setting is restored at the end.
    ``on_done(row, text)``: called as soon as a row ends (EOS or stop string) with its final
    text (row = prompt index * num_samples + sample index), so a caller can start scoring it
    while the other rows still decode; rows cut by ``max_new_tokens`` are only returned.
    ``pack``: decode through inference layers (LoRA merged into a weight copy; bf16 CPU
    weights oneDNN-packed); False runs peft's layers as training does (compact path only).
    ``path``: ``compact`` (finished rows leave the batch; a host look each step), ``graph``
    (``atlas.agent.graph_step``: fixed shape, a CUDA graph on CUDA) or ``auto`` (graph on
    CUDA, compact on the CPU). ``uniforms``: a [rows, max_new_tokens] table, row r's uniform
    at step s, used instead of the random stream (both paths give the same tokens for it).
    """
    validate_sampling(num_samples, temperature, top_p, max_new_tokens)
    requests = [Request(p, int(num_samples), float(temperature)) for p in prompts]
    return _decode(model, tokenizer, requests, [0] * len(requests), [seed], top_p=top_p,
                   max_new_tokens=max_new_tokens, stop=stop, pack=pack, threads=threads,
                   on_done=on_done, path=path, uniforms=uniforms)


@torch.inference_mode()
def sample_requests(model, tokenizer: PreTrainedTokenizerBase, requests: Sequence[Request], *,
                    top_p: float, max_new_tokens: int, stop: Sequence[str] | None = None,
                    pack: bool = True, threads: Callable[[], int] | None = None,
                    on_done: Callable[[int, str], None] | None = None, path: str = "auto",
                    uniforms: torch.Tensor | None = None
                    ) -> tuple[list[list[str]], SampleStats]:
    """Decode several requests (e.g. the islands of a round) as one batch.

    Each request keeps its own temperature and random stream, and each prompt is prefilled
    on its own as ``sample`` would, so a request draws the uniforms it would draw alone.
    What batch composition can change: the decode steps of a padded batch run with an
    attention mask and other matrix shapes, so a logit can differ in its last bits from a
    call with that request alone, and a token drawn at a near-tie can differ. On one machine
    the same requests in the same order give the same output. Rows are request-major;
    ``on_done``'s row counts across requests (request j's rows follow request j-1's).
    ``path``, ``uniforms``: as in ``sample``.
    """
    if not requests:
        return [], SampleStats()
    for r in requests:
        validate_sampling(r.num_samples, r.temperature, top_p, max_new_tokens)
    return _decode(model, tokenizer, list(requests), list(range(len(requests))),
                   [r.seed for r in requests], top_p=top_p, max_new_tokens=max_new_tokens,
                   stop=stop, pack=pack, threads=threads, on_done=on_done, path=path,
                   uniforms=uniforms)


def _prefill(model, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
             device: torch.device) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Prompt caches (one per padded batch of prompts), last logits, attention mask.

    Prompts of one length share a forward pass; different lengths are prefilled apart, so
    that no prompt's prefill depends on another's padding.
    """
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    padded = bool((mask == 0).any())
    cache = DynamicCache(config=model.config)
    pos = (mask.cumsum(-1) - 1).clamp_(min=0)
    out = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[:, -1].float(), mask


PATHS = ("auto", "lookup", "compact", "graph")


def _decode(model, tokenizer: PreTrainedTokenizerBase, requests: list[Request],
            streams: list[int], seeds: list[int | None], *, top_p: float, max_new_tokens: int,
            stop: Sequence[str] | None, pack: bool, threads: Callable[[], int] | None,
            on_done: Callable[[int, str], None] | None, path: str = "auto",
            uniforms: torch.Tensor | None = None) -> tuple[list[list[str]], SampleStats]:
    """The decode loop shared by ``sample`` and ``sample_requests``: lay out the batch, try
    the graph path where it applies, else (or when it fails before handing a row on) decode
    compact, then cut each row's text.

    ``streams[j]``: the random stream request j draws from (``seeds[stream]`` seeds it).
    Rows are request-major; a stream's rows are contiguous, so drawing each stream's
    uniforms for its live rows in stream order lines them up with the live batch.
    """
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {', '.join(PATHS)}")
    batch = _batch(model, tokenizer, requests, streams, seeds, top_p=top_p,
                   max_new_tokens=max_new_tokens, stop=stop, uniforms=uniforms)
    stats = SampleStats(prompts=len(requests), rows=sum(batch.counts))
    want = path if path != "auto" else ("graph" if batch.device.type == "cuda" else "lookup")
    parts = _graph_parts(model, want, batch, stats)
    stats.device = str(batch.device)
    with _restore_threads(torch.get_num_threads()):
        _set_threads(threads, stats)
        result = None
        if parts is not None:
            result = _try_graph(model, tokenizer, parts, batch, on_done, threads, stats,
                                uniforms)
        elif want == "lookup":
            result = _try_lookup(model, tokenizer, batch, pack, on_done, threads, stats,
                                 uniforms)
        if result is None:
            result = _decode_compact(model, tokenizer, batch, pack, on_done, threads, stats,
                                     uniforms)
    generated, finish = result
    return _texts(tokenizer, batch, generated, finish, stats), stats


@dataclass
class _Batch:
    """One decode call's rows: requests, their random streams, temperatures and stops."""

    requests: list[Request]
    streams: list[int]
    counts: list[int]  # rows per request
    device: torch.device
    gens: list[torch.Generator]  # one per stream
    row_stream: torch.Tensor
    row_temp: torch.Tensor
    stream_temp: dict[int, float]
    eos_ids: list[int]
    stop: list[str]
    top_p: float
    max_new_tokens: int


def _batch(model, tokenizer: PreTrainedTokenizerBase, requests: list[Request],
           streams: list[int], seeds: list[int | None], *, top_p: float, max_new_tokens: int,
           stop: Sequence[str] | None, uniforms: torch.Tensor | None) -> _Batch:
    """The call's rows; a stream without a seed takes one from torch's global generator."""
    counts = [r.num_samples for r in requests]
    total = sum(counts)
    device = next(model.parameters()).device
    if uniforms is not None and tuple(uniforms.shape) != (total, max_new_tokens):
        raise ValueError(f"uniforms has shape {tuple(uniforms.shape)}; it must be "
                         f"(rows, max_new_tokens) = ({total}, {max_new_tokens})")
    gens = []
    for seed in seeds:
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())  # follows torch.manual_seed
        gens.append(torch.Generator(device=device).manual_seed(int(seed)))
    row_stream = torch.tensor([streams[j] for j, n in enumerate(counts) for _ in range(n)],
                              device=device)
    row_temp = torch.tensor([r.temperature for r in requests for _ in range(r.num_samples)],
                            dtype=torch.float32, device=device)
    return _Batch(requests=requests, streams=streams, counts=counts, device=device, gens=gens,
                  row_stream=row_stream, row_temp=row_temp,
                  stream_temp={streams[j]: r.temperature for j, r in enumerate(requests)},
                  eos_ids=_eos_ids(model, tokenizer), stop=[s for s in (stop or []) if s],
                  top_p=top_p, max_new_tokens=max_new_tokens)


def _graph_parts(model, want: str, batch: _Batch, stats: SampleStats) -> dict | None:
    """The decoder's parts for the graph path, or None (compact) with ``stats.fallback``
    saying why when the graph path was wanted."""
    if want != "graph":
        return None

    parts = llama_parts(model)
    if model.__dict__.get(_BROKEN_ATTR):
        parts, stats.fallback = None, model.__dict__[_BROKEN_ATTR]
    elif parts is None:
        stats.fallback = "graph: not a Llama-style decoder with sdpa/eager attention"
    elif not batch.eos_ids:
        parts, stats.fallback = None, "graph: the tokenizer has no EOS token"
    return parts


Decoded = tuple[list[list[int]], list[str]]  # each row's tokens, each row's finish reason


def _guarded(name: str, batch: _Batch, on_done: Callable[[int, str], None] | None,
             stats: SampleStats, decode: Callable[[Callable[[int, str], None]], Decoded]
             ) -> tuple[Decoded | None, str]:
    """Run a decode path that may fail: ``decode(report)`` hands finished rows on through
    ``report``. On a failure before any row was handed on, the streams are rewound,
    ``stats.fallback`` says why and (None, why) is returned, so the compact path can run;
    after one, the error stands (a second decode would hand rows on twice)."""
    states = [g.get_state() for g in batch.gens]
    reported: list[int] = []

    def report(row: int, text: str) -> None:
        reported.append(row)
        if on_done is not None:
            on_done(row, text)

    try:
        return decode(report), ""
    except Exception as e:  # noqa: BLE001 - the run goes on, compact, and says why
        if reported or isinstance(e, (KeyboardInterrupt, MemoryError)):
            raise
        stats.fallback = f"{name} path failed ({type(e).__name__}: {e})"[:300]
        for g, state in zip(batch.gens, states):
            g.set_state(state)
        return None, stats.fallback


def _try_graph(model, tokenizer: PreTrainedTokenizerBase, parts: dict, batch: _Batch,
               on_done: Callable[[int, str], None] | None,
               threads: Callable[[], int] | None, stats: SampleStats,
               uniforms: torch.Tensor | None) -> Decoded | None:
    """The graph path's tokens and finish reasons; None when it failed before it returned
    them and before it handed any row on (the model is marked, the streams rewound,
    ``stats.fallback`` says why)."""

    def decode(report: Callable[[int, str], None]) -> Decoded:
        t0 = time.perf_counter()
        with static_weights(model) as (allocated, _):
            stats.merged = True
            stats.setup_seconds = time.perf_counter() - t0
            prefilled = _prefilled(model, tokenizer, batch.requests, batch.streams,
                                   batch.counts, batch.device, stats)
            return _graph_loop(
                model, tokenizer, parts, prefilled, batch.max_new_tokens, batch.top_p,
                batch.stop, report, threads, stats, batch.row_temp, batch.eos_ids,
                _table(batch, uniforms), fresh_weights=allocated > 0)

    result, why = _guarded("graph", batch, on_done, stats, decode)
    if why:
        model.__dict__[_BROKEN_ATTR] = why  # not tried again in this process
        model.__dict__.pop(_STEPS_ATTR, None)
    return result


def _table(batch: _Batch, uniforms: torch.Tensor | None) -> torch.Tensor:
    """The (rows, max_new_tokens) uniforms a fixed-table path draws from: the caller's, or
    each stream's drawn up front (``_stream_table``)."""
    table = uniforms if uniforms is not None else _stream_table(
        batch.gens, batch.counts, batch.streams, batch.stream_temp, batch.max_new_tokens,
        batch.device)
    return table.to(batch.device)


_GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextmanager
def _grouped_query_sdpa(enabled: bool) -> Iterator[None]:
    """Within the block transformers' SDPA reads a key/value head shared by several query
    heads in place (``enable_gqa``) instead of copying K and V once per query head, which it
    does for a pass of several tokens under a mask, as a lookup pass is. The same outputs
    bit for bit; the lookup path ~15 % faster on SmolLM2's 9 query heads over 3
    (results.md). Not for one-token passes (transformers folds the heads there, and the
    kernel rounds differently), nor in a DPO step (its backward rounds differently and gains
    nothing measurable), nor on CUDA (a mask with ``enable_gqa`` falls back to the math
    kernel)."""
    if not enabled:
        yield
        return
    before = os.environ.get(_GQA_SWITCH)
    os.environ[_GQA_SWITCH] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_GQA_SWITCH, None)
        else:
            os.environ[_GQA_SWITCH] = before


def _try_lookup(model, tokenizer: PreTrainedTokenizerBase, batch: _Batch, pack: bool,
                on_done: Callable[[int, str], None] | None,
                threads: Callable[[], int] | None, stats: SampleStats,
                uniforms: torch.Tensor | None) -> Decoded | None:
    """The lookup path's tokens and finish reasons; None when it failed before it handed
    any row on (the streams rewound, ``stats.fallback`` says why: the compact path runs)."""

    def decode(report: Callable[[int, str], None]) -> Decoded:
        with packed_linears(model, enabled=pack) as stats.packed, \
                merged_lora(model, enabled=pack) as stats.merged:
            prefilled = _prefilled(model, tokenizer, batch.requests, batch.streams,
                                   batch.counts, batch.device, stats)
            prompts = [list(tokenizer(r.prompt, add_special_tokens=False)["input_ids"])
                       for r in batch.requests]
            contexts = [prompts[j] for j, n in enumerate(batch.counts) for _ in range(n)]
            return _lookup_loop(model, tokenizer, prefilled, contexts, batch.max_new_tokens,
                                batch.top_p, batch.stop, report, threads, stats,
                                batch.row_temp, batch.eos_ids, _table(batch, uniforms),
                                DRAFT_TOKENS)

    stats.path = "lookup"
    result, why = _guarded("lookup", batch, on_done, stats, decode)
    if why:
        stats.steps = stats.drafted = stats.accepted = 0
    return result


def _decode_compact(model, tokenizer: PreTrainedTokenizerBase, batch: _Batch, pack: bool,
                    on_done: Callable[[int, str], None] | None,
                    threads: Callable[[], int] | None, stats: SampleStats,
                    uniforms: torch.Tensor | None) -> tuple[list[list[int]], list[str]]:
    """The compact path's tokens and finish reasons (finished rows leave the batch)."""
    stats.path, stats.merged = "compact", False
    with packed_linears(model, enabled=pack) as stats.packed, \
            merged_lora(model, enabled=pack) as stats.merged:
        prefilled = _prefilled(model, tokenizer, batch.requests, batch.streams, batch.counts,
                               batch.device, stats)
        return _compact_loop(
            model, tokenizer, prefilled, batch.max_new_tokens, batch.top_p, batch.stop,
            on_done, threads, stats, batch.gens, batch.row_stream, batch.row_temp,
            batch.stream_temp, batch.eos_ids, uniforms)


def _texts(tokenizer: PreTrainedTokenizerBase, batch: _Batch, generated: list[list[int]],
           finish: list[str], stats: SampleStats) -> list[list[str]]:
    """Each request's completions: its rows' tokens as text, cut at a stop string."""
    stats.finish = finish
    stats.new_tokens = sum(len(g) for g in generated)
    texts = [_final_text(tokenizer, toks, finish[r], batch.stop)
             for r, toks in enumerate(generated)]
    bounds = [0]
    for n in batch.counts:
        bounds.append(bounds[-1] + n)
    return [texts[bounds[j]:bounds[j + 1]] for j in range(len(batch.requests))]


@dataclass
class _Prefilled:
    """The prompts' KV (padded to one width, one row per sample), mask and last logits."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    prompt_mask: torch.Tensor
    logits: torch.Tensor


def _prefilled(model, tokenizer: PreTrainedTokenizerBase, requests: list[Request],
               streams: list[int], counts: list[int], device: torch.device,
               stats: SampleStats) -> _Prefilled:
    t0 = time.perf_counter()
    # one prefill for requests that share a stream (``sample``'s prompts: one padded
    # batch); one per request otherwise
    groups: list[list[int]] = []
    for j in range(len(requests)):
        if groups and streams[groups[-1][0]] == streams[j] and len(set(streams)) == 1:
            groups[-1].append(j)
        else:
            groups.append([j])
    parts = [_prefill(model, tokenizer, [requests[j].prompt for j in g], device)
             for g in groups]
    width = max(m.shape[1] for _, _, m in parts)
    stats.prompt_tokens = int(sum(m.sum() for _, _, m in parts))
    reps = [torch.tensor([counts[j] for j in g], device=device) for g in groups]
    keys, values = [], []
    for li in range(len(parts[0][0].layers)):
        ks, vs = [], []
        for (cache, _, m), rep in zip(parts, reps):
            k = cache.layers[li].keys.repeat_interleave(rep, dim=0)
            v = cache.layers[li].values.repeat_interleave(rep, dim=0)
            pad = width - m.shape[1]
            if pad:
                k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                v = torch.nn.functional.pad(v, (0, 0, pad, 0))
            ks.append(k)
            vs.append(v)
        keys.append(torch.cat(ks))
        values.append(torch.cat(vs))
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0))
                      .repeat_interleave(rep, dim=0) for (_, _, m), rep in zip(parts, reps)])
    logits = torch.cat([lg.repeat_interleave(rep, dim=0) for (_, lg, _), rep in zip(parts, reps)])
    stats.prefill_seconds = time.perf_counter() - t0
    return _Prefilled(keys, values, mask, logits)


def _compact_loop(model, tokenizer: PreTrainedTokenizerBase, pre: _Prefilled,
                  max_new_tokens: int, top_p: float, stop: list[str],
                  on_done: Callable[[int, str], None] | None,
                  threads: Callable[[], int] | None, stats: SampleStats,
                  gens: list[torch.Generator], row_stream: torch.Tensor,
                  row_temp: torch.Tensor, stream_temp: dict[int, float], eos_ids: list[int],
                  uniforms: torch.Tensor | None) -> tuple[list[list[int]], list[str]]:
    """Finished rows leave the batch (``index_select``); the host reads tokens each step."""
    device = pre.logits.device
    total, width = pre.prompt_mask.shape
    capacity = width + max_new_tokens
    cache = DynamicCache()
    cache.layers = [_BufferLayer(k, v, capacity) for k, v in zip(pre.keys, pre.values)]
    padded = bool((pre.prompt_mask == 0).any())
    mask_buf = torch.ones((total, capacity), dtype=pre.prompt_mask.dtype, device=device)
    mask_buf[:, :width] = pre.prompt_mask
    logits = pre.logits
    next_pos = pre.prompt_mask.sum(-1, keepdim=True)
    one_temp = len(set(stream_temp.values())) == 1
    eos = torch.tensor(eos_ids, device=device)
    window = max((len(s) for s in stop), default=0) + 4  # tokens of tail text to scan
    if uniforms is not None:
        uniforms = uniforms.to(device=device, dtype=torch.float32)

    t0 = time.perf_counter()
    rows = torch.arange(total, device=device)  # original row of each live batch row
    live_stream, live_temp = row_stream, row_temp
    generated: list[list[int]] = [[] for _ in range(total)]
    finish = ["length"] * total
    for step in range(max_new_tokens):
        if threads is not None and step % THREAD_POLL == 0:
            _set_threads(threads, stats)
        temp = stream_temp[0] if one_temp else live_temp
        if uniforms is not None:
            tok = next_tokens(logits, temp, top_p, None, u=uniforms[rows, step][:, None])
        elif len(gens) == 1:
            tok = next_tokens(logits, temp, top_p, gens[0])
        else:
            tok = next_tokens(logits, temp, top_p, None,
                              u=_uniforms(gens, live_stream, stream_temp, device))
        done = torch.isin(tok, eos)
        stats.steps += 1
        live_rows, toks, dones = rows.tolist(), tok.tolist(), done.tolist()
        for j, (r, t, d) in enumerate(zip(live_rows, toks, dones)):
            generated[r].append(t)
            if d:
                finish[r] = "eos"
            elif stop and _cut_at_stop(tokenizer.decode(generated[r][-window:]), stop)[1]:
                finish[r], dones[j] = "stop", True
            if dones[j] and on_done is not None:
                on_done(r, _final_text(tokenizer, generated[r], finish[r], stop))
        if step == max_new_tokens - 1:
            break
        if any(dones):
            keep = torch.tensor([j for j, d in enumerate(dones) if not d], device=device)
            if keep.numel() == 0:
                break
            rows, tok, next_pos = rows[keep], tok[keep], next_pos[keep]
            live_stream, live_temp = live_stream[keep], live_temp[keep]
            mask_buf = mask_buf[keep]
            for layer in cache.layers:
                layer.batch_select_indices(keep)
        length = cache.layers[0].length + 1
        out = model(input_ids=tok[:, None],
                    attention_mask=mask_buf[:, :length] if padded else None,
                    position_ids=next_pos, past_key_values=cache, use_cache=True)
        next_pos = next_pos + 1
        logits = out.logits[:, -1]
    stats.decode_seconds = time.perf_counter() - t0
    return generated, finish


def _lookup_loop(model, tokenizer: PreTrainedTokenizerBase, pre: _Prefilled,
                 contexts: list[list[int]], max_new_tokens: int, top_p: float,
                 stop: list[str], on_done: Callable[[int, str], None] | None,
                 threads: Callable[[], int] | None, stats: SampleStats,
                 row_temp: torch.Tensor, eos_ids: list[int], uniforms: torch.Tensor,
                 draft_tokens: int
                 ) -> tuple[list[list[int]], list[str]]:
    """Prompt-lookup decoding, exact: each pass feeds every live row its last sampled token
    and up to ``draft_tokens`` guessed ones (``lookup.Drafts``), samples a token at each
    of those positions with the row's uniform for that position, and keeps the sampled
    tokens up to the first that differs from the guess (that one included). A kept token is
    the one the one-token loop draws from the same logits with the same uniform, so the
    output is the graph path's for the same uniform table, up to the float rounding of a
    wider pass; a good guess only saves passes. Finished rows leave the batch."""
    device = pre.logits.device
    total, width = pre.prompt_mask.shape
    k = max(0, int(draft_tokens))
    capacity = width + max_new_tokens + k + 1
    cache = DynamicCache()
    cache.layers = [_RaggedLayer(kk, v, capacity) for kk, v in zip(pre.keys, pre.values)]
    valid = torch.zeros((total, capacity), dtype=torch.bool, device=device)
    valid[:, :width] = pre.prompt_mask.bool()
    filled = [width] * total  # per live row: cache slots written and kept
    pos = pre.prompt_mask.sum(-1).tolist()  # per live row: the next position id
    eos = set(eos_ids)
    window = max((len(s) for s in stop), default=0) + 4  # tokens of tail text to scan
    uniforms = uniforms.to(device=device, dtype=torch.float32)
    drafts = [Drafts(c) for c in contexts]
    generated: list[list[int]] = [[] for _ in range(total)]
    finish = ["length"] * total

    def emit(r: int, toks: list[int]) -> bool:
        """Append a row's tokens up to its end; whether it ended."""
        for t in toks:
            generated[r].append(t)
            if t in eos:
                finish[r] = "eos"
            elif stop and _cut_at_stop(tokenizer.decode(generated[r][-window:]), stop)[1]:
                finish[r] = "stop"
            else:
                if len(generated[r]) >= max_new_tokens:
                    return True
                continue
            if on_done is not None:
                on_done(r, _final_text(tokenizer, generated[r], finish[r], stop))
            return True
        return False

    t0 = time.perf_counter()
    first = next_tokens(pre.logits, row_temp, top_p, None, u=uniforms[:, :1]).tolist()
    stats.steps += 1
    rows = list(range(total))  # original row of each live batch row
    live_temp = row_temp
    pending = first  # per live row: its last sampled token, not yet in the cache
    done = [emit(r, [t]) for r, t in zip(rows, first)]
    for r, t in zip(rows, first):
        drafts[r].extend([t])
    additive = getattr(model.config, "_attn_implementation", "sdpa") != "sdpa"
    while True:
        if any(done):
            keep = [j for j, d in enumerate(done) if not d]
            if not keep:
                break
            index = torch.tensor(keep, device=device)
            for layer in cache.layers:
                layer.batch_select_indices(index)
            valid, live_temp = valid[index], live_temp[index]
            rows, pending = [rows[j] for j in keep], [pending[j] for j in keep]
            filled, pos = [filled[j] for j in keep], [pos[j] for j in keep]
        if threads is not None:
            _set_threads(threads, stats)
        n = len(rows)
        guesses = [drafts[r].guess(min(k, max_new_tokens - len(generated[r]) - 1))
                   for r in rows]
        width_t = 1 + max(len(g) for g in guesses)
        ids = [[p, *g, *([p] * (width_t - 1 - len(g)))] for p, g in zip(pending, guesses)]
        step = torch.arange(width_t, device=device)
        base = torch.tensor(filled, device=device)
        span = max(filled) + width_t
        slots = base[:, None] + step
        at = torch.arange(span, device=device)
        fresh = (at >= base[:, None, None]) & (at <= slots[:, :, None])  # (n, T, span)
        mask = (valid[:, None, :span] | fresh)[:, None]
        if additive:  # eager attention adds its mask
            mask = torch.zeros(mask.shape, dtype=pre.keys[0].dtype, device=device).masked_fill_(
                ~mask, torch.finfo(pre.keys[0].dtype).min)
        for layer in cache.layers:
            layer.slots, layer.length = slots, span
        with _grouped_query_sdpa(device.type == "cpu" and width_t > 1):
            out = model(input_ids=torch.tensor(ids, device=device),
                        position_ids=torch.tensor(pos, device=device)[:, None] + step,
                        attention_mask=mask, past_key_values=cache, use_cache=True)
        logits = out.logits.reshape(n * width_t, -1)
        col = (torch.tensor([len(generated[r]) for r in rows], device=device)[:, None]
               + step).clamp_(max=max_new_tokens - 1)
        u = uniforms[torch.tensor(rows, device=device)[:, None], col].reshape(-1, 1)
        sampled = next_tokens(logits, live_temp.repeat_interleave(width_t), top_p, None,
                              u=u).view(n, width_t).tolist()
        stats.steps += 1
        done = []
        for j, (r, g, s) in enumerate(zip(rows, guesses, sampled)):
            m = 0
            while m < len(g) and s[m] == g[m]:
                m += 1
            stats.drafted += len(g)
            stats.accepted += m
            valid[j, filled[j]:filled[j] + m + 1] = True  # the fed token and the m kept guesses
            filled[j] += m + 1
            pos[j] += m + 1
            kept = s[:m + 1]
            drafts[r].extend(kept)
            pending[j] = kept[-1]
            done.append(emit(r, kept))
    stats.decode_seconds = time.perf_counter() - t0
    return generated, finish


def _stream_table(gens: list[torch.Generator], counts: list[int], streams: list[int],
                  stream_temp: dict[int, float], max_new_tokens: int,
                  device: torch.device) -> torch.Tensor:
    """The graph path's uniforms: each stream draws a (steps, its rows) block up front, so
    until a row finishes a row gets the uniform the compact path would draw for it."""
    blocks, order = [], []
    for j, n in enumerate(counts):
        if order and order[-1][0] == streams[j]:
            order[-1][1] += n
        else:
            order.append([streams[j], n])
    for stream, n in order:
        if stream_temp[stream] > 0:
            blocks.append(torch.rand((max_new_tokens, n), generator=gens[stream],
                                     device=device).T)
        else:
            blocks.append(torch.zeros((n, max_new_tokens), device=device))
    return torch.cat(blocks).contiguous()


_STEPS_ATTR = "_atlas_decode_steps"
_BROKEN_ATTR = "_atlas_graph_failed"  # why the graph path failed on this model (then compact)
CUDA_BUCKET = 256  # CUDA: cache capacity rounded up to this, so one graph serves many calls


def _graph_loop(model, tokenizer: PreTrainedTokenizerBase, parts: dict, pre: _Prefilled,
                max_new_tokens: int, top_p: float, stop: list[str],
                on_done: Callable[[int, str], None] | None,
                threads: Callable[[], int] | None, stats: SampleStats,
                row_temp: torch.Tensor, eos_ids: list[int], uniforms: torch.Tensor,
                fresh_weights: bool) -> tuple[list[list[int]], list[str]]:
    """Fixed-shape steps (``graph_step.DecodeStep``), a CUDA graph on CUDA; the host reads
    tokens and ``done`` every ``CHECK_EVERY`` steps and tells finished rows apart exactly as
    the compact loop does (EOS, then a stop string in the row's tail text)."""

    device = pre.logits.device
    total, width = pre.prompt_mask.shape
    cuda = device.type == "cuda"
    capacity = width + max_new_tokens
    if cuda:
        capacity = -(-capacity // CUDA_BUCKET) * CUDA_BUCKET
    shapes = [(k.shape[1], v.shape[-1], k.shape[-1]) for k, v in zip(pre.keys, pre.values)]
    # a graph reads weights by address: one moved or reallocated (a phase that took the model
    # off the device and back) makes a new key, so nothing replays over freed memory
    key = (total, capacity, max_new_tokens, float(top_p), tuple(eos_ids), pre.keys[0].dtype,
           tuple(shapes), hash(tuple(p.data_ptr() for p in model.parameters())),
           graph_step.STEP_ATTENTION, graph_step.CUDA_GRAPH)
    held: dict = model.__dict__.setdefault(_STEPS_ATTR, {}) if cuda else {}
    if fresh_weights:
        held.clear()  # new weight buffers: graphs captured against the old ones are stale
    t0 = time.perf_counter()
    entry = held.get(key)
    if entry is None:
        step = DecodeStep(parts, total, capacity, max_new_tokens, shapes, pre.keys[0].dtype,
                          pre.logits.shape[-1], eos_ids, top_p, device)
        entry = {"step": step, "graph": None, "error": ""}
        held.clear()  # one shape held at a time: its KV buffers are the big part
        if cuda:
            held[key] = entry
        if cuda and graph_step.CUDA_GRAPH:
            try:
                step.load(pre.keys, pre.values, pre.prompt_mask, pre.logits, row_temp, uniforms)
                entry["graph"] = graph_step.capture(step)
            except Exception as e:  # noqa: BLE001 - any capture failure: run eager, say why
                entry["error"] = f"CUDA graph capture failed ({type(e).__name__}: {e})"[:300]
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize(device)
    step, graph = entry["step"], entry["graph"]
    stats.step_attention = step.attention
    stats.fallback = stats.fallback or entry["error"]
    stats.path = "cuda-graph" if graph is not None else "graph"
    step.load(pre.keys, pre.values, pre.prompt_mask, pre.logits, row_temp, uniforms)
    if cuda:
        torch.cuda.synchronize(device)
    stats.setup_seconds += time.perf_counter() - t0
    if graph is not None:
        run = graph.replay
    else:
        run = graph_step.CPU_RUNNER(step) if graph_step.CPU_RUNNER and not cuda else step

    t0 = time.perf_counter()
    window = max((len(s) for s in stop), default=0) + 4
    eos = set(eos_ids)
    generated: list[list[int]] = [[] for _ in range(total)]
    finish = ["length"] * total
    open_rows = list(range(total))
    # the host reads chunk k while the device runs chunk k + 1: each chunk's tokens are copied
    # out right after its steps (into contiguous pinned memory, so the copy is asynchronous),
    # and waiting for that copy never waits for the next chunk

    def launch(start: int) -> tuple[int, int, Any, torch.Tensor]:
        if threads is not None:
            _set_threads(threads, stats)
        n = min(CHECK_EVERY, max_new_tokens - start)
        for _ in range(n):
            run()
        host = torch.empty((total, n), dtype=torch.long, pin_memory=cuda)
        host.copy_(step.tokens[:, start:start + n], non_blocking=cuda)
        event = torch.cuda.Event() if cuda else None
        if event is not None:
            event.record()
        return start, n, event, host

    chunk = launch(0)
    while chunk is not None:
        start, n, event, host = chunk
        following = start + n
        chunk = launch(following) if following < max_new_tokens and open_rows else None
        if event is not None:
            event.synchronize()
        toks = host.tolist()
        stopped = []
        for i in range(n):
            still = []
            for r in open_rows:
                generated[r].append(toks[r][i])
                if toks[r][i] in eos:
                    finish[r] = "eos"
                elif stop and _cut_at_stop(tokenizer.decode(generated[r][-window:]), stop)[1]:
                    finish[r] = "stop"
                    stopped.append(r)
                else:
                    still.append(r)
                    continue
                if on_done is not None:
                    on_done(r, _final_text(tokenizer, generated[r], finish[r], stop))
            open_rows = still
        if not open_rows:
            break  # a chunk launched meanwhile is dropped unread
        if stopped:
            step.done[torch.tensor(stopped, device=device)] = True  # between steps: no sync
    if cuda:
        torch.cuda.synchronize(device)
    stats.steps = max(len(g) for g in generated)
    stats.decode_seconds = time.perf_counter() - t0
    return generated, finish


def _uniforms(gens: list[torch.Generator], live_stream: torch.Tensor,
              stream_temp: dict[int, float], device: torch.device) -> torch.Tensor:
    """One uniform per live row, each stream drawing for its own live rows, in stream order
    (a greedy stream draws nothing, as it would alone)."""
    present = torch.bincount(live_stream, minlength=len(gens)).tolist()
    parts = []
    for s, n in enumerate(present):
        if n == 0:
            continue
        if stream_temp[s] > 0:
            parts.append(torch.rand((n, 1), generator=gens[s], device=device))
        else:
            parts.append(torch.zeros((n, 1), device=device))
    return torch.cat(parts)
