"""Checks a composed config before anything expensive starts, with errors that name the fix.

Hydra already rejects unknown groups/options and keys that do not exist, but not keys added
with ``+`` (``+explore.roundz=3`` composes fine and would run with nothing reading it). These
checks cover such keys, fields the chosen options ignore, values outside their documented
bounds, and values that are well-formed YAML but wrong for ATLAS.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from atlas.compose import check_known_keys
from atlas.configerrors import omegaconf_line
from atlas.dpo.config import DPOConfig, GateConfig
from atlas.dpo.rules import read_by_rules
from atlas.knobs import HARD_BOUNDS
from atlas.loggers import LoggerSpec, logger_spec, wandb_problem
from atlas.loggers import builtin as builtin_logger
from atlas.sandbox.isolation import secret_folder
from atlas.sandbox.secret import is_secret, missing_secret_message
from atlas.schema import (
    ConfigError,
    ExploreConfig,
    LoggerConfig,
    MethodConfig,
    ModelConfig,
    ProbeConfig,
    RunConfig,
    SandboxConfig,
)
from atlas.tasks import build_task, task_class
from atlas.tasks.base import Task

if TYPE_CHECKING:  # validation imports atlas.dpo.config on first use (no torch either way)
    from atlas.dpo.config import DPOConfig, GateConfig
    from atlas.supporters.config import RoleConfig

log = logging.getLogger("atlas.config")

SEED_MAX = 2**32 - 1


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
#: phase) the gate's numbers are recorded, and these change nothing. Which rule tests c*,
#: the fields the rules read (each rule names them: ``atlas.dpo.rules``), and G_k's choice
GATE_DECIDES = ("rule", *read_by_rules(), "holdout", "evidence", "min_holdout_completions",
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
    path = Path(os.path.expanduser(str(source))) if source else None
    if path is not None and not cfg.sandbox.get("create_secret") and not path.exists():
        raise ConfigError(missing_secret_message(source))
    if path is not None and path.exists() and not path.is_file():
        raise ConfigError(f"sandbox.secret_file={str(source)!r} is a folder, not a file; point "
                          f"it to the file that holds the secret (a run folder's .task_secret, "
                          f"or a new path with sandbox.create_secret=true)")
    if path is not None:  # the sandbox masks the secret's folder whole: refused here
        try:
            secret_folder(os.path.abspath(path))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if path is not None and path.is_file():  # its content too: a run refuses it mid-start-up
        try:
            value = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"sandbox.secret_file={str(source)!r} cannot be read ({e}); "
                              f"fix its permissions or point it to another file") from None
        if not is_secret(value):
            raise ConfigError(f"sandbox.secret_file={str(source)!r} holds no task secret "
                              f"(64 hex characters); write one with python -c \"import "
                              f"secrets; print(secrets.token_hex(32))\" > {source}, or point "
                              f"it to a run folder's .task_secret")


# -- settings that leave a method without its mechanism -------------------------------------------
def check_noop(method: MethodConfig, explore: ExploreConfig,
               roles: Mapping[str, RoleConfig] | None) -> None:
    """Refuse (or, where part of the mechanism remains, warn about) settings under which the
    method would run without what makes it that method; docs/cli.md lists each with its test.

    A method that fine-tunes does so on preference pairs between phases, so a run without a
    phase, or whose phases can build no pair, is a sampling run that reports itself as the
    method (the controls that never train, ``method.fine_tune=false``, are exempt).
    """
    name = f"method={method.name}"
    if not method.fine_tune:  # a control: it never trains, so no phase setting applies
        return
    if explore.phase_every > explore.rounds:
        raise ConfigError(
            f"explore.phase_every={explore.phase_every} > explore.rounds={explore.rounds}: the "
            f"run would end before its first fine-tuning phase, so {name} would never train; "
            f"set explore.phase_every <= explore.rounds")
    exploration = (roles or {}).get("exploration")  # an ExplorationConfig (role_configs)
    patches = bool(exploration is not None and exploration.max_patches > 0
                   and exploration.as_preferences)
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
def _message(exc: BaseException) -> str:
    """A schema's error as it is; OmegaConf's (an interpolation that does not resolve) as
    one line naming the key."""
    return omegaconf_line(exc) if isinstance(exc, OmegaConfBaseException) else str(exc)


def _build(make: Any, *args: Any) -> Any:
    try:
        return make(*args)
    except (TypeError, ValueError, OmegaConfBaseException) as exc:
        raise ConfigError(_message(exc)) from None


def check_typed_groups(cfg: DictConfig) -> tuple[DPOConfig, GateConfig]:
    """The typed DPO and gate configs (their errors name the field); DPO knobs outside
    ``dpo.bounds`` are refused: training would clamp them while the run's records said
    otherwise."""

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
    probe: ProbeConfig
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
    try:
        return _validate(cfg, overrides, sweep)
    except OmegaConfBaseException as exc:  # an interpolation no schema's build caught
        raise ConfigError(omegaconf_line(exc)) from None


def _validate(cfg: DictConfig, overrides: Sequence[str] | None, sweep: bool) -> Settings:
    check_known_keys(cfg)
    run = _build(RunConfig.from_top, cfg)
    if not 0 <= run.seed <= SEED_MAX:  # numpy's seed range: past it a traceback 17 s later
        raise ConfigError(f"seed={run.seed} is outside 0..{SEED_MAX} (the range numpy and torch "
                          f"seed with); use a seed in that range")
    try:  # a built-in name or a `_target_` Task subclass, built once: it checks its fields
        task_class(OmegaConf.to_container(cfg.task, resolve=False))
        task = build_task(cfg)
    except (TypeError, ValueError, OmegaConfBaseException) as exc:
        raise ConfigError(_message(exc)) from None
    method = _build(MethodConfig.from_cfg, cfg.method)
    model = _build(ModelConfig.from_cfg, cfg.model)
    sandbox = _build(SandboxConfig.from_cfg, cfg.sandbox)
    if builtin_logger(cfg.logger):  # else its factory checks its fields
        fields = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=False).items()
                  if k != "_target_"}
        _build(LoggerConfig.from_cfg, OmegaConf.create(fields))
    logger = _build(logger_spec, OmegaConf.to_container(cfg.logger, resolve=True))
    explore = _build(ExploreConfig.from_cfg, cfg.explore)
    probe = _build(ProbeConfig.from_cfg, cfg.probe)
    dpo, gate = check_typed_groups(cfg)
    roles = None
    if method.supporters:  # the roles' settings are read only when supporters run
        # deferred: loads openai (the supporters' client); a config typo fails without it
        from atlas.supporters.config import role_configs

        roles = _build(role_configs, cfg.supporters)
    check_ignored(cfg)
    check_ignored_overrides(cfg, overrides or [], sweep=sweep)
    check_files(cfg)
    check_noop(method, explore, roles)
    from atlas.agent.availability import model_problem  # no torch; bounded by the hub probe

    # the model hub and the W&B server side by side: each may take its probe's 3 s;
    # a method without an LLM (method.writer) needs no model
    with ThreadPoolExecutor(2, thread_name_prefix="atlas-probe") as pool:
        hub = pool.submit(model_problem, model) if method.uses_llm else None
        wandb = pool.submit(wandb_problem, logger)
        if problem := (hub.result() if hub else None) or wandb.result():
            raise ConfigError(problem)
    return Settings(run=run, method=method, model=model, explore=explore, sandbox=sandbox,
                    dpo=dpo, gate=gate, probe=probe, supporters=roles, logger=logger, task=task)
