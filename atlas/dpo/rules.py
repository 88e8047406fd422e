"""The gate's rules: which test accepts c* (``gate.rule``), in one place.

A rule is the Eq. 5 step of the gate: given c*'s gain, the gain's lower confidence bound and
its KL to the reference, it returns the verdict and its reason (``Verdict``). It reads only
the gate settings it names in ``reads`` (``judge`` hands it those and no others), so what a
method that never applies the gate ignores follows from the rules (``atlas.config``'s
``GATE_DECIDES``). The decision records the verdict and the reason; the supporters and the
run's summary read them (``GateDecision.reason``, ``explain``) and never test numbers against
epsilon or delta themselves. Torch-free: the config's schema reads ``RULES``' names.

To add a rule: subclass ``GateRule`` here and add it to ``RULES`` (docs/gate.md, "Adding a
gate rule or a method"; ``tests/test_extension_points.py`` checks each rule).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from atlas.types import INSUFFICIENT_EVIDENCE

#: the values of ``gate.bound`` and ``gate.scale`` (``atlas.dpo.scoring`` reads them), written
#: here only; ``gate.rule``'s are ``RULES``' names (``RuleName``)
Bound = Literal["bc", "percentile", "normal"]
Scale = Literal["subset", "item"]
BOUNDS: tuple[str, ...] = get_args(Bound)
SCALES: tuple[str, ...] = get_args(Scale)

#: the reasons a decision gives (``GateDecision.reason``). A rule's own: its verdicts. The
#: others are the gate's, before or instead of a rule: the method promotes every phase
#: (``DISABLED``), nothing was held out (``NO_ITEMS``), too thin a G_k (``INSUFFICIENT``).
ACCEPTED = "accepted"
NO_GAIN = "rejected: no gain"
KL_TOO_LARGE = "rejected: KL too large"
DISABLED = "accepted: gate disabled"
NO_ITEMS = "rejected: no held-out gate item"
INSUFFICIENT = INSUFFICIENT_EVIDENCE


@dataclass(frozen=True)
class Verdict:
    """A rule's answer for c*: promote or not, and why (one of the reasons above)."""

    accepted: bool
    reason: str


class GateRule(ABC):
    """One way to test c*. ``reads``: the ``GateConfig`` fields ``verdict`` reads."""

    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]

    @abstractmethod
    def verdict(self, *, gain: float, lower: float, kl: float,
                settings: Mapping[str, float]) -> Verdict:
        """c*'s verdict from its gain S(c*) - S(ref), that gain's lower confidence bound
        (the gain itself where none was measured) and KL(c* || ref); ``settings``: the
        fields named in ``reads``. A NaN number must fail its test."""

    @abstractmethod
    def explain(self, gate: Mapping[str, Any]) -> str:
        """The summary's words for a phase this rule decided and did not promote, from the
        recorded decision (a phase event's ``gate``: its ``reason`` and numbers)."""


class Eq5(GateRule):
    """Paper Eq. 5 with a confidence bound: accept iff the paired lower confidence bound of
    S(c*) - S(ref) is >= epsilon and KL(c* || ref) <= delta; both failing reads "no gain"."""

    name = "eq5"
    reads = ("epsilon", "delta")

    def verdict(self, *, gain: float, lower: float, kl: float,
                settings: Mapping[str, float]) -> Verdict:
        if not lower >= settings["epsilon"]:  # NaN fails too
            return Verdict(False, NO_GAIN)
        if not kl <= settings["delta"]:
            return Verdict(False, KL_TOO_LARGE)
        return Verdict(True, ACCEPTED)

    def explain(self, gate: Mapping[str, Any]) -> str:
        reason = gate.get("reason") or ""
        if reason == KL_TOO_LARGE:
            return f"{reason}: KL {gate.get('kl'):.3g} > delta {gate.get('delta')}"
        if gate.get("lower_bound") is not None:
            return (f"{reason}: lower bound {gate.get('lower_bound'):+.4g} < epsilon "
                    f"{gate.get('epsilon')}")
        return reason


#: every rule by its ``gate.rule`` name; the first is the default
RULES: dict[str, GateRule] = {rule.name: rule for rule in (Eq5(),)}
DEFAULT_RULE = next(iter(RULES))
RuleName = Literal[tuple(RULES)]  # type: ignore[valid-type]  # what the schema accepts


def rule(name: str) -> GateRule:
    """The rule ``gate.rule`` names (the schema has checked the name)."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"gate.rule={name!r} is not one of {sorted(RULES)}") from None


def judge(gate: Any, *, gain: float, lower: float, kl: float) -> Verdict:
    """The verdict of the rule ``gate.rule`` names on c*, handing it the settings it reads
    from ``gate`` (a ``GateConfig``) and no others: the one place a rule is applied."""
    r = rule(gate.rule)
    return r.verdict(gain=gain, lower=lower, kl=kl,
                     settings={f: getattr(gate, f) for f in r.reads})


def read_by_rules() -> tuple[str, ...]:
    """The gate settings some rule reads, each once, in rule order."""
    return tuple(dict.fromkeys(f for r in RULES.values() for f in r.reads))
