"""Turn a model's answer text into a validated, bounded advice, or say exactly why not.

Small and reasoning models wrap JSON in prose, code fences or ``<think>`` blocks, emit
NaN, strings for numbers, negative learning rates. Each answer is classified as
``prose`` (no JSON object at all), ``malformed`` (JSON missing or mistyped fields) or
``out_of_range`` (well-formed but outside the documented bounds; with ``out_of_range:
clamp`` such values are clamped instead); anything else becomes an advice.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from atlas.evolution.extract import defines_entry_point
from atlas.supporters.config import ExplorationConfig, RoleConfig
from atlas.supporters.openai_backend import SupporterError
from atlas.supporters.schemas import (
    KNOB_FIELDS,
    RAW_CHARS,
    ExplorationAdvice,
    ExplorationRequest,
    InspectorRequest,
    InspectorVerdict,
    Knobs,
    StrategistAdvice,
    StrategistRequest,
)

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (after dropping ``<think>`` blocks)."""
    body = _THINK.sub("", text or "")
    if "{" not in body:
        raise SupporterError("prose", "the answer holds no JSON object", text)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", body):
        try:
            obj, _ = decoder.raw_decode(body, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise SupporterError("malformed", "the answer's JSON does not parse", text)


def _number(obj: dict[str, Any], key: str, text: str) -> float | None:
    """A finite float from obj[key] (numbers or numeric strings), None if the key is absent."""
    if key not in obj or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SupporterError("malformed", f"{key} must be a number, got {value!r}", text)
    try:
        out = float(value)
    except ValueError:
        raise SupporterError("malformed", f"{key} must be a number, got {value!r}", text) from None
    if not math.isfinite(out):
        raise SupporterError("out_of_range", f"{key}={value!r} is not finite", text)
    return out


def _bounded(name: str, value: float, lo: float, hi: float, cfg: RoleConfig, text: str,
             clamped: list[str]) -> float:
    if lo <= value <= hi:
        return value
    if cfg.out_of_range == "clamp":
        clamped.append(name)
        return min(max(value, lo), hi)
    raise SupporterError("out_of_range", f"{name}={value} outside [{lo}, {hi}]", text)


def _strip_fence(code: str) -> str:
    m = _FENCE.match(code.strip())
    return m.group(1) if m else code


def parse_exploration(text: str, req: ExplorationRequest, cfg: ExplorationConfig) -> ExplorationAdvice:
    """{"critique": str, "patches": [full program, ...], "temperature": float | null}."""
    obj = extract_json(text)
    critique = obj.get("critique")
    if not isinstance(critique, str) or not critique.strip():
        raise SupporterError("malformed", "critique must be a non-empty string", text)
    patches_in = obj.get("patches") or []
    if isinstance(patches_in, str):
        patches_in = [patches_in]
    if not isinstance(patches_in, list):
        raise SupporterError("malformed", "patches must be a list of program sources", text)
    patches, dropped = [], 0
    for p in patches_in[: cfg.max_patches]:
        code = _strip_fence(p).strip("\n") + "\n" if isinstance(p, str) else ""
        if code and defines_entry_point(code, req.entry_point):
            patches.append(code)
        else:
            dropped += 1
    dropped += max(0, len(patches_in) - cfg.max_patches)
    clamped: list[str] = []
    temp = _number(obj, "temperature", text)
    if temp is not None:
        temp = _bounded("temperature", temp, *req.temperature_bounds, cfg, text, clamped)
    return ExplorationAdvice(backend="openai", raw=text[:RAW_CHARS],
                             critique=critique.strip()[: cfg.critique_chars], patches=patches,
                             temperature=temp, patches_dropped=dropped)


def parse_strategist(text: str, req: StrategistRequest, cfg: RoleConfig) -> StrategistAdvice:
    """{"beta", "lr", "epochs", "score_threshold", "rationale"}; absent knobs stay as they are."""
    obj = extract_json(text)
    cur, b, clamped = req.knobs, req.bounds, []
    new: dict[str, Any] = cur.model_dump()
    for name in ("beta", "lr"):
        v = _number(obj, name, text)
        if v is not None:
            new[name] = _bounded(name, v, *getattr(b, name), cfg, text, clamped)
    ep = _number(obj, "epochs", text)
    if ep is not None:
        if ep != int(ep):
            raise SupporterError("malformed", f"epochs must be an integer, got {obj['epochs']!r}",
                                 text)
        new["epochs"] = int(_bounded("epochs", ep, *b.epochs, cfg, text, clamped))
    if "score_threshold" in obj:
        th = _number(obj, "score_threshold", text)
        if th is not None:
            lo, hi = req.scores.min, req.scores.best
            if lo is None or hi is None:
                raise SupporterError("out_of_range", "score_threshold must be null: no passed "
                                     "program gives an observed score range", text)
            th = _bounded("score_threshold", th, lo, hi, cfg, text, clamped)
        new["score_threshold"] = th
    rationale = obj.get("rationale", "")
    if not isinstance(rationale, str):
        rationale = json.dumps(rationale)[:500]
    knobs = Knobs(**new)
    note = f" [clamped: {', '.join(clamped)}]" if clamped else ""
    changed = changed_knobs(cur, knobs)
    return StrategistAdvice(backend="openai", raw=text[:RAW_CHARS], knobs=knobs, changed=changed,
                            rationale=rationale[:500] + note,
                            reasons={n: (rationale[:200] or "model's choice")
                                     + (" [clamped]" if n in clamped else "") for n in changed})


def changed_knobs(old: Knobs, new: Knobs) -> list[str]:
    """Knobs whose value differs (relative 1e-9 for floats): the caller counts these."""
    out = []
    for name in KNOB_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if (a is None) != (b is None) or (a is not None and not math.isclose(a, b, rel_tol=1e-9)):
            out.append(name)
    return out


def parse_inspector(text: str, req: InspectorRequest, cfg: RoleConfig) -> InspectorVerdict:
    """{"veto": bool, "reason": str}: a veto needs a reason; it can never force acceptance."""
    obj = extract_json(text)
    veto = obj.get("veto")
    if isinstance(veto, str) and veto.strip().lower() in ("true", "false"):
        veto = veto.strip().lower() == "true"
    if not isinstance(veto, bool):
        raise SupporterError("malformed", f"veto must be true or false, got {veto!r}", text)
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise SupporterError("malformed", "reason must be a string", text)
    if veto and not reason.strip():
        raise SupporterError("malformed", "a veto must give a reason", text)
    return InspectorVerdict(backend="openai", raw=text[:RAW_CHARS], accepted=not veto,
                            veto=veto, reason=reason.strip()[:500])
