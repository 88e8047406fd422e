"""Drawing tokens: one uniform per row, nucleus (top-p) by inverse CDF, per random stream.

One uniform per row instead of ``torch.multinomial`` over the vocabulary: deterministic
under a generator and far cheaper over a 49k vocabulary. Rows follow random streams (one per
island of a batched round), each with its own generator: a stream draws for its own rows in
stream order, so a request samples what it would sample alone.
"""

from __future__ import annotations

import torch

TOPK_TRIES = (64, 1024)  # nucleus searched among these top-k first; full sort as a last resort


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


def live_uniforms(gens: list[torch.Generator], live_stream: torch.Tensor,
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


def stream_table(gens: list[torch.Generator], counts: list[int], streams: list[int],
                 stream_temp: dict[int, float], max_new_tokens: int,
                 device: torch.device) -> torch.Tensor:
    """A (rows, max_new_tokens) table of uniforms, each stream drawing a (steps, its rows)
    block up front, so until a row finishes it gets the uniform the compact path would draw
    for it (the graph and lookup paths read this table)."""
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
