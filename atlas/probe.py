"""The learning probe: did a phase make the agent write better programs for prompts it never
trained on?

Training loss and training accuracy say only that DPO fitted D_k. The probe asks the agent
itself, before and after every trained phase of a DPO method:

1. **Prompts the phase never trained on** (``choose_prompts``), chosen before D_k is built:
   the next prompt of each island in the order the following rounds serve them (the prompts
   the agent faces next), skipping any prompt the phase itself sampled, since D_k and G_k
   are built from exactly those; then, if too few remain, prompts of the same form from
   random parent sets of the database's passed programs. No critique is shown, so every
   method is probed alike.
2. **Fresh programs, before and after, with the same seeds**: ``probe.samples`` completions
   per prompt from the policy as it enters the phase and again from the policy it leaves
   with, the same random numbers both times (common random numbers: a difference comes from
   the policy, not the sampler). They are scored in the sandbox under the phase's last task
   context and filed nowhere: not in the database, D_k, G_k, any later phase, or the budget.
3. **Measures** (``record``): valid rate, mean and best score before and after, with paired
   95 % intervals of the change per sample slot (a failure counts at the phase's failure
   floor in the score change); KL(policy || base) and KL(policy || reference) per token on
   the "before" completions; the trained policy's preference accuracy and margin on every
   pair those completions support (``atlas.dpo.heldout``), against the reference it was
   trained against.

A method that never fine-tunes runs no phase and so no probe; a skipped phase has none.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from atlas.evolution.buffer import failure_floor
from atlas.evolution.evaluation import regime_key
from atlas.evolution.prompts import prompt_hash
from atlas.novelty import beats_parents, tally
from atlas.schema import ProbeConfig
from atlas.stats import binomial_p, bootstrap_interval, t_interval
from atlas.types import Evaluation, Program, ProgramSource

if TYPE_CHECKING:  # annotations only: the run's collaborators
    from atlas.evolution.explorer import Attempt, Explorer

#: the probe's sampling seeds are derived from the phase's seed and this salt, so they never
#: coincide with a round's (``Explorer._generation_seed``)
SEED_SALT = 7_919


def without_note(prompt: str) -> str:
    """A prompt less its reviewer note (``atlas.evolution.prompts``: one paragraph that
    ATLAS's prompts carry and the probe's never do)."""
    return re.sub(r"\n\nReviewer note: [^\n]*", "", prompt)


@dataclass(frozen=True)
class ProbePrompt:
    """A probe prompt: its text (no critique), where it came from, the parents it shows, and
    how many of them the phase itself wrote (``overlap``: 0 unless no other prompt could be
    found; D_k's chosen programs are among the phase's)."""

    text: str
    where: str
    parents: tuple[Program, ...]
    overlap: int


def choose_prompts(explorer: Explorer, programs: Sequence[Program], n: int, next_round: int,
                   seed: int) -> list[ProbePrompt]:
    """Up to ``n`` probe prompts (rules in the module docstring, item 1). A prompt the phase
    sampled is recognised by its parents, not its text (ATLAS's prompts also carry a
    reviewer note the probe's never do); prompts whose parents the phase did not write come
    first, so what DPO made more likely is not shown as a parent. The same prompt text less
    its reviewer note is also refused (programs filed without parents)."""
    k = explorer.settings.programs_in_prompt
    sampled = {frozenset(p.parents) for p in programs if p.prompt and p.parents}
    sampled_text = {without_note(p.prompt) for p in programs if p.prompt}
    mine = {p.id for p in programs}
    chosen: list[ProbePrompt] = []

    def offer(parents: list[Program], where: str, overlap_ok: bool) -> None:
        overlap = sum(1 for q in parents if q.id in mine)
        if len(chosen) >= n or not parents or (overlap and not overlap_ok) \
                or frozenset(q.id for q in parents) in sampled:
            return
        text = explorer.prompt_for(parents)
        if without_note(text) not in sampled_text and all(text != c.text for c in chosen):
            chosen.append(ProbePrompt(text, where, tuple(parents), overlap))

    islands: list[int] = []
    r = next_round
    while len(islands) < explorer.settings.islands and r < next_round + 10 * explorer.settings.islands:
        islands += [i for i in explorer.islands_for_round(r) if i not in islands]
        r += 1
    passed = [p for p in explorer.db.all_programs()
              if p.passed and math.isfinite(p.score) and p.source != ProgramSource.RESCORE]
    older = [p for p in passed if p.id not in mine]
    for overlap_ok, pool in ((False, older), (True, passed)):
        for island in islands:
            offer(explorer.parents_for(island), f"island {island}", overlap_ok)
        rng = random.Random(seed)
        for _ in range(50 * n):
            if len(chosen) >= n or not pool:
                break
            offer(rng.sample(pool, min(k, len(pool))), "random parents", overlap_ok)
    return chosen


@dataclass
class Side:
    """One side of the probe (before or after): the attempts per prompt and their cost."""

    attempts: list[list[Attempt]]
    seconds: float

    def flat(self) -> list[Attempt]:
        return [a for row in self.attempts for a in row]


def _passed(a: Attempt) -> bool:
    return a.evaluation.passed and math.isfinite(a.evaluation.score)


def side_stats(side: Side) -> dict[str, Any]:
    """Valid rate, mean and best score (over passed programs) and the failure kinds."""
    flat = side.flat()
    scores = [a.evaluation.score for a in flat if _passed(a)]
    kinds: dict[str, int] = {}
    for a in flat:
        kinds[a.evaluation.failure_kind] = kinds.get(a.evaluation.failure_kind, 0) + 1
    return {"valid_rate": len(scores) / len(flat) if flat else None,
            "mean_score": sum(scores) / len(scores) if scores else None,
            "best_score": max(scores) if scores else None,
            "failure_kinds": kinds, "seconds": side.seconds}


def paired_change(diffs: Sequence[float]) -> dict[str, Any]:
    """Mean paired change with its 95 % t interval and percentile bootstrap interval."""
    t = t_interval(diffs)
    lo, hi = bootstrap_interval(diffs)

    def clean(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None
    return {"n": int(t["n"]), "mean": clean(t["mean"]), "t_lo": clean(t["lo"]),
            "t_hi": clean(t["hi"]), "boot_lo": clean(lo), "boot_hi": clean(hi)}


def valid_change(before: Sequence[bool], after: Sequence[bool]) -> dict[str, Any]:
    """The valid rate's change over paired slots as counts: slots that went fail -> pass and
    pass -> fail, their mean change, and the exact sign (McNemar) p of the two counts. With
    6-8 binary slots a t interval is meaningless (it ran past +1); counts are not."""
    up = sum(1 for x, y in zip(before, after) if y and not x)
    down = sum(1 for x, y in zip(before, after) if x and not y)
    n = min(len(before), len(after))
    return {"n": n, "fail_to_pass": up, "pass_to_fail": down,
            "mean": (up - down) / n if n else None, "p": binomial_p(up, up + down)}


@dataclass
class LearningProbe:
    """One phase's probe: ``before()`` ahead of DPO, ``after()`` once the phase's policy is
    final, then ``record()`` measures and returns the phase event's ``probe`` field."""

    cfg: ProbeConfig
    explorer: Explorer
    prompts: list[ProbePrompt]
    context: dict[str, Any]
    floor: float
    seed: int
    sides: dict[str, Side] = field(default_factory=dict)

    @classmethod
    def for_phase(cls, cfg: ProbeConfig, explorer: Explorer, programs: list[Program],
                  seed: int) -> LearningProbe:
        """The probe of a phase whose programs are ``programs`` (its rounds' candidates)."""
        last_round = max((p.round for p in programs), default=0)
        prompts = choose_prompts(explorer, programs, cfg.prompts, last_round + 1, seed)
        return cls(cfg=cfg, explorer=explorer, prompts=prompts,
                   context=explorer.task.context(last_round),
                   floor=failure_floor([p for p in programs if p.source != ProgramSource.SEED]),
                   seed=(seed * 31 + SEED_SALT) % (2**31 - 1))

    def _write(self, when: str, known: dict[str, Evaluation] | None = None) -> None:
        from atlas.agent.adapters import POLICY  # deferred: peft is slow to import

        t0 = time.perf_counter()
        attempts = self.explorer.write_unfiled(
            [p.text for p in self.prompts], self.cfg.samples, temperature=self.cfg.temperature,
            seed=self.seed, context=self.context, adapter=POLICY,
            known=known) if self.prompts else []
        self.sides[when] = Side(attempts, time.perf_counter() - t0)

    def before(self) -> None:
        """The policy as it enters the phase writes the probe's programs."""
        self._write("before")

    def after(self) -> None:
        """The policy the phase leaves with writes them again, with the same seeds. A program
        it writes as it did before (common random numbers make that frequent when the phase
        moved it little) takes the "before" evaluation when that passed: the sandbox scores a
        program's code deterministically on one task context."""
        known = {a.code: a.evaluation for a in self.sides["before"].flat()
                 if a.code and _passed(a)}
        self._write("after", known)

    def record(self, model: Any, tokenizer: Any, *, reference_state: dict | None, beta: float,
               max_length: int) -> dict[str, Any]:
        """The ``probe`` field of the phase event (module docstring, item 3).

        ``reference_state``: the ``ref`` adapter's tensors as the phase began (None: the
        reference is the base model, as EvoTune's; a state that adds nothing runs as the base); ``beta``: the phase's DPO beta."""
        # deferred: torch (a run without DPO never loads it)
        from atlas.agent.adapters import adds_nothing
        from atlas.dpo.heldout import comparable_pairs, measure
        from atlas.dpo.scoring import BASE, POLICY_NOW, PolicySpec

        t0 = time.perf_counter()
        before, after = self.sides["before"], self.sides["after"]
        out: dict[str, Any] = {
            "prompts": len(self.prompts), "samples": self.cfg.samples,
            "temperature": self.cfg.temperature, "seed": self.seed,
            "prompt_hashes": [prompt_hash(p.text) for p in self.prompts],
            "prompt_sources": [p.where for p in self.prompts],
            "prompt_parents": [[q.id for q in p.parents] for p in self.prompts],
            "parents_from_phase": [p.overlap for p in self.prompts],
            "before": {**side_stats(before), "novelty": self._novelty(before)},
            "after": {**side_stats(after), "novelty": self._novelty(after)}}
        b, a = before.flat(), after.flat()
        out["change"] = {
            "valid_rate": valid_change([_passed(x) for x in b], [_passed(y) for y in a]),
            "score": paired_change([self._floored(y) - self._floored(x) for x, y in zip(b, a)]),
            "failure_floor": self.floor}
        out["slots"] = [[_slot(x), _slot(y)] for x, y in zip(b, a)]
        groups = [(p.text, [x.completion for x in row])
                  for p, row in zip(self.prompts, before.attempts)]
        # a reference that adds nothing to the base (the first phase's) is the base: one
        # pass fewer, and its KLs are the same numbers
        reference = (BASE if reference_state is None or adds_nothing(reference_state)
                     else PolicySpec.of(reference_state))
        moved = measure(model, tokenizer, groups, policy=POLICY_NOW, reference=reference,
                        base=BASE, max_length=max_length)
        rows = before.attempts
        pairs = comparable_pairs([[_passed(x) for x in row] for row in rows],
                                 [[x.evaluation.score for x in row] for row in rows],
                                 [[x.completion for x in row] for row in rows])
        margins = moved.margins(pairs, beta)
        out["kl_base"] = _finite(moved.mean_kl_base)
        out["kl_reference"] = _finite(moved.mean_kl_reference)
        out["kl_tokens"] = moved.tokens
        right = sum(m > 0 for m in margins)
        out["heldout"] = {
            "pairs": len(pairs), "beta": beta, "right": right,
            "accuracy": right / len(margins) if margins else None,
            "p": binomial_p(right, len(margins)),
            "margin": sum(margins) / len(margins) if margins else None}
        out["seconds"] = {"before": before.seconds, "after": after.seconds,
                          "measure": time.perf_counter() - t0}
        out["seconds"]["total"] = sum(out["seconds"].values())
        return out

    def _novelty(self, side: Side) -> dict[str, Any]:
        """``atlas.novelty.tally`` of one side's programs against the database and each
        prompt's parents: does the policy write new programs or its prompt's?"""
        db = self.explorer.db
        records = []
        for prompt, row in zip(self.prompts, side.attempts):
            for a in row:
                score = a.evaluation.score if _passed(a) else None
                behaviour = a.evaluation.behaviour if _passed(a) else None
                regime = regime_key(self.context)
                records.append({"novelty": db.novelty.label(a.code, score, regime, prompt.parents,
                                                             behaviour),
                                "beats_parents": beats_parents(score, regime, prompt.parents),
                                "evaluation": {"passed": _passed(a)}})
        return tally(records)

    def _floored(self, a: Attempt) -> float:
        return a.evaluation.score if _passed(a) else self.floor


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _slot(a: Attempt) -> list[Any]:
    """A sample's outcome, compactly: passed, score (None when failed), failure kind."""
    return [_passed(a), a.evaluation.score if _passed(a) else None, a.evaluation.failure_kind]
