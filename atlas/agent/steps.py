"""The decode paths as steps of the one decode loop (``atlas.agent.decode``).

- ``CompactStep``: one token a row a call; finished rows leave the batch (``index_select``);
  the host reads the tokens every step. Right for a CPU, where fewer rows is less work.
- ``LookupStep``: prompt-lookup decoding, exact: a pass feeds each row its last token and
  guessed ones (``atlas.agent.lookup``) and keeps the sampler's draws up to the first that
  differs from the guess; several tokens a pass, the very tokens of the compact path.
- ``GraphStep``: fixed-shape steps (``atlas.agent.graph_step.DecodeStep``), a CUDA graph on
  CUDA; the host reads a chunk of ``CHECK_EVERY`` steps while the device runs the next.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from atlas.agent import graph_step
from atlas.agent.decode import THREAD_POLL, DecodeState
from atlas.agent.draws import live_uniforms, next_tokens
from atlas.agent.graph_step import CHECK_EVERY, DecodeStep, StepShape
from atlas.agent.kv_cache import BufferLayer, Prefilled, RaggedLayer, buffer_cache
from atlas.agent.lookup import Drafts

Emitted = list[tuple[int, list[int]]]  # (row, its new tokens), in the order to hand them on


class CompactStep:
    """Sample one token per live row from the last logits; ``advance`` drops the ended rows
    and runs the model on the others' tokens. Uniforms: the caller's table, else the one
    stream's generator, else each stream's for its live rows (``live_uniforms``)."""

    def __init__(self, model, state: DecodeState, pre: Prefilled) -> None:
        b = state.batch
        self.model, self.state = model, state
        device = self.device = pre.logits.device
        total, width = pre.prompt_mask.shape
        capacity = width + b.max_new_tokens
        self.cache = buffer_cache([BufferLayer(k, v, capacity)
                                   for k, v in zip(pre.keys, pre.values)])
        self.padded = bool((pre.prompt_mask == 0).any())
        self.mask_buf = torch.ones((total, capacity), dtype=pre.prompt_mask.dtype, device=device)
        self.mask_buf[:, :width] = pre.prompt_mask
        self.logits = pre.logits
        self.next_pos = pre.prompt_mask.sum(-1, keepdim=True)
        self.one_temp = len(set(b.stream_temp.values())) == 1
        self.uniforms = (None if b.uniforms is None
                         else b.uniforms.to(device=device, dtype=torch.float32))
        self.rows = torch.arange(total, device=device)  # original row of each live batch row
        self.live_stream, self.live_temp = b.row_stream, b.row_temp
        self.step = 0
        self.tok: torch.Tensor | None = None

    def __call__(self) -> Emitted:
        b = self.state.batch
        if self.step % THREAD_POLL == 0:
            self.state.poll_threads()
        temp = b.stream_temp[0] if self.one_temp else self.live_temp
        if self.uniforms is not None:
            tok = next_tokens(self.logits, temp, b.top_p, None,
                              u=self.uniforms[self.rows, self.step][:, None])
        elif len(b.gens) == 1:
            tok = next_tokens(self.logits, temp, b.top_p, b.gens[0])
        else:
            tok = next_tokens(self.logits, temp, b.top_p, None,
                              u=live_uniforms(b.gens, self.live_stream, b.stream_temp,
                                              self.device))
        self.state.stats.steps += 1
        self.step += 1
        self.tok = tok
        return [(r, [t]) for r, t in zip(self.rows.tolist(), tok.tolist())]

    def advance(self, ended: list[int]) -> None:
        if ended:
            gone = self.state.ended
            keep = torch.tensor([j for j, r in enumerate(self.rows.tolist()) if not gone[r]],
                                device=self.device)
            self.rows, self.tok, self.next_pos = self.rows[keep], self.tok[keep], \
                self.next_pos[keep]
            self.live_stream, self.live_temp = self.live_stream[keep], self.live_temp[keep]
            self.mask_buf = self.mask_buf[keep]
            for layer in self.cache.layers:
                layer.batch_select_indices(keep)
        length = self.cache.layers[0].length + 1
        out = self.model(input_ids=self.tok[:, None],
                         attention_mask=self.mask_buf[:, :length] if self.padded else None,
                         position_ids=self.next_pos, past_key_values=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        self.logits = out.logits[:, -1]

    def close(self) -> None:
        pass


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


class LookupStep:
    """Prompt-lookup decoding, exact: each pass feeds every live row its last sampled token
    and up to ``draft_tokens`` guessed ones (``lookup.Drafts`` over ``contexts``, a row's
    prompt tokens), samples a token at each of those positions with the row's uniform for
    that position (``table``), and keeps the sampled tokens up to the first that differs
    from the guess (that one included). A kept token is the one the one-token loop draws
    from the same logits with the same uniform, so the output is the graph path's for the
    same uniform table, up to the float rounding of a wider pass; a good guess only saves
    passes. The first call samples from the prefill's logits. Ended rows leave the batch."""

    def __init__(self, model, state: DecodeState, pre: Prefilled, contexts: list[list[int]],
                 table: torch.Tensor, draft_tokens: int) -> None:
        b = state.batch
        self.model, self.state, self.pre = model, state, pre
        device = self.device = pre.logits.device
        total, width = pre.prompt_mask.shape
        self.k = max(0, int(draft_tokens))
        capacity = width + b.max_new_tokens + self.k + 1
        self.cache = buffer_cache([RaggedLayer(kk, v, capacity)
                                   for kk, v in zip(pre.keys, pre.values)])
        self.valid = torch.zeros((total, capacity), dtype=torch.bool, device=device)
        self.valid[:, :width] = pre.prompt_mask.bool()
        self.filled = [width] * total  # per live row: cache slots written and kept
        self.pos = pre.prompt_mask.sum(-1).tolist()  # per live row: the next position id
        self.uniforms = table.to(device=device, dtype=torch.float32)
        self.drafts = [Drafts(c) for c in contexts]
        self.rows = list(range(total))  # original row of each live batch row
        self.live_temp = b.row_temp
        self.pending: list[int] = []  # per live row: its last sampled token, not yet cached
        self.started = False
        self.additive = getattr(model.config, "_attn_implementation", "sdpa") != "sdpa"

    def __call__(self) -> Emitted:
        if not self.started:
            return self._first()
        self.state.poll_threads()
        b, stats, dev = self.state.batch, self.state.stats, self.device
        generated = self.state.generated
        n, max_new = len(self.rows), b.max_new_tokens
        guesses = [self.drafts[r].guess(min(self.k, max_new - len(generated[r]) - 1))
                   for r in self.rows]
        width_t = 1 + max(len(g) for g in guesses)
        ids = [[p, *g, *([p] * (width_t - 1 - len(g)))] for p, g in zip(self.pending, guesses)]
        step = torch.arange(width_t, device=dev)
        base = torch.tensor(self.filled, device=dev)
        span = max(self.filled) + width_t
        slots = base[:, None] + step
        at = torch.arange(span, device=dev)
        fresh = (at >= base[:, None, None]) & (at <= slots[:, :, None])  # (n, T, span)
        mask = (self.valid[:, None, :span] | fresh)[:, None]
        kv_dtype = self.pre.keys[0].dtype
        if self.additive:  # eager attention adds its mask
            mask = torch.zeros(mask.shape, dtype=kv_dtype, device=dev).masked_fill_(
                ~mask, torch.finfo(kv_dtype).min)
        for layer in self.cache.layers:
            layer.slots, layer.length = slots, span
        with _grouped_query_sdpa(dev.type == "cpu" and width_t > 1):
            out = self.model(input_ids=torch.tensor(ids, device=dev),
                             position_ids=torch.tensor(self.pos, device=dev)[:, None] + step,
                             attention_mask=mask, past_key_values=self.cache, use_cache=True)
        logits = out.logits.reshape(n * width_t, -1)
        col = (torch.tensor([len(generated[r]) for r in self.rows], device=dev)[:, None]
               + step).clamp_(max=max_new - 1)
        u = self.uniforms[torch.tensor(self.rows, device=dev)[:, None], col].reshape(-1, 1)
        sampled = next_tokens(logits, self.live_temp.repeat_interleave(width_t), b.top_p, None,
                              u=u).view(n, width_t).tolist()
        stats.steps += 1
        emitted = []
        for j, (r, g, s) in enumerate(zip(self.rows, guesses, sampled)):
            m = 0
            while m < len(g) and s[m] == g[m]:
                m += 1
            stats.drafted += len(g)
            stats.accepted += m
            self.valid[j, self.filled[j]:self.filled[j] + m + 1] = True  # fed token + m kept
            self.filled[j] += m + 1
            self.pos[j] += m + 1
            kept = s[:m + 1]
            self.drafts[r].extend(kept)
            self.pending[j] = kept[-1]
            emitted.append((r, kept))
        return emitted

    def _first(self) -> Emitted:
        """The first token of every row, from the prefill's logits."""
        b = self.state.batch
        first = next_tokens(self.pre.logits, b.row_temp, b.top_p, None,
                            u=self.uniforms[:, :1]).tolist()
        self.state.stats.steps += 1
        self.started, self.pending = True, first
        for r, t in zip(self.rows, first):
            self.drafts[r].extend([t])
        return [(r, [t]) for r, t in zip(self.rows, first)]

    def advance(self, ended: list[int]) -> None:
        if not ended:
            return
        gone = self.state.ended
        keep = [j for j, r in enumerate(self.rows) if not gone[r]]
        index = torch.tensor(keep, device=self.device)
        for layer in self.cache.layers:
            layer.batch_select_indices(index)
        self.valid, self.live_temp = self.valid[index], self.live_temp[index]
        self.rows, self.pending = [self.rows[j] for j in keep], [self.pending[j] for j in keep]
        self.filled, self.pos = [self.filled[j] for j in keep], [self.pos[j] for j in keep]

    def close(self) -> None:
        pass


STEPS_ATTR = "_atlas_decode_steps"
CUDA_BUCKET = 256  # CUDA: cache capacity rounded up to this, so one graph serves many calls


class GraphStep:
    """Fixed-shape steps (``graph_step.DecodeStep``), a CUDA graph on CUDA. A call reads one
    chunk of ``CHECK_EVERY`` steps (the first call launches the first chunk) after launching
    the next, so the host reads chunk k while the device runs chunk k + 1: each chunk's
    tokens are copied out right after its steps (into contiguous pinned memory, so the copy
    is asynchronous), and waiting for that copy never waits for the next chunk. Rows the
    host stopped (a stop string) are masked between steps; a row at EOS masks itself."""

    def __init__(self, model, parts: dict, state: DecodeState, pre: Prefilled,
                 table: torch.Tensor, fresh_weights: bool) -> None:
        b, stats = state.batch, state.stats
        self.state = state
        device = self.device = pre.logits.device
        total, width = pre.prompt_mask.shape
        cuda = self.cuda = device.type == "cuda"
        capacity = width + b.max_new_tokens
        if cuda:
            capacity = -(-capacity // CUDA_BUCKET) * CUDA_BUCKET
        shapes = [(k.shape[1], v.shape[-1], k.shape[-1]) for k, v in zip(pre.keys, pre.values)]
        # a graph reads weights by address: one moved or reallocated (a phase that took the
        # model off the device and back) makes a new key, so nothing replays over freed memory
        key = (total, capacity, b.max_new_tokens, float(b.top_p), tuple(b.eos_ids),
               pre.keys[0].dtype, tuple(shapes),
               hash(tuple(p.data_ptr() for p in model.parameters())),
               graph_step.STEP_ATTENTION, graph_step.CUDA_GRAPH)
        held: dict = model.__dict__.setdefault(STEPS_ATTR, {}) if cuda else {}
        if fresh_weights:
            held.clear()  # new weight buffers: graphs captured against the old ones are stale
        t0 = time.perf_counter()
        entry = held.get(key)
        if entry is None:
            shape = StepShape(rows=total, capacity=capacity, steps=b.max_new_tokens,
                              layers_kv=tuple(shapes), kv_dtype=pre.keys[0].dtype,
                              vocab=pre.logits.shape[-1])
            step = DecodeStep(parts, shape, b.eos_ids, b.top_p, device)
            entry = {"step": step, "graph": None, "error": ""}
            held.clear()  # one shape held at a time: its KV buffers are the big part
            if cuda:
                held[key] = entry
            if cuda and graph_step.CUDA_GRAPH:
                try:
                    step.load(pre.keys, pre.values, pre.prompt_mask, pre.logits, b.row_temp,
                              table)
                    entry["graph"] = graph_step.capture(step)
                except Exception as e:  # noqa: BLE001 - any capture failure: run eager, say why
                    entry["error"] = f"CUDA graph capture failed ({type(e).__name__}: {e})"[:300]
                    with contextlib.suppress(Exception):
                        torch.cuda.synchronize(device)
        self.step, graph = entry["step"], entry["graph"]
        stats.step_attention = self.step.attention
        stats.fallback = stats.fallback or entry["error"]
        stats.path = "cuda-graph" if graph is not None else "graph"
        self.step.load(pre.keys, pre.values, pre.prompt_mask, pre.logits, b.row_temp, table)
        if cuda:
            torch.cuda.synchronize(device)
        stats.setup_seconds += time.perf_counter() - t0
        if graph is not None:
            self.run = graph.replay
        else:
            self.run = (graph_step.CPU_RUNNER(self.step) if graph_step.CPU_RUNNER and not cuda
                        else self.step)
        self.total = total
        self.started = False
        self.chunk: tuple[int, int, Any, torch.Tensor] | None = None

    def _launch(self, start: int) -> tuple[int, int, Any, torch.Tensor]:
        self.state.poll_threads()
        n = min(CHECK_EVERY, self.state.batch.max_new_tokens - start)
        for _ in range(n):
            self.run()
        host = torch.empty((self.total, n), dtype=torch.long, pin_memory=self.cuda)
        host.copy_(self.step.tokens[:, start:start + n], non_blocking=self.cuda)
        event = torch.cuda.Event() if self.cuda else None
        if event is not None:
            event.record()
        return start, n, event, host

    def __call__(self) -> Emitted:
        if not self.started:
            self.started, self.chunk = True, self._launch(0)
        start, n, event, host = self.chunk
        following = start + n
        self.chunk = (self._launch(following)
                      if following < self.state.batch.max_new_tokens and self.state.live
                      else None)
        if event is not None:
            event.synchronize()
        toks = host.tolist()
        return [(r, [toks[r][i]]) for i in range(n) for r in range(self.total)]

    def advance(self, ended: list[int]) -> None:
        stopped = [r for r in ended if self.state.finish[r] == "stop"]
        if stopped:
            self.step.done[torch.tensor(stopped, device=self.device)] = True  # no sync

    def close(self) -> None:
        """A chunk launched meanwhile is dropped unread."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.state.stats.steps = max(len(g) for g in self.state.generated)
