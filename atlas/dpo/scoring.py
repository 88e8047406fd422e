"""Forward passes of the Policy Inspector: length-normalised log-probs and token-level KL.

One pass serves every number the gate needs. Sequences (each gate item's evaluated
completions and its preferred completion) are batched by length; per batch the reference
runs once and each candidate policy runs once, so |C_k| candidates cost 1 + |C_k| forwards
per sequence and the reference's full-vocabulary log-probs never outlive their batch.

A *policy spec* names the policy a forward uses: ``"fixed"`` (adapters disabled, the base
model), ``"ref"``/``"adaptive"`` (the ``ref`` adapter), ``"policy"`` (the policy adapter as
it was on entry) or a state dict (loaded into the *policy* adapter for the pass). The
``ref`` adapter is only ever read; the policy adapter is restored bit for bit on exit.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from atlas.agent.adapters import POLICY, REF, adapter, get_adapter_state, set_adapter_state
from atlas.dpo.batching import _pad_id, collate, encode
from atlas.dpo.logprobs import completion_logits
from atlas.types import GateItem

PolicySpec = str | dict  # "fixed" | "ref" | "adaptive" | "policy" | adapter state dict
_NAMED = ("fixed", "ref", "adaptive", "policy")


def check_spec(spec: PolicySpec, what: str) -> PolicySpec:
    """Fail early, naming the argument, on a policy spec we cannot run."""
    if isinstance(spec, dict):
        if not spec or not all(isinstance(v, torch.Tensor) for v in spec.values()):
            raise TypeError(f"{what}: an adapter state must map names to tensors "
                            "(use get_adapter_state or PolicyCandidate.state)")
        return spec
    if spec not in _NAMED:
        raise ValueError(f"{what} must be one of {_NAMED} or an adapter state dict, got {spec!r}")
    return spec


def check_items(items: Sequence[GateItem], need_scores: bool) -> None:
    """Validate gate items; failed completions must already carry a finite floor score."""
    if not items:
        raise ValueError("items: the gate needs at least one GateItem (gate.subset_size >= 1)")
    for i, item in enumerate(items):
        if not isinstance(item, GateItem):
            raise TypeError(f"items[{i}] must be an atlas.types.GateItem, got {type(item).__name__}")
        if not need_scores:
            continue
        if not item.completions:
            raise ValueError(f"items[{i}].completions is empty; drop the item or add its evaluated "
                             "completions")
        if len(item.completions) != len(item.scores):
            raise ValueError(f"items[{i}]: {len(item.completions)} completions but "
                             f"{len(item.scores)} scores; they must align")
        bad = [s for s in item.scores if not math.isfinite(float(s))]
        if bad:
            raise ValueError(f"items[{i}].scores holds {bad[0]!r}; give failed completions a "
                             "finite floor score")


@dataclass
class GatePass:
    """Numbers per policy (in the order given): per item, per completion mean log-probs;
    per item, token-average KL(policy || reference) on the preferred completion."""

    mean_logps: list[list[list[float]]]
    ref_mean_logps: list[list[float]] | None
    kl: list[list[float]] | None


@contextlib.contextmanager
def _running(model, spec: PolicySpec, original: dict) -> Iterator[None]:
    if isinstance(spec, dict) or spec == "policy":
        set_adapter_state(model, POLICY, original if spec == "policy" else spec)
        with adapter(model, POLICY):
            yield
    elif spec in ("ref", "adaptive"):
        with adapter(model, REF):
            yield
    else:
        with adapter(model, None):
            yield


@contextlib.contextmanager
def running_policy(model, spec: PolicySpec) -> Iterator[None]:
    """Run a block under the policy ``spec`` names; the policy adapter is restored on exit
    (used by the on-line inspector, which samples from each candidate of C_k)."""
    spec = check_spec(spec, "policy")
    original = get_adapter_state(model, POLICY)
    try:
        with _running(model, spec, original):
            yield
    finally:
        set_adapter_state(model, POLICY, original)


@torch.no_grad()
def gate_pass(model, tokenizer, items: Sequence[GateItem], policies: Sequence[PolicySpec], *,
              kl_reference: PolicySpec | None, need_scores: bool = True, batch_size: int = 8,
              max_length: int = 768) -> GatePass:
    """Run every policy (and the KL reference) over the gate sequences, batch by batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_items(items, need_scores)
    policies = [check_spec(s, f"policies[{i}]") for i, s in enumerate(policies)]
    if kl_reference is not None:
        check_spec(kl_reference, "reference")
    # the sequences: every completion (scores) and each item's preferred completion (KL)
    seqs: list[tuple[int, int]] = []  # (item, completion index; -1 = preferred only)
    pref_seq: dict[int, int] = {}
    for i, item in enumerate(items):
        if need_scores:
            for j in range(len(item.completions)):
                seqs.append((i, j))
        if kl_reference is not None:
            hit = item.completions.index(item.preferred) \
                if need_scores and item.preferred in item.completions else -1
            if hit >= 0:
                pref_seq[i] = seqs.index((i, hit))
            else:
                pref_seq[i] = len(seqs)
                seqs.append((i, -1))
    texts = [items[i].completions[j] if j >= 0 else items[i].preferred for i, j in seqs]
    enc = [encode(tokenizer, items[i].prompt, t, max_length) for (i, _), t in zip(seqs, texts)]
    order = sorted(range(len(seqs)), key=lambda s: len(enc[s].ids))
    kl_rows = set(pref_seq.values())

    n_pol = len(policies)
    mean = [[[math.nan] * len(it.completions) for it in items] for _ in range(n_pol)]
    ref_mean = [[math.nan] * len(it.completions) for it in items]
    kl = [[math.nan] * len(items) for _ in range(n_pol)]
    seq_to_item = {s: i for i, s in pref_seq.items()}

    original = get_adapter_state(model, POLICY)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            ids = order[start:start + batch_size]
            batch = collate([enc[s] for s in ids], _pad_id(tokenizer))
            ref_logsm = None
            sel = None
            if kl_reference is not None:
                with _running(model, kl_reference, original):
                    cl = completion_logits(model, batch)
                _store(mean_out=ref_mean, cl=cl, ids=ids, seqs=seqs)
                is_kl = torch.tensor([s in kl_rows for s in ids], device=cl.rows.device)
                sel = is_kl[cl.rows]
                ref_logsm = torch.log_softmax(cl.logits[sel].float(), dim=-1)
            for p, spec in enumerate(policies):
                with _running(model, spec, original):
                    cl = completion_logits(model, batch)
                _store(mean_out=mean[p], cl=cl, ids=ids, seqs=seqs)
                if ref_logsm is None or not bool(sel.any()):
                    continue
                logsm = torch.log_softmax(cl.logits[sel].float(), dim=-1)
                per_token = (logsm.exp() * (logsm - ref_logsm)).sum(-1)
                per_row = torch.zeros(cl.n_rows, dtype=per_token.dtype, device=per_token.device)
                per_row = per_row.index_add(0, cl.rows[sel], per_token)
                counts = torch.bincount(cl.rows[sel], minlength=cl.n_rows)
                for r, s in enumerate(ids):
                    if s in seq_to_item and int(counts[r]) > 0:
                        kl[p][seq_to_item[s]] = float(per_row[r] / counts[r])
    finally:
        set_adapter_state(model, POLICY, original)
        model.train(was_training)
    return GatePass(mean_logps=mean, ref_mean_logps=ref_mean if kl_reference is not None else None,
                    kl=kl if kl_reference is not None else None)


def _store(mean_out: list[list[float]], cl, ids: list[int], seqs: list[tuple[int, int]]) -> None:
    """Write each row's mean completion log-prob into ``mean_out[item][completion]``."""
    per_row = cl.per_row(cl.token_logps(), "mean")
    for r, s in enumerate(ids):
        i, j = seqs[s]
        if j >= 0:
            mean_out[i][j] = float(per_row[r])


def weighted_score(mean_logps: list[list[float]], items: Sequence[GateItem],
                   temperature: float = 1.0) -> float:
    """Inspector score: per item, softmax(mean log-probs / T)-weighted mean task score;
    then the mean over items."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    totals = []
    for lp, item in zip(mean_logps, items):
        w = torch.softmax(torch.tensor(lp, dtype=torch.float64) / temperature, dim=0)
        totals.append(float((w * torch.tensor(item.scores, dtype=torch.float64)).sum()))
    return sum(totals) / len(totals)


def mean_kl(per_item: list[float]) -> float:
    """Average the per-pair token-average KL over pairs (items with no tokens are skipped)."""
    vals = [v for v in per_item if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan
