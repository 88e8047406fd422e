"""Checks a composed config before anything expensive starts, with errors that name the fix.

Hydra already rejects unknown groups/options and keys that do not exist, but not keys added
with ``+`` (``+explore.roundz=3`` composes fine and would run with nothing reading it). These
checks cover such keys, fields the chosen options ignore, values outside their documented
bounds, and values that are well-formed YAML but wrong for ATLAS.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from atlas.fields import check_known_fields
from atlas.tasks import make_task, task_class
from atlas.types import ReferenceMode

log = logging.getLogger("atlas.config")

CONF = Path(__file__).resolve().parents[1] / "conf"
# sub-trees whose keys are validated by their consumer, not by the YAML schema
_OPEN = frozenset({"dpo.bounds"})  # any DPO knob; DPOConfig checks the names
_ROLE_BLOCKS = ("exploration", "strategist", "inspector")  # may repeat any supporters key


class ConfigError(ValueError, CompactHydraException):
    """A config value that cannot work; the message names the field and the fix.

    A ``CompactHydraException``: on the command line Hydra prints the message, not a traceback.
    """


def _get(cfg: DictConfig, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = value[part]
    return value


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = _get(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {list(allowed)}; "
                          f"override it, e.g. `{key}={allowed[0]}`")


def _positive(cfg: DictConfig, key: str) -> None:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{key}={value!r} must be a positive number")


def _typed(cfg: DictConfig, key: str, kind: type) -> None:
    """Top-level fields: ``seed=abc`` must fail naming ``seed``, not deep inside ``int()``."""
    value = _get(cfg, key)
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, kind) and not isinstance(value, bool))
    if not ok:
        example = {bool: "true", int: "0"}[kind]
        raise ConfigError(f"{key}={value!r} must be {'true or false' if kind is bool else 'an integer'}"
                          f"; set e.g. {key}={example}")


# -- known keys -------------------------------------------------------------------------------
def _merge(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    """Union of key trees (a key that is a mapping in any option stays a mapping)."""
    for key, value in data.items():
        if isinstance(value, Mapping):
            node = into.get(key)
            if not isinstance(node, dict):
                node = into[key] = {}
            _merge(node, value)
        else:
            into.setdefault(key, None)


@functools.lru_cache(maxsize=1)
def schema(conf: Path = CONF) -> dict[str, Any]:
    """Every key any option of ``conf/`` defines, as a tree (leaves are None).

    Why from the YAML files: they are the documentation of every field, so a key that none of
    them defines is read by nothing.
    """
    tree: dict[str, Any] = {}
    top = OmegaConf.to_container(OmegaConf.load(conf / "train.yaml"), resolve=False)
    _merge(tree, {k: v for k, v in top.items() if k not in ("defaults", "hydra")})
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "hydra"):
        for option in sorted(group.glob("*.yaml")):
            text = option.read_text()
            data = OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
            data.pop("defaults", None)
            if "@package _global_" in text:
                _merge(tree, data)
            else:
                _merge(tree.setdefault(group.name, {}), data)
    return tree


def _unknown(node: Mapping[str, Any], known: dict[str, Any], path: str) -> None:
    if path in _OPEN:
        return
    allowed = dict(known)
    if path.startswith("supporters.") and path.count(".") == 1 and path.split(".")[1] in _ROLE_BLOCKS:
        # a role block overrides the shared supporters keys (`+supporters.exploration.max_tokens=`)
        allowed.update({k: v for k, v in schema()["supporters"].items() if k not in _ROLE_BLOCKS})
    extra = [k for k in node if k not in allowed]
    if extra:
        close = difflib.get_close_matches(str(extra[0]), [str(k) for k in allowed], n=1)
        fix = f"; did you mean {path + '.' if path else ''}{close[0]}?" if close else ""
        added = f" (a key added with `+{path + '.' if path else ''}{extra[0]}=...` is read by nothing)"
        if not path:
            raise ConfigError(f"unknown top-level key(s) {sorted(map(str, extra))}: {extra[0]} is "
                              f"not a known field; remove it or use one of "
                              f"{sorted(map(str, allowed))}{fix}{added}")
        try:
            check_known_fields(allowed, node, path, hint=fix)
        except ValueError as exc:
            raise ConfigError(f"{exc}{added}") from None
    for key, value in node.items():
        if isinstance(value, Mapping) and isinstance(allowed.get(key), dict):
            _unknown(value, allowed[key], f"{path}.{key}" if path else str(key))


def check_known_keys(cfg: DictConfig) -> None:
    """ConfigError naming the first key that no option of ``conf/`` defines.

    A task with ``_target_`` may come from another package's config folder: its class checks
    its own fields (``Task(**cfg.task)`` fails naming an unknown one), not this schema.
    """
    node = OmegaConf.to_container(cfg, resolve=False)
    if isinstance(node.get("task"), Mapping) and "_target_" in node["task"]:
        node = {k: v for k, v in node.items() if k != "task"}
    _unknown(node, schema(), "")


# -- fields the chosen options ignore ------------------------------------------------------------
def check_ignored(cfg: DictConfig) -> None:
    """Settings nothing reads under the chosen options: an error where a value was clearly
    meant to take effect, a warning where a group's default merely stays in place."""
    source = cfg.model.source
    if source != "hf" and cfg.model.get("name_or_path"):
        raise ConfigError(f"model.name_or_path={cfg.model.name_or_path!r} is ignored with "
                          f"model.source={source}; set model.source=hf to load it, or drop it "
                          f"(model.name_or_path=null)")
    tiny_only = [k for k in ("hidden_size", "num_layers", "num_heads") if k in cfg.model]
    if source != "tiny" and tiny_only:
        log.warning("model.%s only apply to model.source=tiny; ignored with model.source=%s",
                    "/".join(tiny_only), source)
    if not cfg.method.supporters and cfg.supporters.get("backend") != "embedded":
        log.warning("supporters.backend=%s is ignored: method=%s runs no supporters (use "
                    "method=atlas)", cfg.supporters.get("backend"), cfg.method.name)


# -- values ----------------------------------------------------------------------------------------
def check_typed_groups(cfg: DictConfig) -> None:
    """Build the typed DPO and gate configs now (their errors name the field) and refuse DPO
    knobs outside ``dpo.bounds``: training would clamp them while the run's records said
    otherwise."""
    from atlas.dpo import DPOConfig, GateConfig

    try:
        dpo = DPOConfig.from_cfg(cfg.dpo)
        GateConfig.from_cfg(cfg.gate)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    if cfg.method.supporters:  # the strategist keeps every knob inside its hard limits
        from atlas.knobs import HARD_BOUNDS

        for name, (low, high) in dpo.bounds.items():
            hard = HARD_BOUNDS.get(name)
            if hard is not None and not hard[0] <= low <= high <= hard[1]:
                raise ConfigError(f"dpo.bounds.{name}=[{low:g}, {high:g}] exceeds the "
                                  f"strategist's limits [{hard[0]:g}, {hard[1]:g}] (method="
                                  f"{cfg.method.name}); keep dpo.bounds.{name} inside them")
    clamped = dpo.clamped()
    for name, (low, high) in dpo.bounds.items():
        value = getattr(dpo, name)
        if value is not None and getattr(clamped, name) != value:
            raise ConfigError(f"dpo.{name}={value!r} is outside dpo.bounds.{name} = "
                              f"[{low:g}, {high:g}] (DPO would train at {getattr(clamped, name)!r})"
                              f"; set dpo.{name} within the bounds or widen dpo.bounds.{name}")


def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` on the first invalid value."""
    check_known_keys(cfg)
    _typed(cfg, "seed", int)
    for key in ("resume", "progress"):
        _typed(cfg, key, bool)
    try:  # a built-in name or a `_target_` Task subclass, built once: it checks its fields
        task_class(OmegaConf.to_container(cfg.task, resolve=False))
        make_task(**OmegaConf.to_container(cfg.task, resolve=True))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    _choice(cfg, "method.reference", tuple(m.value for m in ReferenceMode))
    _choice(cfg, "model.source", ("smollm2", "tiny", "hf"))
    _choice(cfg, "device", ("auto", "cpu", "cuda"))
    _choice(cfg, "sandbox.isolation", ("auto", "bwrap", "rlimits"))
    _choice(cfg, "gate.score_mode", ("offline", "online"))
    for key in ("explore.islands", "explore.rounds", "explore.phase_every",
                "explore.samples_per_prompt", "explore.max_new_tokens", "explore.workers",
                "dpo.beta", "dpo.lr", "dpo.epochs", "dpo.batch_size", "gate.subset_size"):
        _positive(cfg, key)
    check_typed_groups(cfg)
    if cfg.method.reference == ReferenceMode.FIXED and cfg.method.gate:
        raise ConfigError("method.gate=true needs method.reference=adaptive (a fixed reference "
                          "is never promoted)")
    if len(cfg.explore.temperatures) < cfg.explore.islands:
        raise ConfigError(f"explore.temperatures has {len(cfg.explore.temperatures)} values for "
                          f"explore.islands={cfg.explore.islands}; give one temperature per island")
    if cfg.explore.islands_per_round > cfg.explore.islands:
        raise ConfigError("explore.islands_per_round must be <= explore.islands")
    if cfg.model.source == "hf" and not cfg.model.name_or_path:
        raise ConfigError("model.source=hf needs model.name_or_path (a local folder or hub id)")
    check_ignored(cfg)
