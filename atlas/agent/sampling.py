"""Batched nucleus sampling of n completions per prompt, built for a small LM on CPU.

Why not ``model.generate``: the n samples of one prompt share the prompt, so we prefill it
once and copy its KV cache n times (``atlas.agent.kv_cache``); rows that finish (EOS or a
stop string) leave the batch instead of decoding padding; the KV cache is a preallocated
buffer (no ``torch.cat`` per step); sampling draws one uniform per row instead of
``multinomial`` over the vocabulary (``atlas.agent.draws``); and bf16 linear layers run on
pre-packed oneDNN weights (``fastlinear``). On the CPU a pass feeds each row guessed tokens
as well (prompt lookup, ``atlas.agent.lookup``) and keeps the sampler's own draws up to the
first that differs: several tokens a pass, the same tokens. Tokens/s counts only real
generated tokens.

This module is the API: it lays out the batch, picks the decode path, falls back to the
compact path when another fails before handing a row on, and cuts each row's text. Every
path runs the one loop of ``atlas.agent.decode`` with its step (``atlas.agent.steps``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from atlas.agent.decode import (
    Batch,
    DecodeState,
    Request,
    SampleStats,
    Step,
    decode_loop,
    final_text,
    make_batch,
    restore_threads,
    set_threads,
)
from atlas.agent.draws import next_tokens, stream_table
from atlas.agent.fastlinear import merged_lora, packed_linears
from atlas.agent.graph_step import llama_parts, static_weights
from atlas.agent.kv_cache import Prefilled, prefill_rows
from atlas.agent.lookup import DRAFT_TOKENS
from atlas.agent.steps import _GQA_SWITCH, STEPS_ATTR, CompactStep, GraphStep, LookupStep

# the records of a call and the token draw, for callers of the sampling API
__all__ = ["PATHS", "Request", "SampleStats", "_GQA_SWITCH", "next_tokens", "sample",
           "sample_requests", "validate_sampling"]

PATHS = ("auto", "lookup", "compact", "graph")
_BROKEN_ATTR = "_atlas_graph_failed"  # why the graph path failed on this model (then compact)

Decoded = tuple[list[list[int]], list[str]]  # each row's tokens, each row's finish reason


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
    ``threads``: polled as the model runs (every ``decode.THREAD_POLL`` steps on the compact
    path) for the torch threads to use now (the cores sandbox workers leave free); the
    caller's setting is restored at the end.
    ``on_done(row, text)``: called as soon as a row ends (EOS or stop string) with its final
    text (row = prompt index * num_samples + sample index), so a caller can start scoring it
    while the other rows still decode; rows cut by ``max_new_tokens`` are only returned.
    ``pack``: decode through inference layers (LoRA merged into a weight copy; bf16 CPU
    weights oneDNN-packed); False runs peft's layers as training does (compact path only).
    ``path``: ``compact`` (finished rows leave the batch; a host look each step), ``lookup``
    (guessed tokens verified in one pass), ``graph`` (``atlas.agent.graph_step``: fixed
    shape, a CUDA graph on CUDA) or ``auto`` (graph on CUDA, lookup on the CPU).
    ``uniforms``: a [rows, max_new_tokens] table, row r's uniform at step s, used instead of
    the random stream (every path gives the same tokens for it).
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


def _decode(model, tokenizer: PreTrainedTokenizerBase, requests: list[Request],
            streams: list[int], seeds: list[int | None], *, top_p: float, max_new_tokens: int,
            stop: Sequence[str] | None, pack: bool, threads: Callable[[], int] | None,
            on_done: Callable[[int, str], None] | None, path: str = "auto",
            uniforms: torch.Tensor | None = None) -> tuple[list[list[str]], SampleStats]:
    """Shared by ``sample`` and ``sample_requests``: lay out the batch, try the graph or
    lookup path where it applies, else (or when it fails before handing a row on) decode
    compact, then cut each row's text.

    ``streams[j]``: the random stream request j draws from (``seeds[stream]`` seeds it).
    Rows are request-major; a stream's rows are contiguous, so drawing each stream's
    uniforms for its live rows in stream order lines them up with the live batch.
    """
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {', '.join(PATHS)}")
    batch = make_batch(model, tokenizer, requests, streams, seeds, top_p=top_p,
                       max_new_tokens=max_new_tokens, stop=stop, uniforms=uniforms)
    stats = SampleStats(prompts=len(requests), rows=batch.rows)
    want = path if path != "auto" else ("graph" if batch.device.type == "cuda" else "lookup")
    parts = _graph_parts(model, want, batch, stats)
    stats.device = str(batch.device)
    with restore_threads(torch.get_num_threads()):
        set_threads(threads, stats)
        result = None
        if parts is not None:
            result = _try_graph(model, tokenizer, parts, batch, on_done, threads, stats)
        elif want == "lookup":
            result = _try_lookup(model, tokenizer, batch, pack, on_done, threads, stats)
        if result is None:
            result = _decode_compact(model, tokenizer, batch, pack, on_done, threads, stats)
    generated, finish = result
    return _texts(tokenizer, batch, generated, finish, stats), stats


def _graph_parts(model, want: str, batch: Batch, stats: SampleStats) -> dict | None:
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


def _prefilled(model, tokenizer: PreTrainedTokenizerBase, batch: Batch,
               stats: SampleStats) -> Prefilled:
    pre = prefill_rows(model, tokenizer, [r.prompt for r in batch.requests], batch.streams,
                       batch.counts, batch.device)
    stats.prompt_tokens, stats.prefill_seconds = pre.prompt_tokens, pre.seconds
    return pre


def _table(batch: Batch) -> torch.Tensor:
    """The (rows, max_new_tokens) uniforms a fixed-table path draws from: the caller's, or
    each stream's drawn up front (``draws.stream_table``)."""
    table = batch.uniforms if batch.uniforms is not None else stream_table(
        batch.gens, batch.counts, batch.streams, batch.stream_temp, batch.max_new_tokens,
        batch.device)
    return table.to(batch.device)


def _guarded(name: str, batch: Batch, on_done: Callable[[int, str], None] | None,
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


def _run(state: DecodeState, step: Step) -> Decoded:
    decode_loop(state, step)
    return state.generated, state.finish


def _try_graph(model, tokenizer: PreTrainedTokenizerBase, parts: dict, batch: Batch,
               on_done: Callable[[int, str], None] | None,
               threads: Callable[[], int] | None, stats: SampleStats) -> Decoded | None:
    """The graph path's tokens and finish reasons; None when it failed before it returned
    them and before it handed any row on (the model is marked, the streams rewound,
    ``stats.fallback`` says why)."""

    def decode(report: Callable[[int, str], None]) -> Decoded:
        t0 = time.perf_counter()
        with static_weights(model) as (allocated, _):
            stats.merged = True
            stats.setup_seconds = time.perf_counter() - t0
            pre = _prefilled(model, tokenizer, batch, stats)
            state = DecodeState(batch, tokenizer, stats, report, threads)
            return _run(state, GraphStep(model, parts, state, pre, _table(batch),
                                         fresh_weights=allocated > 0))

    result, why = _guarded("graph", batch, on_done, stats, decode)
    if why:
        model.__dict__[_BROKEN_ATTR] = why  # not tried again in this process
        model.__dict__.pop(STEPS_ATTR, None)
    return result


def _try_lookup(model, tokenizer: PreTrainedTokenizerBase, batch: Batch, pack: bool,
                on_done: Callable[[int, str], None] | None,
                threads: Callable[[], int] | None, stats: SampleStats) -> Decoded | None:
    """The lookup path's tokens and finish reasons; None when it failed before it handed
    any row on (the streams rewound, ``stats.fallback`` says why: the compact path runs)."""

    def decode(report: Callable[[int, str], None]) -> Decoded:
        with packed_linears(model, enabled=pack) as stats.packed, \
                merged_lora(model, enabled=pack) as stats.merged:
            pre = _prefilled(model, tokenizer, batch, stats)
            prompts = [list(tokenizer(r.prompt, add_special_tokens=False)["input_ids"])
                       for r in batch.requests]
            contexts = [prompts[j] for j, n in enumerate(batch.counts) for _ in range(n)]
            state = DecodeState(batch, tokenizer, stats, report, threads)
            return _run(state, LookupStep(model, state, pre, contexts, _table(batch),
                                          DRAFT_TOKENS))

    stats.path = "lookup"
    result, why = _guarded("lookup", batch, on_done, stats, decode)
    if why:
        stats.steps = stats.drafted = stats.accepted = 0
    return result


def _decode_compact(model, tokenizer: PreTrainedTokenizerBase, batch: Batch, pack: bool,
                    on_done: Callable[[int, str], None] | None,
                    threads: Callable[[], int] | None, stats: SampleStats) -> Decoded:
    """The compact path's tokens and finish reasons (finished rows leave the batch)."""
    stats.path, stats.merged = "compact", False
    with packed_linears(model, enabled=pack) as stats.packed, \
            merged_lora(model, enabled=pack) as stats.merged:
        pre = _prefilled(model, tokenizer, batch, stats)
        state = DecodeState(batch, tokenizer, stats, on_done, threads)
        return _run(state, CompactStep(model, state, pre))


def _texts(tokenizer: PreTrainedTokenizerBase, batch: Batch, generated: list[list[int]],
           finish: list[str], stats: SampleStats) -> list[list[str]]:
    """Each request's completions: its rows' tokens as text, cut at a stop string."""
    stats.finish = finish
    stats.new_tokens = sum(len(g) for g in generated)
    texts = [final_text(tokenizer, toks, finish[r], batch.stop)
             for r, toks in enumerate(generated)]
    bounds = [0]
    for n in batch.counts:
        bounds.append(bounds[-1] + n)
    return [texts[bounds[j]:bounds[j + 1]] for j in range(len(batch.requests))]
