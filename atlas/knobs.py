"""The DPO knobs the strategist may change, and their hard limits: defined here, once.

Everything else derives from this module: ``DPOConfig``'s default ``bounds`` and the check of
``dpo.bounds`` against the strategist's limits (``atlas.dpo.config``, ``atlas.config``), the
supporters' ``Knobs`` / ``KnobBounds`` schemas and the bounds sent to the strategist
(``atlas.supporters``), the phase record's list of changed knobs (``atlas.fine_tuning``), and
the per-knob intervention counts of ``results.json``, W&B and the report tables
(``atlas.results``, ``atlas.telemetry``, ``atlas.report``). ``conf/dpo/default.yaml``
documents the configured ``bounds``, which may only narrow ``HARD_BOUNDS``.

A leaf module (no atlas imports), so that any layer can read it without an import cycle.
"""

from __future__ import annotations

#: the strategist's knobs, in the order records and reports list them (Table 3 columns)
KNOBS: tuple[str, ...] = ("score_threshold", "epochs", "beta", "lr")

#: hard [low, high] limits of the bounded knobs (score_threshold is unbounded: any score)
HARD_BOUNDS: dict[str, tuple[float, float]] = {
    "beta": (0.01, 2.0),
    "lr": (1e-6, 1e-3),
    "epochs": (1, 5),
}

#: the strategist's default range of each bounded knob (``dpo.bounds``, which may only narrow
#: ``HARD_BOUNDS``): around ``conf/dpo/default.yaml``'s values, lr from a tenth of the default
#: up to it and at most 2 epochs. Why no higher lr: retrained from the main command's first
#: phase, twice the default lr (5e-4) collapsed the agent's valid rate from 0.69 to 0.06
#: (docs/results.md, "Does the agent learn?"); so did 2 epochs at the default (0.00), which
#: the strategist reaches only when DPO's accuracy falls under 0.6, and the gate rejects
DEFAULT_BOUNDS: dict[str, tuple[float, float]] = {
    "beta": (0.01, 2.0),
    "lr": (2.5e-5, 2.5e-4),
    "epochs": (1, 2),
}

#: knobs that take integer values (their bounds are integers too)
INTEGER_KNOBS: frozenset[str] = frozenset({"epochs"})

assert set(HARD_BOUNDS) < set(KNOBS) and set(DEFAULT_BOUNDS) == set(HARD_BOUNDS)
assert all(HARD_BOUNDS[k][0] <= lo <= hi <= HARD_BOUNDS[k][1]
           for k, (lo, hi) in DEFAULT_BOUNDS.items())
