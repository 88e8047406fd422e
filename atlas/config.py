"""Checks a composed config before anything expensive starts, with errors that name the fix.

Hydra already rejects unknown groups/options and keys that do not exist; these checks cover
values that are well-formed YAML but wrong for ATLAS.
"""

from __future__ import annotations

from omegaconf import DictConfig

from atlas.tasks import TASKS


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field and the fix."""


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = cfg
    for part in key.split("."):
        value = value[part]
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {list(allowed)}; "
                          f"override it, e.g. `{key}={allowed[0]}`")


def _positive(cfg: DictConfig, key: str) -> None:
    value = cfg
    for part in key.split("."):
        value = value[part]
    if not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{key}={value!r} must be a positive number")


def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` on the first invalid value."""
    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name={cfg.task.name!r} is unknown; known tasks: {sorted(TASKS)}")
    _choice(cfg, "method.reference", ("fixed", "adaptive"))
    _choice(cfg, "model.source", ("smollm2", "tiny", "hf"))
    _choice(cfg, "device", ("auto", "cpu", "cuda"))
    _choice(cfg, "gate.score_mode", ("offline", "online"))
    for key in ("explore.islands", "explore.rounds", "explore.phase_every",
                "explore.samples_per_prompt", "explore.max_new_tokens", "explore.workers",
                "dpo.beta", "dpo.lr", "dpo.epochs", "dpo.batch_size", "gate.subset_size"):
        _positive(cfg, key)
    if cfg.method.reference == "fixed" and cfg.method.gate:
        raise ConfigError("method.gate=true needs method.reference=adaptive (a fixed reference "
                          "is never promoted)")
    if len(cfg.explore.temperatures) < cfg.explore.islands:
        raise ConfigError(f"explore.temperatures has {len(cfg.explore.temperatures)} values for "
                          f"explore.islands={cfg.explore.islands}; give one temperature per island")
    if cfg.explore.islands_per_round > cfg.explore.islands:
        raise ConfigError("explore.islands_per_round must be <= explore.islands")
    if cfg.model.source == "hf" and not cfg.model.name_or_path:
        raise ConfigError("model.source=hf needs model.name_or_path (a local folder or hub id)")
