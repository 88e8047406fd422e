"""Numerical check of the paper's dynamic-regret theorem: ``python -m atlas.theory``."""

from atlas.theory.simulation import (
    FLOOR_METHOD,
    METHODS,
    TheoryConfig,
    drift_path,
    loglog_slope,
    simulate,
    sweep,
    total_variation,
    window_estimates,
)

__all__ = [
    "FLOOR_METHOD",
    "METHODS",
    "TheoryConfig",
    "drift_path",
    "loglog_slope",
    "simulate",
    "sweep",
    "total_variation",
    "window_estimates",
]
