"""Forward passes of the Policy Inspector: length-normalised log-probs and token-level KL.

One pass serves every number the gate needs. Per gate item (a prompt with its evaluated
completions and its preferred completion) the reference runs once and each candidate policy
runs once, and each run computes the prompt once for all the item's completions
(``atlas.dpo.prefix``), so |C_k| candidates cost 1 + |C_k| prompt passes per item and the
reference's full-vocabulary log-probs never outlive their item. A prompt and its
completions share one cut to ``max_length`` (the prompt loses tokens from the left).

A *policy spec* (``PolicySpec``) names the weights a forward uses. The ``ref`` adapter is
only ever read; the policy adapter is restored bit for bit on exit.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from atlas.agent.adapters import POLICY, REF, adapter, get_adapter_state, set_adapter_state
from atlas.agent.fastlinear import packed_linears
from atlas.agent.precision import native_bf16
from atlas.dpo.prefix import PromptGroup, completion_logits, encode_group
from atlas.dpo.rules import BOUNDS, SCALES
from atlas.types import GateItem, ReferenceMode


@dataclass(frozen=True)
class PolicySpec:
    """The weights a forward pass runs, one tag each: ``BASE`` (adapters disabled: the fixed
    reference), ``REFERENCE`` (the ``ref`` adapter: the adaptive reference), ``POLICY_NOW``
    (the policy adapter as it was on entry) or ``PolicySpec.of(state)`` (an adapter state,
    e.g. a candidate of C_k, loaded into the policy adapter for the pass)."""

    kind: Literal["base", "ref", "policy", "state"]
    state: dict[str, torch.Tensor] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> "PolicySpec":
        if not isinstance(state, dict) or not state \
                or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise TypeError("an adapter state must map names to tensors (use "
                            "get_adapter_state or PolicyCandidate.state)")
        return cls("state", state)

    @classmethod
    def reference(cls, mode: ReferenceMode | str) -> "PolicySpec":
        """The reference of ``method.reference``: the ``ref`` adapter or the base model."""
        return REFERENCE if ReferenceMode.parse(mode) == ReferenceMode.ADAPTIVE else BASE

    @property
    def adapter(self) -> str | None:
        """The adapter that runs while this spec is in force (None: adapters disabled)."""
        return {"base": None, "ref": REF}.get(self.kind, POLICY)


BASE, REFERENCE, POLICY_NOW = PolicySpec("base"), PolicySpec("ref"), PolicySpec("policy")


def check_spec(spec: PolicySpec, what: str) -> PolicySpec:
    """Fail early, naming the argument, on a policy spec we cannot run."""
    if not isinstance(spec, PolicySpec):
        raise TypeError(f"{what} must be a PolicySpec (BASE, REFERENCE, POLICY_NOW or "
                        f"PolicySpec.of(state)), got {type(spec).__name__}")
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
    """Numbers per policy (in the order given): per item, per completion mean and summed
    (sequence) log-probs; per item, token-average KL(policy || reference) on the preferred
    completion. The reference's log-probs are given when a KL reference was run."""

    mean_logps: list[list[list[float]]]
    ref_mean_logps: list[list[float]] | None
    kl: list[list[float]] | None
    sum_logps: list[list[list[float]]] = field(default_factory=list)
    ref_sum_logps: list[list[float]] | None = None


@contextlib.contextmanager
def _running(model, spec: PolicySpec, original: dict) -> Iterator[None]:
    if spec.adapter == POLICY:
        set_adapter_state(model, POLICY, spec.state if spec.kind == "state" else original)
    with adapter(model, spec.adapter):
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
              kl_reference: PolicySpec | None, need_scores: bool = True,
              max_length: int = 768, padded: bool = False) -> GatePass:
    """Run every policy (and the KL reference) over the gate items, item by item: each item's
    prompt runs once per policy and each distinct completion after it, one unpadded row each
    (``atlas.dpo.prefix``); the reference's full-vocabulary log-probs live for one item only.

    Two savings: a completion written twice (the same program sampled again) runs once (bit
    for bit), and on a CPU with native bf16 the frozen base weights run pre-packed
    (``packed_linears(merge_lora=False)``: peft's LoRA terms untouched). Packed bf16 layers
    match plain ones bit for bit on small shapes but not over SmolLM2's long prompts (up to
    ~1.4 nats in a sequence's log-prob), so every policy and the reference run packed alike:
    the ratios the gate reads compare like with like. ``padded``: an item's completions run
    as one padded batch (``gate.padded``; the same numbers within float rounding)."""
    check_items(items, need_scores)
    policies = [check_spec(s, f"policies[{i}]") for i, s in enumerate(policies)]
    if kl_reference is not None:
        check_spec(kl_reference, "reference")
    n_pol = len(policies)
    mean = [[[math.nan] * len(it.completions) for it in items] for _ in range(n_pol)]
    ref_mean = [[math.nan] * len(it.completions) for it in items]
    total = [[[math.nan] * len(it.completions) for it in items] for _ in range(n_pol)]
    ref_total = [[math.nan] * len(it.completions) for it in items]
    kl = [[math.nan] * len(items) for _ in range(n_pol)]

    original = get_adapter_state(model, POLICY)
    was_training = model.training
    model.eval()
    try:
        with packed_linears(model, enabled=native_bf16(), merge_lora=False):
            for i, item in enumerate(items):
                scored = list(item.completions) if need_scores else []
                texts = list(dict.fromkeys(scored))  # each distinct completion once
                slots = [texts.index(t) for t in scored]
                pref = None
                if kl_reference is not None:
                    if item.preferred not in texts:
                        texts.append(item.preferred)
                    pref = texts.index(item.preferred)
                group = encode_group(tokenizer, item.prompt, texts, max_length)
                ref_logsm = None
                if kl_reference is not None:
                    with _running(model, kl_reference, original):
                        ref_logsm = _item_pass(model, group, slots, ref_mean[i], pref,
                                               ref_total[i], padded)
                for p, spec in enumerate(policies):
                    with _running(model, spec, original):
                        logsm = _item_pass(model, group, slots, mean[p][i], pref, total[p][i],
                                           padded)
                    if ref_logsm is not None and logsm is not None and logsm.shape[0] > 0:
                        kl[p][i] = float((logsm.exp() * (logsm - ref_logsm)).sum(-1).mean())
    finally:
        set_adapter_state(model, POLICY, original)
        model.train(was_training)
    has_ref = kl_reference is not None
    return GatePass(mean_logps=mean, ref_mean_logps=ref_mean if has_ref else None,
                    kl=kl if has_ref else None, sum_logps=total,
                    ref_sum_logps=ref_total if has_ref else None)


def _item_pass(model, group: PromptGroup, slots: list[int], mean_out: list[float],
               pref: int | None, sum_out: list[float], padded: bool = False
               ) -> torch.Tensor | None:
    """One policy over one item: each scored completion's mean and summed log-prob into
    ``mean_out`` and ``sum_out`` (completion j is the group's ``slots[j]``) and, when ``pref``
    is given, the log-softmax over the vocabulary at the preferred completion's tokens (T, V)."""
    pref_logsm = None
    means: dict[int, float] = {}
    sums: dict[int, float] = {}
    needed = set(slots)
    for k, (logits, ids) in enumerate(completion_logits(model, group, padded)):
        logsm = torch.log_softmax(logits, dim=-1)
        if k in needed:
            token_lp = logsm.gather(-1, ids[:, None])
            means[k] = float(token_lp.mean())
            sums[k] = float(token_lp.double().sum())
        if k == pref:
            pref_logsm = logsm
    for j, k in enumerate(slots):
        mean_out[j], sum_out[j] = means[k], sums[k]
    return pref_logsm


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


@dataclass
class GainEstimate:
    """The inspector score of one policy against the reference on G_k, in normalised score
    units (``GateConfig.scale``: by default 0 = G_k's worst evaluated score, 1 = its best).

    ``score`` S(pi): per item, the self-normalised importance-sampling estimate of pi's
    expected normalised score over the item's evaluated completions (weights
    ``softmax((log pi(y) - log ref(y)) / T)``, sequence log-probs); mean over items.
    ``ref_score`` S(ref): the same with ratio 1, i.e. the mean normalised score.
    ``lower``: one-sided bootstrap lower bound of ``gain`` at ``confidence`` (completions
    resampled within each item, the same resamples for pi and the reference: paired; read
    off the replicates by ``lower_bound``).
    ``se``: the bootstrap standard deviation of ``gain``. ``items``: informative items (an
    item whose completions all score alike carries no preference and is left out).
    ``completions``: theirs in all; ``bound``: how ``lower`` was read off the resamples.
    """

    score: float
    ref_score: float
    gain: float
    lower: float
    se: float
    items: int
    completions: int = 0  # the informative items' completions the bound was resampled from
    bound: str = ""  # the bound used: ``bound``, or "percentile" below ``bc_min_completions``


def normalised_scores(items: Sequence[GateItem], scale: str = "subset"
                      ) -> list[list[float] | None]:
    """Per item, its completions' scores in the inspector's unit (``GateConfig.scale``):
    "subset" maps G_k's worst score to 0 and its best to 1; "item" maps each item's own
    worst to 0 and best to 1. None for an item whose completions all score alike (it
    carries no preference)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)} (gate.scale), got {scale!r}")
    every = [float(s) for item in items for s in item.scores]
    g_lo, g_hi = (min(every), max(every)) if every else (0.0, 0.0)
    out: list[list[float] | None] = []
    for item in items:
        lo, hi = min(item.scores), max(item.scores)
        if not hi > lo:
            out.append(None)
            continue
        if scale == "subset":
            lo, hi = g_lo, g_hi
        out.append([(float(s) - lo) / (hi - lo) for s in item.scores])
    return out


def lower_bound(resampled: torch.Tensor, estimate: float, confidence: float,
                bound: str = "bc") -> float:
    """One-sided lower confidence bound of ``estimate`` from its bootstrap replicates
    (``GateConfig.bound``). "bc" (bias-corrected percentile, Efron 1981): the quantile at
    Phi(2 z0 - z_c), z0 = Phi^-1(share of replicates below the estimate, ties counted half),
    which undoes the bootstrap's median bias; "percentile": the (1 - confidence) quantile;
    "normal": estimate - z_c * SD(replicates)."""
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {list(BOUNDS)} (gate.bound), got {bound!r}")
    normal = torch.distributions.Normal(0.0, 1.0)
    z_c = float(normal.icdf(torch.tensor(confidence, dtype=torch.float64)))
    b = resampled.double()
    if bound == "normal":
        return estimate - z_c * (float(b.std()) if b.numel() > 1 else 0.0)
    level = 1.0 - confidence
    if bound == "bc":
        n = b.numel()
        below = float((b < estimate).double().mean() + 0.5 * (b == estimate).double().mean())
        below = min(max(below, 1.0 / (n + 1)), n / (n + 1))  # a finite z0
        z0 = float(normal.icdf(torch.tensor(below, dtype=torch.float64)))
        level = float(normal.cdf(torch.tensor(2.0 * z0 - z_c, dtype=torch.float64)))
    return float(torch.quantile(b, level))


def importance_gain(sum_logps: list[list[float]], ref_sum_logps: list[list[float]],
                    items: Sequence[GateItem], *, temperature: float = 1.0,
                    confidence: float = 0.9, resamples: int = 1000, seed: int = 0,
                    scale: str = "subset", bound: str = "bc", bc_min_completions: int = 32
                    ) -> GainEstimate:
    """S(pi), S(ref), their gain and its paired bootstrap lower bound (``GainEstimate``).

    ``sum_logps`` / ``ref_sum_logps``: per item, per completion sequence log-probs of the
    policy and of the reference (``GatePass.sum_logps[p]``, ``GatePass.ref_sum_logps``).
    Deterministic for a given ``seed`` (the bootstrap's generator). ``scale``, ``bound`` and
    ``bc_min_completions``: the ``GateConfig`` fields (with fewer informative completions
    than that, "bc" falls back to the conservative "percentile").
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature} (gate.temperature)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence} (gate.confidence)")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples} (gate.resamples)")
    gen = torch.Generator().manual_seed(int(seed))
    s_pol, s_ref, boot, n = [], [], [], 0
    for lp, rlp, u in zip(sum_logps, ref_sum_logps, normalised_scores(items, scale)):
        if u is None:
            continue
        r = torch.tensor(lp, dtype=torch.float64) - torch.tensor(rlp, dtype=torch.float64)
        uu = torch.tensor(u, dtype=torch.float64)
        ok = torch.isfinite(r)
        r, uu = r[ok] / temperature, uu[ok]
        if r.numel() == 0:
            continue
        n += r.numel()
        s_pol.append(float((torch.softmax(r, 0) * uu).sum()))
        s_ref.append(float(uu.mean()))
        idx = torch.randint(r.numel(), (resamples, r.numel()), generator=gen)
        rb, ub = r[idx], uu[idx]
        boot.append((torch.softmax(rb, 1) * ub).sum(1) - ub.mean(1))
    if not s_pol:
        nan = math.nan
        return GainEstimate(nan, nan, nan, nan, nan, 0)
    score, ref_score = sum(s_pol) / len(s_pol), sum(s_ref) / len(s_ref)
    gains = torch.stack(boot).mean(0)
    used = "percentile" if bound == "bc" and n < bc_min_completions else bound
    lower = lower_bound(gains, score - ref_score, confidence, used)
    return GainEstimate(score=score, ref_score=ref_score, gain=score - ref_score,
                        lower=lower, se=float(gains.std()) if resamples > 1 else 0.0,
                        items=len(s_pol), completions=n, bound=used)
