"""The ``supporters`` config group, validated: one block per role, shared keys at the top.

A role's settings are the group's top-level keys overlaid by the role's own block, so
``supporters.base_url=...`` points all roles at one server while ``supporters.strategist.
backend=embedded`` mixes backends. Unknown keys are errors (a typo must not silently fall
back to a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from atlas.schema import field_error, plain_mapping

ROLES: tuple[str, ...] = ("exploration", "strategist", "inspector")


class RoleConfig(BaseModel):
    """Backend settings shared by every role."""

    model_config = ConfigDict(extra="forbid")

    #: embedded (the rules, no model) | openai (any OpenAI-compatible server) | the import
    #: path of your own chat backend class (``_target_``-style, built by Hydra's instantiate
    #: with ``(role_config, seed=...)``; contract: atlas/supporters/base.py ``make_backend``)
    backend: str = "embedded"
    base_url: str = "http://localhost:11434/v1"
    model: str | None = None
    api_key: str | None = None  # None: read api_key_env, else a placeholder (Ollama ignores it)
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_tokens: int = Field(512, ge=16, le=32768)
    timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    max_retries: int = Field(1, ge=0, le=5)
    #: a server that does not answer the start's health request: stop the run (one line
    #: naming the role, URL and fix) or fall back to the embedded rules (atlas/supporters/health.py)
    on_unreachable: Literal["stop", "fallback"] = "stop"
    health_timeout_s: float = Field(5.0, gt=0.0, le=120.0)
    #: this many calls in a row without an answer (unreachable, timeout, HTTP error) open the
    #: role's circuit breaker: the embedded rules answer for breaker_cooldown_s; 0: never
    breaker_failures: int = Field(3, ge=0, le=100)
    breaker_cooldown_s: float = Field(120.0, gt=0.0, le=86400.0)
    #: how the answer's JSON is requested (atlas/supporters/openai_backend.py): auto tries
    #: json_schema (OpenAI/vLLM/Ollama), then json_object_schema (llama-cpp-python), then
    #: text (free text, parsed), remembering per base_url what worked; or pin one mode
    #: (json_object: JSON without a schema)
    structured_output: Literal["auto", "json_schema", "json_object_schema", "json_object",
                               "text"] = "auto"
    out_of_range: Literal["fallback", "clamp"] = "fallback"

    @model_validator(mode="before")
    @classmethod
    def _json_mode_was_replaced(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "json_mode" in data:
            raise ValueError("json_mode was replaced by structured_output (auto | json_schema "
                             "| json_object_schema | json_object | text); json_mode=true is "
                             "structured_output=json_object")
        return data

    @field_validator("backend")
    @classmethod
    def _backend_name_or_import_path(cls, value: str) -> str:
        if value in ("embedded", "openai") or (
                "." in value and all(p.isidentifier() for p in value.split("."))):
            return value
        raise ValueError(f"backend={value!r} is not embedded, openai or the import path of a "
                         "chat backend class (e.g. mypkg.chat.MyBackend)")

    @model_validator(mode="after")
    def _model_for_openai(self) -> RoleConfig:
        if self.backend == "openai" and not self.model:
            raise ValueError("backend=openai needs a model name (field `model`, e.g. "
                             "deepseek-r1:32b); set supporters.<role>.model or supporters.model")
        return self


class ExplorationConfig(RoleConfig):
    max_patches: int = Field(2, ge=0, le=8)
    #: file a patch as a completion of the prompt the island was last served with, so it
    #: enters D_k as chosen (pair kind supporter_vs_agent; the paper's literal reading); false:
    #: patches are scored candidates and parents only, and the agent learns from its own
    #: programs (after phase 1 it copied less and wrote as many new valid programs as before;
    #: with them, half as many: docs/results.md, "Novelty")
    as_preferences: bool = False
    critique_chars: int = Field(400, ge=40, le=4000)
    #: the island's best programs shown to the exploration supporter (best first)
    programs_in_prompt: int = Field(3, ge=1, le=10)
    code_chars: int = Field(1500, ge=200, le=20000)  # characters of each program shown
    temperature_step: float = Field(0.1, ge=0.0, le=0.5)


class StrategistConfig(RoleConfig):
    """Thresholds of the embedded rules (atlas/supporters/embedded.py)."""

    min_pairs: int = Field(4, ge=0)  # fewer pairs than this -> loosen the threshold
    threshold_min_passed: int = Field(8, ge=2)  # passed programs needed to set a threshold
    low_diversity: float = Field(0.5, ge=0.0, le=1.0)  # below -> raise beta
    high_accuracy: float = Field(0.95, ge=0.0, le=1.0)  # at/above -> fewer epochs (or beta up)
    low_accuracy: float = Field(0.6, ge=0.0, le=1.0)  # below -> more epochs
    collapse_accuracy: float = Field(0.5, ge=0.0, le=1.0)  # below -> halve lr
    reject_streak: int = Field(2, ge=0)  # this many no-gain rejections in a row -> double lr


class InspectorConfig(RoleConfig):
    #: veto if a lower-is-better component grows by more than this factor ...
    max_regression_ratio: float = Field(2.0, gt=1.0)
    #: ... and by more than this absolute amount (ignores noise on tiny values)
    min_regression_abs: float = Field(1e-6, ge=0.0)
    #: veto if a higher-is-better component drops by more than this (absolute)
    max_drop: float = Field(0.05, ge=0.0)


_ROLE_MODELS: dict[str, type[RoleConfig]] = {
    "exploration": ExplorationConfig, "strategist": StrategistConfig, "inspector": InspectorConfig,
}


def role_configs(cfg: Mapping | None) -> dict[str, RoleConfig]:
    """Validated per-role configs; errors name the offending ``supporters.*`` field."""
    raw = plain_mapping(cfg, "supporters") if cfg is not None else {}
    raw.pop("name", None)  # Hydra group label, if present
    shared = {k: v for k, v in raw.items() if k not in ROLES}
    if "json_mode" in shared:
        RoleConfig._json_mode_was_replaced(shared)  # raises with the replacement's name
    out: dict[str, RoleConfig] = {}
    for role, model in _ROLE_MODELS.items():
        block = raw.get(role) or {}
        if not isinstance(block, Mapping):
            raise ValueError(f"supporters.{role} must be a mapping of settings, got {block!r}")
        # shared keys that only other roles know (e.g. max_patches at the top) are skipped
        merged = {k: v for k, v in shared.items() if k in model.model_fields}
        unknown = set(shared) - set(RoleConfig.model_fields) - set().union(
            *(m.model_fields for m in _ROLE_MODELS.values()))
        if unknown:
            raise ValueError(f"unknown supporters field(s) {sorted(unknown)}; known: "
                             f"{sorted(RoleConfig.model_fields)} or a role block {list(ROLES)}")
        merged.update(block)
        try:
            out[role] = model(**merged)
        except ValidationError as exc:  # phrased like every other group's errors
            raise field_error(exc, f"supporters.{role}", list(model.model_fields)) from None
    return out
