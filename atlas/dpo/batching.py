"""Token batches for DPO and the gate: prompt and completion tokenised apart, then joined.

Tokenising the two apart matches how the agent produced the completion (tokens sampled after
the prompt's tokens); tokenising the joined string can merge tokens across the boundary and
shift the mask. The completion ends with EOS (the model must learn to stop), the prompt is
cut from the left when too long (its end is what the completion continues), and batches are
right-padded so that positions stay 0..n-1 without passing position ids.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from atlas.types import PreferencePair


class PromptGroup(NamedTuple):
    """A prompt's token ids and the completions (token ids, EOS included) scored after it.
    (A named tuple: Lightning moves batches through collections and rebuilds tuples.)"""

    prompt: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]


@dataclass
class Encoded:
    """One prompt+completion sequence: token ids and how many of them are prompt."""

    ids: list[int]
    n_prompt: int


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return tokenizer.eos_token_id if pad is None else pad


def encode(tokenizer, prompt: str, completion: str, max_length: int) -> Encoded:
    """Tokenise ``prompt`` and ``completion`` apart, append EOS, fit into ``max_length``.

    The prompt loses tokens from its left; a completion longer than the budget is cut on the
    right but keeps one prompt token so its first token is still predicted from context.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    p = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    c = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no eos_token_id; set tokenizer.eos_token")
    if not c or c[-1] != eos:
        c.append(eos)
    if len(c) >= max_length:
        keep_prompt = 1 if p else 0
        c = c[: max_length - keep_prompt]
        p = p[len(p) - keep_prompt:]
    else:
        budget = max_length - len(c)
        p = p[max(0, len(p) - budget):]
    return Encoded(ids=p + c, n_prompt=len(p))


def collate(encoded: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row: ``input_ids``, ``attention_mask``, ``completion_mask``."""
    if not encoded:
        raise ValueError("collate needs at least one sequence")
    width = max(len(e.ids) for e in encoded)
    n = len(encoded)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    completion = torch.zeros((n, width), dtype=torch.long)
    for i, e in enumerate(encoded):
        length = len(e.ids)
        input_ids[i, :length] = torch.tensor(e.ids, dtype=torch.long)
        attention[i, :length] = 1
        completion[i, e.n_prompt:length] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "completion_mask": completion}


def encode_texts(tokenizer, prompts: Sequence[str], completions: Sequence[str],
                 max_length: int) -> dict[str, torch.Tensor]:
    """Encode and collate aligned lists of prompts and completions."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    rows = [encode(tokenizer, p, c, max_length) for p, c in zip(prompts, completions)]
    return collate(rows, _pad_id(tokenizer))


class PairCollator:
    """DataLoader ``collate_fn``: B pairs -> one 2B-row batch, chosen rows first.

    Chosen and rejected share one forward pass (one padded batch), which is faster than two
    passes and is what TRL does; the loss splits the rows back with ``chunk(2)``.
    """

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, pairs: Sequence[PreferencePair]) -> dict[str, torch.Tensor]:
        prompts = [p.prompt for p in pairs] * 2
        completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        return encode_texts(self.tokenizer, prompts, completions, self.max_length)


class SharedPromptCollator:
    """DataLoader ``collate_fn`` over pair indices for the shared-prompt DPO step.

    ``encoded[i]`` is pair i as a ``PromptGroup`` (prompt, (chosen, rejected)), cut once per
    phase. Pairs of a batch whose cut prompts are identical are merged into one group, so
    their prompt runs once (and a completion repeated across pairs, once). The batch holds ``groups``, ``slots`` (B, 2): each pair's chosen
    and rejected row in the concatenation of the groups' completions, ``index`` (B,): the
    pairs' positions in the phase (for the reference table), ``tokens``: tokens run,
    ``scored``: those of them that are completion tokens (scored through the LM head), and
    ``attended``: the (query, key) pairs its attention scores in each layer and head
    (``attended_pairs``: the work that grows with the square of a prompt's length).
    """

    def __init__(self, encoded: Sequence[PromptGroup]) -> None:
        self.encoded = list(encoded)

    def __call__(self, indices: Sequence[int]) -> dict:
        # prompt -> {completion -> row}: a shared prompt runs once, a repeated completion too
        order: dict[tuple[int, ...], dict[tuple[int, ...], int]] = {}
        slots = []
        for i in indices:
            g = self.encoded[int(i)]
            rows = order.setdefault(g.prompt, {})
            chosen, rejected = (rows.setdefault(c, len(rows)) for c in g.completions[:2])
            slots.append((g.prompt, chosen, rejected))
        starts, groups, offset = {}, [], 0
        for prompt, rows in order.items():
            starts[prompt] = offset
            groups.append(PromptGroup(prompt, tuple(rows)))
            offset += len(rows)
        flat = [(starts[p] + c, starts[p] + r) for p, c, r in slots]
        scored = sum(len(c) for g in groups for c in g.completions)
        tokens = scored + sum(len(g.prompt) for g in groups)
        return {"groups": groups, "slots": torch.tensor(flat, dtype=torch.long),
                "index": torch.tensor([int(i) for i in indices], dtype=torch.long),
                "tokens": tokens, "scored": scored, "attended": attended_pairs(groups)}


def attended_pairs(groups: Sequence[PromptGroup]) -> int:
    """(query, key) pairs that causal attention scores when each group's prompt runs once
    and each completion after it: a prompt of n tokens, n(n+1)/2; a completion of L tokens,
    its first L-1 run at positions n..n+L-2 (its first token is predicted from the
    prompt), each reading every key up to its own."""
    total = 0
    for g in groups:
        n = len(g.prompt)
        total += n * (n + 1) // 2
        total += sum((len(c) - 1) * (2 * n + len(c)) // 2 for c in g.completions)
    return total


class PromptBatches:
    """A DataLoader ``batch_sampler`` over pair indices that puts pairs of one prompt in one
    batch where it can, so the shared-prompt step runs that prompt once, not once per pair
    (a phase's pairs come from a few prompts several times longer than a completion).

    Each epoch: a seeded shuffle of the pairs; each prompt's pairs, in that order, fill
    batches of ``batch_size``; the pairs left over (fewer than a batch per prompt) are
    batched together in that order; then the batches run in a shuffled order. Every pair
    once an epoch, ``ceil(n / batch_size)`` steps, as a plain shuffle; only which pairs
    share a step differs (``dpo.group_by_prompt``).
    """

    def __init__(self, keys: Sequence[Hashable], batch_size: int,
                 generator: torch.Generator) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.keys, self.batch_size, self.generator = list(keys), batch_size, generator

    def __len__(self) -> int:
        return math.ceil(len(self.keys) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        bs = self.batch_size
        buckets: dict[Hashable, list[int]] = {}
        for i in torch.randperm(len(self.keys), generator=self.generator).tolist():
            buckets.setdefault(self.keys[i], []).append(i)
        batches, rest = [], []
        for members in buckets.values():
            full = len(members) - len(members) % bs
            batches += [members[j:j + bs] for j in range(0, full, bs)]
            rest += members[full:]
        batches += [rest[j:j + bs] for j in range(0, len(rest), bs)]
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


class IndexedPairCollator(PairCollator):
    """``PairCollator`` over pair indices (the per-row path, ``dpo.shared_prompt=false``)."""

    def __init__(self, tokenizer, max_length: int, pairs: Sequence[PreferencePair]) -> None:
        super().__init__(tokenizer, max_length)
        self.pairs = list(pairs)

    def __call__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:  # type: ignore[override]
        batch = super().__call__([self.pairs[int(i)] for i in indices])
        batch["index"] = torch.tensor([int(i) for i in indices], dtype=torch.long)
        return batch
