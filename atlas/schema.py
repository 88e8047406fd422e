"""One schema per config group, validated one way, with errors phrased in one place.

Every Hydra group has a typed schema: a pydantic dataclass declared with ``@group("name")``
(this module: ``method``, ``model``, ``explore``, ``sandbox``, ``logger`` and the top-level
fields; ``atlas.dpo.config``: ``dpo``, ``gate``), a pydantic model (``atlas.supporters.config``:
``supporters``), or, for ``task``, the task's own class (the extension point: ``Task(**cfg)``
checks its fields). Types and bounds are declared once, on the field (``Field(gt=0)``,
``Literal[...]``, ``ReferenceMode``); unknown keys fail (``extra="forbid"``); cross-field rules
are validators of the schema that owns the fields. ``atlas.config.validate`` builds every
schema from the composed config before anything expensive starts.

Values live in ``conf/``: the schemas of the Hydra-only groups declare no defaults (a value
missing from the YAML is an error), and where a schema keeps defaults for use from Python
(``DPOConfig()``, ``GateConfig()``, the supporters' roles, the tasks) they equal the YAML
(``tests/test_schema.py`` compares them).

Errors name the field and the fix, the same way for every group: ``dpo.beta must be > 0.0,
got -1.0``, ``dpo.max_length must be an integer, got 'long'; set dpo.max_length=<an
integer>``, ``method.reference='sometimes' is not one of ['fixed', 'adaptive']; override
it, e.g. `method.reference=fixed```, ``unknown explore field(s) ['roundz']: explore.roundz
is not a known field; ...``. A wrong type is a ``TypeError``, a wrong value a ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from hydra.errors import CompactHydraException
from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from atlas.types import ReferenceMode

T = TypeVar("T")


class ConfigError(ValueError, CompactHydraException):
    """A config value that cannot work; the message names the field and the fix.

    A ``CompactHydraException``: on the command line Hydra prints the message, not a traceback.
    ``exit_status``: a mistake refused before the run started (``atlas.commandline``).
    """

    exit_status = 2


# -- field types: strict numbers and booleans (YAML ``true`` is not 1, ``'0.3'`` not 0.3) -----
def _type_error(kind: str, example: str) -> PydanticCustomError:
    return PydanticCustomError("atlas_type", "must be {kind}", {"kind": kind, "example": example})


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error("a number", "0.5")
    if not math.isfinite(value):
        raise PydanticCustomError("atlas_finite", "must be finite")
    return float(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error("an integer", "0")
    if not math.isfinite(value):
        raise PydanticCustomError("atlas_finite", "must be finite")
    if float(value) != int(value):
        raise _type_error("an integer", "0")
    return int(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error("true or false", "true")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _type_error("a string", "name")
    return value


def _count_or_auto(value: Any) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _type_error("a positive integer or auto", "auto")
    return value


def _number_or_auto(value: Any) -> float | str:
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise _type_error("a number >= 0 or auto", "auto")
    return float(value)


Num = Annotated[float, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_integer)]
Bool = Annotated[bool, BeforeValidator(_boolean)]
Str = Annotated[str, BeforeValidator(_text)]
Positive = Annotated[Int, Field(ge=1)]
#: a number >= 0, or ``auto`` (the field says what auto resolves to, per device)
NumOrAuto = Annotated[Annotated[float, Field(ge=0.0)] | Literal["auto"],
                      BeforeValidator(_number_or_auto)]


# -- errors ----------------------------------------------------------------------------------
def _choices(ctx: Mapping[str, Any]) -> list[str]:
    return re.findall(r"'([^']*)'", str(ctx.get("expected", "")))


_BOUND_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                "less_than_equal": "<="}
_BOUND_KEYS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt",
               "less_than_equal": "le"}


def field_error(exc: ValidationError, group: str, known: list[str],
                fixes: Mapping[str, str] | None = None) -> TypeError | ValueError:
    """The first problem of ``exc`` as one sentence naming ``group.field`` and the fix."""
    errors = exc.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors
                     if e["type"] in ("unexpected_keyword_argument", "extra_forbidden"))
    prefix = f"{group}." if group else ""
    if unknown:
        return ValueError(f"unknown {group or 'top-level'} field(s) {unknown}: {prefix}"
                          f"{unknown[0]} is not a known field; remove it or use one of "
                          f"{sorted(known)}")
    e = errors[0]
    loc = [str(p) for p in e["loc"]]
    path = prefix + ".".join(loc)
    kind, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    fix = (fixes or {}).get(loc[0] if loc else "", "")
    fix = f" ({fix})" if fix else ""
    if kind == "atlas_type":
        if not group:  # a top-level field: `seed=abc` reads best as the override it was
            return TypeError(f"{path}={value!r} must be {ctx['kind']}; set e.g. "
                             f"{path}={ctx['example']}")
        return TypeError(f"{path} must be {ctx['kind']}, got {value!r}; set {path}=<{ctx['kind']}>")
    if kind in ("list_type", "tuple_type"):
        return TypeError(f"{path} must be a list, got {value!r}; set {path}=[<values>]")
    if kind == "atlas_finite":
        return ValueError(f"{path} must be finite, got {value!r}")
    if kind in _BOUND_WORDS:
        return ValueError(f"{path} must be {_BOUND_WORDS[kind]} {ctx[_BOUND_KEYS[kind]]}{fix}, "
                          f"got {value!r}")
    if kind in ("literal_error", "enum"):
        allowed = _choices(ctx)
        return ValueError(f"{path}={value!r} is not one of {allowed}; override it, e.g. "
                          f"`{path}={allowed[0] if allowed else '...'}`")
    if kind == "missing":
        return ValueError(f"{path} is missing: no option of conf/ set it; set {path}=<value>")
    if kind == "value_error":  # a validator of the schema: its message names the fields
        msg = str(e["msg"]).removeprefix("Value error, ")
        return ValueError(msg if not group or f"{group}." in msg else f"{path}: {msg}")
    return ValueError(f"{path}={value!r} is invalid: {e['msg']}{fix}")


def plain_mapping(cfg: Any, group: str) -> dict[str, Any]:
    """A dict or an OmegaConf node as a plain dict (resolved), or a TypeError naming the group."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    if not isinstance(cfg, Mapping):
        raise TypeError(f"{group or 'config'}: expected a mapping of fields, got "
                        f"{type(cfg).__name__}")
    return dict(cfg)


def from_record(schema: type[T], record: Mapping[str, Any] | None,
                defaults: Mapping[str, Any]) -> tuple[T, frozenset[str]] | None:
    """A group's settings as a run folder recorded them (its ``config`` event), through the
    group's schema, and the names of the fields the record lacks.

    A run recorded before a field existed lacks it: the field takes ``defaults`` (the group's
    YAML), and the caller sees it was not recorded. A field the schema no longer has is left
    out. None when the record holds values the schema refuses.
    """
    names = {f.name for f in dataclasses.fields(schema)}
    record = dict(record or {})
    lacked = frozenset(n for n in names if n not in record)
    values = {**{n: v for n, v in defaults.items() if n in lacked},
              **{n: v for n, v in record.items() if n in names}}
    try:
        return schema(**values), lacked
    except (TypeError, ValueError):
        return None


def group(name: str, *, fixes: Mapping[str, str] | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: the schema of config group ``name`` ("" for the top-level fields).

    The class becomes a frozen pydantic dataclass (validated on construction,
    ``dataclasses.replace`` included; unknown fields forbidden; a run's settings cannot change
    under the components that share them) whose errors are ``field_error``'s sentences, with a
    ``from_cfg(cfg)`` that builds it from the Hydra node. ``fixes``: field -> a hint appended
    to a bound's message.
    """
    def wrap(cls: type[T]) -> type[T]:
        cls = dataclass(config=ConfigDict(extra="forbid"), kw_only=True, frozen=True)(cls)
        known = [f.name for f in dataclasses.fields(cls)]
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError as exc:
                raise field_error(exc, name, known, fixes) from None

        def from_cfg(kls: type[T], cfg: Any) -> T:
            """Build from the Hydra group (dict or DictConfig); unknown fields are errors."""
            return kls(**plain_mapping(cfg, name))

        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.from_cfg = classmethod(from_cfg)  # type: ignore[attr-defined]
        cls.GROUP = name  # type: ignore[attr-defined]
        return cls
    return wrap


# -- the schemas of the groups that only Hydra reads (no defaults: the YAML holds the values) --
@group("method")
class MethodConfig:
    """``conf/method/*.yaml``: which reference, whether the gate and the supporters run."""

    name: Str
    reference: ReferenceMode = Field(description="fixed: the base model (adapters off); "
                                     "adaptive: the `ref` adapter, promoted by the gate")
    gate: Bool = Field(description="apply the Policy Inspector's numeric gate (Eq. 4/5)")
    supporters: Bool = Field(description="run the exploration supporter, strategist, inspector")
    skip_without_improvement: Bool = Field(description="skip fine-tuning after a phase with "
                                           "no score gain (App. B.4)")
    fine_tune: Bool = Field(True, description="fine-tune the agent every explore.phase_every "
                            "rounds; false: the controls that never train (method=sample, "
                            "method=random_literals), which run no phase")
    writer: Literal["llm", "random_literals"] = Field(
        "llm", description="who writes the candidates: llm (the research agent, from its "
        "island's prompt) | random_literals (no LLM: the island's best programs with their "
        "numeric literals drawn at random; the model is never loaded)")

    @model_validator(mode="after")
    def _gate_needs_adaptive(self) -> MethodConfig:
        if self.reference == ReferenceMode.FIXED and self.gate:
            raise ValueError("method.gate=true needs method.reference=adaptive (a fixed "
                             "reference is never promoted)")
        if self.writer != "llm" and (self.fine_tune or self.supporters):
            raise ValueError(f"method.writer={self.writer} has no LLM to fine-tune or to "
                             f"support; set method.fine_tune=false and method.supporters=false")
        if not self.fine_tune and self.gate:
            raise ValueError("method.gate=true needs method.fine_tune=true (nothing is trained, "
                             "so no reference is ever a candidate)")
        return self

    @property
    def uses_llm(self) -> bool:
        """Whether the run loads the research agent's model."""
        return self.writer == "llm"


@group("model")
class ModelConfig:
    """``conf/model/*.yaml``: the research agent and its LoRA adapters."""

    source: Literal["smollm2", "tiny", "hf", "llama3_1b_shape"]
    cache_dir: Str
    dtype: Str
    lora_r: Int = Field(ge=1)
    lora_alpha: Num = Field(gt=0)
    lora_dropout: Num = Field(ge=0, lt=1)
    lora_targets: list[Str]
    name_or_path: Str | None = Field(None, description="hf only: a local folder or hub id")
    # tiny and llama3_1b_shape only (absent from the other options' YAML): the model's size,
    # or for llama3_1b_shape a shrink of the 1B shape (tests); null keeps the 1B's value
    hidden_size: Positive | None = None
    num_layers: Positive | None = None
    num_heads: Positive | None = None

    @model_validator(mode="after")
    def _hf_needs_a_path(self) -> ModelConfig:
        """hf: a ``name_or_path`` written as a path (``/``, ``.``, ``~``) must be a folder (a
        hub id such as ``meta-llama/Llama-3.2-1B-Instruct`` is checked when the model loads)."""
        if self.source != "hf":
            return self
        name = self.name_or_path
        if not name:
            raise ValueError("model.source=hf needs model.name_or_path (a local folder or hub id)")
        if name.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(name)):
            raise ValueError(f"model.name_or_path={name!r} is not a folder; point it at a saved "
                             f"Hugging Face model folder (config.json and weights) or use a hub id")
        return self


@group("explore")
class ExploreConfig:
    """``conf/explore/default.yaml``: islands, rounds, sampling."""

    islands: Int = Field(gt=0)
    rounds: Int = Field(gt=0)
    phase_every: Int = Field(gt=0)
    islands_per_round: Int = Field(ge=1)
    samples_per_prompt: Int = Field(gt=0)
    programs_in_prompt: Int = Field(ge=1)  # the agent is asked to improve on a program
    max_new_tokens: Int = Field(gt=0)
    temperatures: list[Annotated[Num, Field(gt=0)]]  # one per island, no scalar
    top_p: Num = Field(gt=0, le=1)
    batch_islands: bool
    buffer_size: Int = Field(ge=1)
    clusters: Int = Field(ge=1)
    workers: Annotated[Positive | Literal["auto"], BeforeValidator(_count_or_auto)]
    topk_pool_factor: Num = Field(ge=1)
    cluster_similarity: Num = Field(gt=0, le=1)
    temperature_bounds: tuple[Num, Num]
    agent_threads: Positive | None
    reuse_evaluations: Bool
    copies: Literal["skip", "evaluate"]
    copy_retries: Int = Field(ge=0)
    prompt_form: Literal["better", "better_bare", "change", "change_bare"]

    def sandbox_workers(self, cores: int) -> int:
        """``workers`` as a number: ``auto`` is one worker per usable core, at most a round's
        candidates (more would idle)."""
        if self.workers != "auto":
            return int(self.workers)
        return max(1, min(int(cores), self.islands_per_round * self.samples_per_prompt))

    @model_validator(mode="after")
    def _per_island(self) -> ExploreConfig:
        low, high = self.temperature_bounds
        if not 0 < low <= high:
            raise ValueError(f"explore.temperature_bounds=[{low:g}, {high:g}] must be [low, high] "
                             f"with 0 < low <= high")
        if len(self.temperatures) < self.islands:
            raise ValueError(f"explore.temperatures has {len(self.temperatures)} values for "
                             f"explore.islands={self.islands}; give one temperature per island")
        if self.islands_per_round > self.islands:
            raise ValueError("explore.islands_per_round must be <= explore.islands")
        return self


@group("probe")
class ProbeConfig:
    """``conf/probe/default.yaml``: the learning probe of every trained phase
    (``atlas.probe``)."""

    enabled: Bool
    prompts: Int = Field(ge=1)
    samples: Int = Field(ge=1)
    temperature: Num = Field(gt=0)


@group("sandbox")
class SandboxConfig:
    """``sandbox`` in ``conf/train.yaml``: how candidate programs are confined."""

    isolation: Literal["auto", "bwrap", "rlimits"]
    secret_file: Str | None
    create_secret: Bool = Field(description="create secret_file when it does not exist "
                                "(else a missing one is an error)")


@group("logger")
class LoggerConfig:
    """``conf/logger/*.yaml`` of the built-in loggers (their ``_target_`` is
    ``atlas.loggers.wandb_logger``); the W&B fields are absent from ``logger=none``. A logger
    with another ``_target_`` is checked by its own factory."""

    name: Literal["wandb", "none"]
    mode: Literal["offline", "online", "disabled"] | None = None
    project: Str | None = None
    entity: Str | None = None
    group: Str | None = None


@group("")
class RunConfig:
    """The top-level settings of ``conf/train.yaml`` (``name``, ``run_dir`` and
    ``experiment_name`` only label the run folder; the groups are checked by their schemas)."""

    seed: Int
    device: Literal["auto", "cpu", "cuda"]
    resume: Bool
    progress: Bool

    @classmethod
    def from_top(cls, cfg: Any) -> RunConfig:
        return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls)})
