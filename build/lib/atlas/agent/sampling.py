"""Batched nucleus sampling of n completions per prompt, built for a small LM on CPU.

Why not ``model.generate``: the n samples of one prompt share the prompt, so we prefill it
once and copy its KV cache n times; rows that finish (EOS or a stop string) leave the batch
instead of decoding padding; the KV cache is a preallocated buffer (no ``torch.cat`` per
step); sampling draws one uniform per row instead of ``multinomial`` over the vocabulary;
and bf16 linear layers run on pre-packed oneDNN weights (``fastlinear``).
Tokens/s counts only real generated tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from atlas.agent.fastlinear import packed_linears

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
    packed: bool = False
    finish: list[str] = field(default_factory=list)  # per row: "eos" | "stop" | "length"
    threads: list[int] = field(default_factory=list)  # torch threads used, each time they changed

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


class _BufferLayer(DynamicLayer):
    """A KV layer backed by a preallocated buffer; ``update`` writes in place, returns a view."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        self.kbuf = keys.new_empty((b, h, capacity, d))
        self.vbuf = values.new_empty((b, h, capacity, d))
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


def _buffered_cache(prefill: DynamicCache, repeats: int, capacity: int) -> DynamicCache:
    """Copy a prefilled cache into per-row buffers, each prompt row repeated ``repeats`` times."""
    layers = []
    for layer in prefill.layers:
        k = layer.keys.repeat_interleave(repeats, dim=0)
        v = layer.values.repeat_interleave(repeats, dim=0)
        layers.append(_BufferLayer(k, v, capacity))
    cache = DynamicCache()
    cache.layers = layers
    return cache


def next_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: greedy when ``temperature <= 0``, else nucleus (top-p) sampling.

    Inverse-CDF sampling with one uniform per row: deterministic under ``generator`` and far
    cheaper than ``torch.multinomial`` over a 49k vocabulary.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    rows = probs.shape[0]
    u = torch.rand((rows, 1), generator=generator, device=probs.device)
    if top_p >= 1.0:
        cdf = probs.cumsum(dim=-1)
        choice = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=probs.shape[-1] - 1)
        return choice.squeeze(1)
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


@torch.inference_mode()
def sample(model, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], num_samples: int,
           *, temperature: float, top_p: float, max_new_tokens: int,
           stop: Sequence[str] | None = None, seed: int | None = None,
           pack: bool = True, threads: Callable[[], int] | None = None,
           on_done: Callable[[int, str], None] | None = None
           ) -> tuple[list[list[str]], SampleStats]:
    """Sample ``num_samples`` completions for each prompt; returns texts and ``SampleStats``.

    Completions are the generated text only, cut before the first stop string (EOS removed).
    Rows of the batch are (prompt, sample) pairs, prompt-major. Same seed, same output.
    ``threads``: polled every ``THREAD_POLL`` decode steps for the torch threads to use now
    (the cores sandbox workers leave free); the caller's setting is restored at the end.
    ``on_done(row, text)``: called as soon as a row ends (EOS or stop string) with its final
    text (row = prompt index * num_samples + sample index), so a caller can start scoring it
    while the other rows still decode; rows cut by ``max_new_tokens`` are only returned.
    """
    validate_sampling(num_samples, temperature, top_p, max_new_tokens)
    stop = [s for s in (stop or []) if s]
    stats = SampleStats(prompts=len(prompts), rows=len(prompts) * num_samples)
    if not prompts:
        return [], stats
    device = next(model.parameters()).device
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # follows torch.manual_seed
    gen = torch.Generator(device=device).manual_seed(int(seed))
    eos = torch.tensor(_eos_ids(model, tokenizer), device=device)
    window = max((len(s) for s in stop), default=0) + 4  # tokens of tail text to scan
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    stats.prompt_tokens = int(mask.sum())
    padded = bool((mask == 0).any())

    threads_before = torch.get_num_threads()
    with packed_linears(model, enabled=pack) as stats.packed, _restore_threads(threads_before):
        _set_threads(threads, stats)
        t0 = time.perf_counter()
        cache = DynamicCache(config=model.config)
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        out = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float().repeat_interleave(num_samples, dim=0)
        width = ids.shape[1]
        cache = _buffered_cache(out.past_key_values, num_samples, width + max_new_tokens)
        mask_buf = torch.ones((stats.rows, width + max_new_tokens), dtype=mask.dtype, device=device)
        mask_buf[:, :width] = mask.repeat_interleave(num_samples, dim=0)
        next_pos = (mask.sum(-1, keepdim=True)).repeat_interleave(num_samples, dim=0)
        stats.prefill_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        rows = torch.arange(stats.rows, device=device)  # original row of each live batch row
        generated: list[list[int]] = [[] for _ in range(stats.rows)]
        finish = ["length"] * stats.rows
        for step in range(max_new_tokens):
            if threads is not None and step % THREAD_POLL == 0:
                _set_threads(threads, stats)
            tok = next_tokens(logits, temperature, top_p, gen)
            done = torch.isin(tok, eos)
            stats.steps += 1
            live_rows, toks, dones = rows.tolist(), tok.tolist(), done.tolist()
            stats.new_tokens += len(toks)
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

    stats.finish = finish
    texts = [_final_text(tokenizer, toks, finish[r], stop) for r, toks in enumerate(generated)]
    return [texts[i * num_samples:(i + 1) * num_samples] for i in range(len(prompts))], stats
