"""Checks a composed config before anything expensive starts, with errors that name the fix.

Hydra already rejects unknown groups/options and keys that do not exist, but not keys added
with ``+`` (``+explore.roundz=3`` composes fine and would run with nothing reading it). These
checks cover such keys, fields the chosen options ignore, values outside their documented
bounds, and values that are well-formed YAML but wrong for ATLAS.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from atlas.fields import check_known_fields
from atlas.knobs import HARD_BOUNDS
from atlas.loggers import LoggerSpec, logger_spec
from atlas.loggers import builtin as builtin_logger
from atlas.schema import (
    ConfigError,
    ExploreConfig,
    LoggerConfig,
    MethodConfig,
    ModelConfig,
    RunConfig,
    SandboxConfig,
)
from atlas.tasks import make_task, task_class
from atlas.tasks.base import Task

if TYPE_CHECKING:  # validation imports atlas.dpo.config on first use (no torch either way)
    from atlas.dpo.config import DPOConfig, GateConfig
    from atlas.supporters.config import RoleConfig

log = logging.getLogger("atlas.config")

CONF = Path(__file__).resolve().parents[1] / "conf"
SEED_MAX = 2**32 - 1
# sub-trees whose keys are validated by their consumer, not by the YAML schema
_OPEN = frozenset({"dpo.bounds"})  # any DPO knob; DPOConfig checks the names
_ROLE_BLOCKS = ("exploration", "strategist", "inspector")  # may repeat any supporters key


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

    A task or logger with its own ``_target_`` may come from another package's config folder:
    its class checks its own fields (``Task(**cfg.task)`` fails naming an unknown one), not
    this schema.
    """
    node = OmegaConf.to_container(cfg, resolve=False)
    if isinstance(node.get("task"), Mapping) and "_target_" in node["task"]:
        node = {k: v for k, v in node.items() if k != "task"}
    if not builtin_logger(node.get("logger", {})):
        node = {k: v for k, v in node.items() if k != "logger"}  # its factory checks its fields
    _unknown(node, schema(), "")


def override_problem(overrides: Sequence[str]) -> str | None:
    """One line naming a ``group.field=value`` override whose field no option of ``conf/``
    defines, with the closest known field; None when every one is known.

    Why before Hydra: Hydra rejects such a key in four lines that suggest ``+field=``, which
    would add a key nothing reads. Keys added with ``+``/``++``, removed with ``~``, Hydra's own
    and, when ``hydra.searchpath`` brings other config folders, the task's, are left to the
    later checks.
    """
    external = any(o.split("=", 1)[0].lstrip("+~") == "hydra.searchpath"
                   or o.startswith(("--config-dir", "-cd")) for o in overrides)
    for item in overrides:
        key, eq, _ = item.partition("=")
        if not eq or key[:1] in "+~" or "." not in key or key.startswith("hydra."):
            continue
        if external and key.startswith("task."):
            continue
        node: dict[str, Any] = {}
        leaf = node
        for part in key.split(".")[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[key.split(".")[-1]] = None
        try:
            _unknown(node, schema(), "")
        except ConfigError as exc:
            return str(exc)
    return None


# -- group names and options, before Hydra ------------------------------------------------------
def groups(conf: Path = CONF) -> dict[str, list[str]]:
    """``{group: [option, ...]}`` of ``conf/`` (Hydra's own groups left out)."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml"))
            for d in sorted(conf.iterdir()) if d.is_dir() and d.name != "hydra"}


def _searchpath_folders(overrides: Sequence[str]) -> list[Path]:
    """The folders a ``hydra.searchpath=[...]`` override adds (``pkg://`` and ``file://``)."""
    import importlib.util
    import re

    out: list[Path] = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") != "hydra.searchpath":
            continue
        # a sweep's job overrides come back from Hydra's parser escaped (pkg\://)
        for scheme, where in re.findall(r"(pkg|file)\\?://([^,\]\s'\"]+)", value):
            if scheme == "file":
                out.append(Path(where))
                continue
            top, _, rest = where.partition(".")
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                out += [Path(loc, *rest.split(".")) if rest else Path(loc)
                        for loc in spec.submodule_search_locations]
    return out


def group_problem(overrides: Sequence[str]) -> str | None:
    """One line naming a mistyped group (``methd=atlas``) or option (``method=atlass``,
    ``task=mytask`` without the ``hydra.searchpath`` that holds it), with the closest known
    name; None when every ``group=option`` is known.

    Why before Hydra: it suggests ``+methd=atlas`` (a key nothing reads) for the first and
    prints a many-line listing for the others. Sweep lists (``method=atlas,evodpo``) are
    checked value by value; sweep functions (``range(...)``), interpolations and
    ``--config-dir`` (options Hydra finds elsewhere) are left to Hydra.
    """
    if any(o.startswith(("--config-dir", "-cd", "--config-path", "-cp")) for o in overrides):
        return None
    known = groups()
    top = [str(k) for k in schema()]  # train.yaml's fields and those experiment/* adds
    extra = _searchpath_folders(overrides)
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or key[:1] in "+~" or "." in key or "/" in key or key.startswith("-"):
            continue
        if key not in known:
            if key in top:
                continue
            names = sorted([*known, *top])
            close = difflib.get_close_matches(key, names, n=1)
            return (f"{key} is neither a config group nor a field"
                    + (f"; did you mean {close[0]}={value}?" if close else "")
                    + f" (groups: {', '.join(sorted(known))})")
        value = value.strip("'\"")
        if any(c in value for c in "()[]{}$*") or value in ("null", ""):
            continue
        options = set(known[key])
        for folder in extra:
            options |= {p.stem for p in (folder / key).glob("*.yaml")}
        for option in value.split(","):
            if option in options:
                continue
            close = difflib.get_close_matches(option, sorted(options), n=1)
            msg = (f"{key}={option}: no option conf/{key}/{option}.yaml"
                   + (f"; did you mean {key}={close[0]}?" if close else "")
                   + f" (options: {', '.join(sorted(options))})")
            if key == "task" and not close:
                msg += ("; a task from your own package needs its config folder on the search "
                        "path, e.g. 'hydra.searchpath=[pkg://mypkg.conf]' (docs/tasks.md)")
            return msg
    return None


# -- fields the chosen options ignore ------------------------------------------------------------
def check_ignored(cfg: DictConfig) -> None:
    """Settings nothing reads under the chosen options: an error where a value was clearly
    meant to take effect, a warning where a group's default merely stays in place."""
    source = cfg.model.source
    if source != "hf" and cfg.model.get("name_or_path"):
        raise ConfigError(f"model.name_or_path={cfg.model.name_or_path!r} is ignored with "
                          f"model.source={source}; set model.source=hf to load it, or drop it "
                          f"(model.name_or_path=null)")
    sized = [k for k in ("hidden_size", "num_layers", "num_heads")
             if cfg.model.get(k) is not None]
    if source not in ("tiny", "llama3_1b_shape") and sized:
        log.warning("model.%s only apply to model.source=tiny or llama3_1b_shape; ignored with "
                    "model.source=%s", "/".join(sized), source)
    if not cfg.method.supporters and cfg.supporters.get("backend") != "embedded":
        log.warning("supporters.backend=%s is ignored: method=%s runs no supporters (use "
                    "method=atlas)", cfg.supporters.get("backend"), cfg.method.name)


#: gate fields that only decide a promotion: with method.gate=false (EvoDPO promotes every
#: phase) the gate's numbers are recorded, and these change nothing
GATE_DECIDES = ("epsilon", "delta", "holdout", "evidence", "min_holdout_completions",
                "min_completions")


def command_line() -> tuple[list[str] | None, bool]:
    """The overrides typed on the command line and whether this is a sweep (``-m``) job;
    ``(None, False)`` outside a Hydra command (a config composed in Python)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None, False
    return list(hc.overrides.task), hc.mode == RunMode.MULTIRUN


def check_ignored_overrides(cfg: DictConfig, overrides: Sequence[str], *,
                            sweep: bool = False) -> None:
    """A ``gate.*`` override the chosen method never reads is an error naming it.

    Why an error, not a warning: a value the user typed that does nothing makes the run's
    records say something about it that did not happen (``method=evotune gate.epsilon=0.5``
    ran exactly as without it). In a sweep (``-m``) it is a warning: one override line is
    shared by all jobs, and a sweep over methods (``method=evotune,atlas gate.epsilon=0.05``)
    sets it for the jobs that do read it.
    """
    typed = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides if "=" in o}
    gate = [o for k, o in typed.items() if k.startswith("gate.")]
    if not gate:
        return
    method = cfg.method
    if str(method.reference) == "fixed":
        ignored = gate
        why = (f"method={method.name}: its reference is fixed (method.reference=fixed), so no "
               f"gate runs")
    elif not method.gate:
        ignored = [o for o in gate if o.split("=", 1)[0].lstrip("+~")[5:] in GATE_DECIDES]
        why = (f"method={method.name}: it promotes every phase (method.gate=false), so the gate's "
               f"numbers are recorded, never applied")
    else:
        return
    if not ignored:
        return
    msg = (f"{', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect with "
           f"{why}; drop {'it' if len(ignored) == 1 else 'them'}, or run a gated method "
           f"(method=atlas, or method.reference=adaptive method.gate=true)")
    if sweep:
        log.warning("%s (kept: every job of this sweep shares the override)", msg)
        return
    raise ConfigError(msg)


# -- files a run reads ---------------------------------------------------------------------------
def check_files(cfg: DictConfig) -> None:
    """The shared secret must exist before a run starts (``sandbox.secret_file``, unless
    ``sandbox.create_secret`` asks for it); the model folder is ``ModelConfig``'s rule."""
    source = cfg.sandbox.get("secret_file")
    if source and not cfg.sandbox.get("create_secret") \
            and not Path(os.path.expanduser(str(source))).exists():
        from atlas.sandbox.secret import missing_secret_message

        raise ConfigError(missing_secret_message(source))


# -- settings that leave a method without its mechanism -------------------------------------------
def check_noop(method: MethodConfig, explore: ExploreConfig,
               roles: Mapping[str, RoleConfig] | None) -> None:
    """Refuse (or, where part of the mechanism remains, warn about) settings under which the
    method would run without what makes it that method; docs/cli.md lists each with its test.

    Every method fine-tunes on preference pairs between phases, so a run without a phase, or
    whose phases can build no pair, is a sampling run that reports itself as the method.
    """
    name = f"method={method.name}"
    if explore.phase_every > explore.rounds:
        raise ConfigError(
            f"explore.phase_every={explore.phase_every} > explore.rounds={explore.rounds}: the "
            f"run would end before its first fine-tuning phase, so {name} would never train; "
            f"set explore.phase_every <= explore.rounds")
    patches = roles is not None and bool(getattr(roles.get("exploration"), "max_patches", 0)) \
        and bool(getattr(roles.get("exploration"), "as_preferences", False))
    if explore.samples_per_prompt == 1:
        # a warning, not a refusal: a prompt names no island, so two islands (or rounds) with
        # the same parents show the same prompt and their completions can still pair
        log.warning("explore.samples_per_prompt=1: a preference pair needs two completions of "
                    "one prompt, so %s trains only on %s; set explore.samples_per_prompt >= 2",
                    name, "the exploration supporter's patches (supporter_vs_agent) and prompts "
                    "that happen to repeat" if patches else "prompts that happen to repeat "
                    "(two islands or rounds with the same parents)")
    if method.gate and explore.islands_per_round * explore.phase_every < 2:
        log.warning("explore.islands_per_round=%d x explore.phase_every=%d gives each phase one "
                    "prompt: the gate holds none out and rejects every phase, so %s's reference "
                    "is never promoted; raise either to 2", explore.islands_per_round,
                    explore.phase_every, name)


# -- values: every group's schema, built here ------------------------------------------------
def _build(make: Any, *args: Any) -> Any:
    try:
        return make(*args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def check_typed_groups(cfg: DictConfig) -> tuple[DPOConfig, GateConfig]:
    """The typed DPO and gate configs (their errors name the field); DPO knobs outside
    ``dpo.bounds`` are refused: training would clamp them while the run's records said
    otherwise."""
    from atlas.dpo.config import DPOConfig, GateConfig

    dpo = _build(DPOConfig.from_cfg, cfg.dpo)
    gate = _build(GateConfig.from_cfg, cfg.gate)
    if cfg.method.supporters:  # the strategist keeps every knob inside its hard limits
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
    return dpo, gate


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's validated configuration: each group's typed schema and the built Task.

    Why one object: the composed config is read once, here, and every component takes the
    group it needs, so no component re-reads the raw config with defaults of its own.
    """

    run: RunConfig
    method: MethodConfig
    model: ModelConfig
    explore: ExploreConfig
    sandbox: SandboxConfig
    dpo: DPOConfig
    gate: GateConfig
    #: the supporter roles' settings; None when the method runs no supporters
    supporters: Mapping[str, RoleConfig] | None
    #: the logger to build (``atlas.loggers.make_logger``); None for ``logger=none``. A
    #: built-in one's fields were checked by ``LoggerConfig``, another ``_target_``'s are
    #: checked by its factory
    logger: LoggerSpec | None
    task: Task


def validate(cfg: DictConfig, overrides: Sequence[str] | None = None, *,
             sweep: bool = False) -> Settings:
    """The run's ``Settings``, or ``ConfigError`` on the first invalid value: the one place a
    composed config is read, by building each group's schema (``atlas.schema``) before a
    model loads, with no torch import (a typo fails in a second or two).

    ``overrides``: the command line's (default: Hydra's, when running under it), for the
    settings typed there that the chosen method ignores; ``sweep``: whether they are a sweep's.
    """
    if overrides is None:
        overrides, sweep = command_line()
    check_known_keys(cfg)
    run = _build(RunConfig.from_top, cfg)
    if not 0 <= run.seed <= SEED_MAX:  # numpy's seed range: past it a traceback 17 s later
        raise ConfigError(f"seed={run.seed} is outside 0..{SEED_MAX} (the range numpy and torch "
                          f"seed with); use a seed in that range")
    try:  # a built-in name or a `_target_` Task subclass, built once: it checks its fields
        task_class(OmegaConf.to_container(cfg.task, resolve=False))
        task = make_task(**OmegaConf.to_container(cfg.task, resolve=True))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    method = _build(MethodConfig.from_cfg, cfg.method)
    model = _build(ModelConfig.from_cfg, cfg.model)
    sandbox = _build(SandboxConfig.from_cfg, cfg.sandbox)
    if builtin_logger(cfg.logger):  # else its factory checks its fields
        fields = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=False).items()
                  if k != "_target_"}
        _build(LoggerConfig.from_cfg, OmegaConf.create(fields))
    logger = _build(logger_spec, OmegaConf.to_container(cfg.logger, resolve=True))
    explore = _build(ExploreConfig.from_cfg, cfg.explore)
    dpo, gate = check_typed_groups(cfg)
    roles = None
    if method.supporters:  # the roles' settings are read only when supporters run
        from atlas.supporters.config import role_configs

        roles = _build(role_configs, cfg.supporters)
    check_ignored(cfg)
    check_ignored_overrides(cfg, overrides or [], sweep=sweep)
    check_files(cfg)
    check_noop(method, explore, roles)
    from atlas.agent.availability import model_problem  # no torch; bounded by the hub probe

    if problem := model_problem(model):
        raise ConfigError(problem)
    return Settings(run=run, method=method, model=model, explore=explore, sandbox=sandbox,
                    dpo=dpo, gate=gate, supporters=roles, logger=logger, task=task)
