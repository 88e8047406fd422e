"""How far a trained policy moved, and whether its preferences hold on pairs it never saw.

The learning probe (``atlas.probe``) asks two questions of a phase's trained policy that
training loss cannot answer, both on completions of prompts the phase did not train on:

- **KL per token** to the base model and to the phase's reference: teacher-forced on the
  completions, full-vocabulary KL(policy || q) at every completion token (prompt tokens
  masked), averaged over a completion's tokens, then over completions (the gate's Eq. 3
  estimator, on every completion instead of each prompt's preferred one);
- **held-out preference accuracy and margin**: DPO's implicit reward margin
  ``beta * [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]`` (sequence
  log-probs) of every held-out pair; accuracy is the share with a margin above zero.

Every policy runs on the same kernels (pre-packed bf16 weights where the CPU has native
bf16, as the gate does), so the differences compare like with like.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from atlas.agent.fastlinear import packed_linears
from atlas.agent.precision import native_bf16
from atlas.dpo.prefix import completion_logits, encode_group
from atlas.dpo.scoring import PolicySpec, check_spec, running_policy


@dataclass(frozen=True)
class HeldOutPair:
    """A preference on a held-out prompt: completion ``chosen`` of prompt ``prompt`` scored
    above completion ``rejected`` (indices into ``measure``'s groups)."""

    prompt: int
    chosen: int
    rejected: int


@dataclass
class Movement:
    """What ``measure`` found: per prompt, per completion, the policy's and the reference's
    sequence log-probs and the policy's token-average KL to the reference and to the base."""

    policy_logps: list[list[float]]
    reference_logps: list[list[float]]
    kl_reference: list[list[float]]
    kl_base: list[list[float]]
    tokens: int

    @staticmethod
    def _mean(rows: list[list[float]]) -> float:
        vals = [v for row in rows for v in row if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else math.nan

    @property
    def mean_kl_reference(self) -> float:
        """KL(policy || reference), nats per token, averaged over completions."""
        return self._mean(self.kl_reference)

    @property
    def mean_kl_base(self) -> float:
        """KL(policy || base), nats per token, averaged over completions."""
        return self._mean(self.kl_base)

    def margins(self, pairs: Sequence[HeldOutPair], beta: float) -> list[float]:
        """DPO's implicit reward margin of each pair under ``beta``."""
        out = []
        for p in pairs:
            pol, ref = self.policy_logps[p.prompt], self.reference_logps[p.prompt]
            out.append(beta * ((pol[p.chosen] - ref[p.chosen])
                               - (pol[p.rejected] - ref[p.rejected])))
        return out


def _logsm(model: torch.nn.Module, group, spec: PolicySpec
           ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per completion of ``group``, one at a time: log-softmax over the vocabulary at each of
    its tokens (L, V) and its ids (L,), under ``spec``."""
    with running_policy(model, spec):
        for logits, ids in completion_logits(model, group):
            yield torch.log_softmax(logits, dim=-1), ids


def _kl(p_logsm: torch.Tensor, q_logsm: torch.Tensor) -> float:
    return float((p_logsm.exp() * (p_logsm - q_logsm)).sum(-1).mean())


def _seq(logsm: torch.Tensor, ids: torch.Tensor) -> float:
    return float(logsm.gather(-1, ids[:, None]).double().sum())


def _against(model: torch.nn.Module, group, spec: PolicySpec, pol: list[torch.Tensor]
             ) -> tuple[list[float], list[float]]:
    """``spec``'s sequence log-prob of each completion and the policy's KL to it (``pol``:
    the policy's log-softmax per completion); one completion's tensors live at a time."""
    seqs, kls = [], []
    for (q, ids), p in zip(_logsm(model, group, spec), pol):
        seqs.append(_seq(q, ids))
        kls.append(_kl(p, q))
    return seqs, kls


@torch.no_grad()
def measure(model: torch.nn.Module, tokenizer, groups: Sequence[tuple[str, Sequence[str]]], *,
            policy: PolicySpec, reference: PolicySpec, base: PolicySpec,
            max_length: int = 768) -> Movement:
    """The policy against the reference and the base on ``groups``, (prompt, completions)
    each: sequence log-probs of policy and reference, and the policy's token-average KL to
    both (rules in the module docstring). When the reference is the base model (a fixed
    reference) the base runs once, and a completion that appears twice in a group runs once
    (its numbers are repeated: every completion still counts in the means). The model's policy adapter and train mode are restored."""
    policy = check_spec(policy, "policy")
    reference = check_spec(reference, "reference")
    base = check_spec(base, "base")
    out = Movement([], [], [], [], 0)
    was_training = model.training
    model.eval()
    try:
        with packed_linears(model, enabled=native_bf16(), merge_lora=False):
            for prompt, completions in groups:
                if not completions:
                    for rows in (out.policy_logps, out.reference_logps, out.kl_reference,
                                 out.kl_base):
                        rows.append([])
                    continue
                # a completion sampled twice (frequent at low temperature) runs once
                distinct = list(dict.fromkeys(completions))
                at = [distinct.index(c) for c in completions]
                group = encode_group(tokenizer, prompt, distinct, max_length)
                pol, seqs, tokens = [], [], []
                for lp, ids in _logsm(model, group, policy):
                    pol.append(lp)
                    seqs.append(_seq(lp, ids))
                    tokens.append(int(ids.numel()))
                ref_seqs, kl_ref = _against(model, group, reference, pol)
                kl_base = (kl_ref if reference.kind == base.kind == "base"
                           else _against(model, group, base, pol)[1])
                out.tokens += sum(tokens[i] for i in at)
                out.policy_logps.append([seqs[i] for i in at])
                out.reference_logps.append([ref_seqs[i] for i in at])
                out.kl_reference.append([kl_ref[i] for i in at])
                out.kl_base.append([kl_base[i] for i in at])
    finally:
        model.train(was_training)
    return out


def comparable_pairs(passed: Sequence[Sequence[bool]], scores: Sequence[Sequence[float]],
                     completions: Sequence[Sequence[str]]) -> list[HeldOutPair]:
    """Every held-out preference the evaluations support: per prompt, each passed completion
    over each distinct completion of that prompt that failed or scored strictly lower (the
    relations D_k's pairs are drawn from, all of them rather than a top-k's)."""
    pairs = []
    for j, (ok, sc, texts) in enumerate(zip(passed, scores, completions)):
        for a in range(len(texts)):
            if not ok[a] or not math.isfinite(sc[a]):
                continue
            for b in range(len(texts)):
                if b == a or texts[b] == texts[a]:
                    continue
                if not ok[b] or not math.isfinite(sc[b]) or sc[b] < sc[a]:
                    pairs.append(HeldOutPair(j, a, b))
    return pairs
