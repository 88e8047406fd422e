"""The decode loop: one loop for every path, a ``Step`` per path (``atlas.agent.steps``).

As in gpt-fast, the loop does the bookkeeping every path shares and a step does the model
work: each call of a step returns the new tokens of its rows (one a row on the compact path,
several on the lookup path, a chunk of steps on the graph path) and the loop hands them to
the ``DecodeState``, which ends a row at EOS, at a stop string or at ``max_new_tokens`` and
hands an ended row's text on at once (``on_done``). The step is then told which rows ended
(``advance``): the compact and lookup steps drop them from the batch, the graph step masks
the ones the host stopped. The loop ends when every row has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

THREAD_POLL = 8  # compact steps between looks at the thread budget


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


def set_threads(threads: Callable[[], int] | None, stats: SampleStats) -> None:
    """Use the torch threads ``threads()`` grants now; ``stats.threads`` notes each change."""
    if threads is not None:
        n = max(1, int(threads()))
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
    if not stats.threads or stats.threads[-1] != torch.get_num_threads():
        stats.threads.append(torch.get_num_threads())


@contextmanager
def restore_threads(n: int) -> Iterator[None]:
    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def final_text(tokenizer: PreTrainedTokenizerBase, toks: list[int], finish: str,
               stop: Sequence[str]) -> str:
    """A row's completion: its tokens decoded without the EOS, cut before a stop string."""
    text = tokenizer.decode(toks[:-1] if finish == "eos" else toks, skip_special_tokens=True)
    return cut_at_stop(text, stop)[0] if stop else text


def eos_ids(model, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


@dataclass
class Batch:
    """One decode call's rows: requests, their random streams, temperatures and stops."""

    requests: list[Request]
    streams: list[int]  # per request: the random stream it draws from
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
    uniforms: torch.Tensor | None  # the caller's (rows, max_new_tokens) table, if any

    @property
    def rows(self) -> int:
        return sum(self.counts)


def make_batch(model, tokenizer: PreTrainedTokenizerBase, requests: list[Request],
               streams: list[int], seeds: list[int | None], *, top_p: float,
               max_new_tokens: int, stop: Sequence[str] | None,
               uniforms: torch.Tensor | None) -> Batch:
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
    return Batch(requests=requests, streams=streams, counts=counts, device=device, gens=gens,
                 row_stream=row_stream, row_temp=row_temp,
                 stream_temp={streams[j]: r.temperature for j, r in enumerate(requests)},
                 eos_ids=eos_ids(model, tokenizer), stop=[s for s in (stop or []) if s],
                 top_p=top_p, max_new_tokens=max_new_tokens, uniforms=uniforms)


class DecodeState:
    """One decode attempt over a ``Batch``: each row's tokens and how it finished, and what a
    step needs from the call (its thread budget, its stats)."""

    def __init__(self, batch: Batch, tokenizer: PreTrainedTokenizerBase, stats: SampleStats,
                 on_done: Callable[[int, str], None] | None,
                 threads: Callable[[], int] | None) -> None:
        self.batch, self.tokenizer, self.stats = batch, tokenizer, stats
        self.on_done, self.threads = on_done, threads
        total = batch.rows
        self.generated: list[list[int]] = [[] for _ in range(total)]
        self.finish = ["length"] * total  # per row: "eos" | "stop" | "length"
        self.ended = [False] * total
        self.live = total  # rows not ended
        self._eos = set(batch.eos_ids)
        self._window = max((len(s) for s in batch.stop), default=0) + 4  # tail tokens to scan

    def poll_threads(self) -> None:
        """Take the thread budget granted now (steps call it where they run the model)."""
        if self.threads is not None:
            set_threads(self.threads, self.stats)

    def emit(self, row: int, tokens: list[int]) -> bool:
        """Append a row's new tokens up to its end; whether the row ended with them. A row
        ends at EOS or a stop string (its text is handed on at once) or at
        ``max_new_tokens`` (only returned); tokens after its end and rows already ended are
        ignored."""
        if self.ended[row]:
            return False
        toks, stop = self.generated[row], self.batch.stop
        for t in tokens:
            toks.append(t)
            if t in self._eos:
                self.finish[row] = "eos"
            elif stop and cut_at_stop(self.tokenizer.decode(toks[-self._window:]), stop)[1]:
                self.finish[row] = "stop"
            elif len(toks) >= self.batch.max_new_tokens:
                break
            else:
                continue
            if self.on_done is not None:
                self.on_done(row, final_text(self.tokenizer, toks, self.finish[row], stop))
            break
        else:
            return False
        self.ended[row] = True
        self.live -= 1
        return True


class Step(Protocol):
    """One decode path's model work (``atlas.agent.steps``)."""

    def __call__(self) -> list[tuple[int, list[int]]]:
        """One pass: (row, its new tokens) in the order they are to be handed on."""

    def advance(self, ended: list[int]) -> None:
        """Rows that ended in the last pass (in the order they ended): drop or mask them and
        get the next pass ready."""

    def close(self) -> None:
        """The loop is over (wait for the device; final stats)."""


def decode_loop(state: DecodeState, step: Step) -> None:
    """Call ``step`` until every row has ended, handing its tokens to ``state``; the stats'
    decode seconds are the loop's."""
    t0 = time.perf_counter()
    while True:
        ended = [row for row, tokens in step() if state.emit(row, tokens)]
        if not state.live:
            break
        step.advance(ended)
    step.close()
    state.stats.decode_seconds = time.perf_counter() - t0
