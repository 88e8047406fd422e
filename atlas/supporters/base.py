"""What every role does around its answer: ask the model, validate, fall back, count, log.

A role never raises into the loop because of its model: any failure of the ``openai``
backend (server down, timeout, unparsable or out-of-range answer) becomes the embedded
rule's answer stamped with the ``fallback_cause``, and is counted per cause. Counters obey
``calls == llm_ok + embedded + sum(fallbacks)`` (``embedded``: answered by the rule by
design, i.e. the embedded backend or nothing to ask the model).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import ValidationError

from atlas.supporters.config import RoleConfig
from atlas.supporters.health import DOWN_CAUSES, Breaker, found_down
from atlas.supporters.openai_backend import ChatBackend, SupporterError
from atlas.supporters.schemas import ANSWER_SCHEMAS, FALLBACK_CAUSES, INVALID_CAUSES, RAW_CHARS

log = logging.getLogger("atlas.supporters")

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass
class RoleStats:
    """Per-role counters the caller reports (paper Table 3/5 and the valid-answer rate)."""

    backend: str
    calls: int = 0
    llm_ok: int = 0
    embedded: int = 0
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FALLBACK_CAUSES, 0))
    #: per output mode the model was asked in: {"asked": n, "ok": n} (valid-answer rate)
    modes: dict[str, dict[str, int]] = field(default_factory=dict)

    def count_mode(self, mode: str | None, ok: bool) -> None:
        if mode is None:
            return
        m = self.modes.setdefault(mode, {"asked": 0, "ok": 0})
        m["asked"] += 1
        m["ok"] += int(ok)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "calls": self.calls, "llm_ok": self.llm_ok,
                "embedded": self.embedded, "fallbacks": dict(self.fallbacks),
                "modes": {k: dict(v) for k, v in self.modes.items()}}


def call_counts(stats: dict) -> dict[str, int]:
    """One role's calls as a reader wants them (``RoleStats.as_dict()`` in): ``answered`` (the
    model's answer was used), ``invalid`` (it answered, the answer was unusable: the rule's
    was used), ``fell_back`` (no answer: down, timed out, HTTP error, or not asked while the
    circuit breaker was open: the rule's was used). Calls the rule answers by design (the
    embedded backend, a rejected promotion the inspector is not asked about) are in none."""
    causes = stats.get("fallbacks") or {}
    return {"answered": int(stats.get("llm_ok", 0)),
            "invalid": sum(int(causes.get(c, 0)) for c in INVALID_CAUSES),
            "fell_back": sum(int(causes.get(c, 0)) for c in (*DOWN_CAUSES, "breaker_open"))}


#: backend names -> the chat backend class they build; any other name is an import path
BACKENDS: dict[str, str] = {"openai": "atlas.supporters.openai_backend.ChatBackend"}


def make_backend(cfg: RoleConfig, role: str, seed: int) -> ChatBackend | None:
    """The role's chat backend (None: the embedded rules), built with Hydra's ``instantiate``
    from ``BACKENDS`` or the import path in ``backend``. A backend is any class taking
    ``(role_config, seed=...)`` with ``complete(system, user, schema=None, name="answer") ->
    str`` (the model's answer text; raise ``SupporterError(cause, message)`` for a failure,
    cause one of ``FALLBACK_CAUSES``) and an attribute ``last_mode`` (the output mode used, or
    None). Its answers go through the same parsing, bounds and fallback as ``openai``'s."""
    if cfg.backend == "embedded":
        return None
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    target = BACKENDS.get(cfg.backend, cfg.backend)
    try:
        backend = instantiate({"_target_": target, "_partial_": True})(cfg, seed=seed)
    except (InstantiationException, ImportError, AttributeError) as exc:
        raise ValueError(f"supporters.{role}.backend={cfg.backend!r} cannot be built ({exc}); "
                         "install or path-add its package, or use embedded / openai") from exc
    if not callable(getattr(backend, "complete", None)):
        raise ValueError(f"supporters.{role}.backend={cfg.backend!r} has no complete(system, "
                         "user, schema, name) method (see atlas/supporters/base.py make_backend)")
    return backend


class Role(Generic[Req, Resp]):
    """Shared machinery; subclasses supply the prompt, the parser and the embedded rule."""

    name = "role"

    def __init__(self, cfg: RoleConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.stats = RoleStats(backend=cfg.backend)
        self.backend: ChatBackend | None = make_backend(cfg, self.name, seed)
        self.breaker = Breaker(self.name, cfg.breaker_failures, cfg.breaker_cooldown_s)
        down = found_down(cfg.base_url) if cfg.backend == "openai" else None
        if down is not None:  # the start's health request failed and the user chose fallback
            self.breaker.open(f"the server at {cfg.base_url} {down}")

    # -- subclass hooks
    def _prompt(self, req: Req) -> tuple[str, str]:
        raise NotImplementedError

    def _parse(self, text: str, req: Req) -> Resp:
        raise NotImplementedError

    def _rule(self, req: Req) -> Resp:
        raise NotImplementedError

    # -- the one path every call takes
    def _answer(self, req: Req, ask_model: bool = True) -> Resp:
        self.stats.calls += 1
        if self.backend is None or not ask_model:
            self.stats.embedded += 1
            out = self._rule(req)
        elif not self.breaker.allows():
            self.stats.fallbacks["breaker_open"] += 1
            out = self._rule(req).model_copy(  # type: ignore[attr-defined]
                update={"fallback_cause": "breaker_open"})
        else:
            self.backend.last_mode = None
            try:
                system, user = self._prompt(req)
                text = self.backend.complete(system, user, schema=ANSWER_SCHEMAS.get(self.name),
                                             name=f"{self.name}_answer")
                try:
                    out = self._parse(text, req)
                except ValidationError as exc:  # a parsed value the schema still rejects
                    raise SupporterError("malformed", str(exc)[:300], text) from exc
                out = out.model_copy(  # type: ignore[attr-defined]
                    update={"output_mode": self.backend.last_mode, "backend": self.cfg.backend})
                self.stats.llm_ok += 1
                self.stats.count_mode(self.backend.last_mode, True)
                self.breaker.record(None)
            except SupporterError as exc:
                self.stats.fallbacks[exc.cause] += 1
                self.breaker.record(exc.cause)
                self.stats.count_mode(self.backend.last_mode, False)
                log.warning("supporter %s: %s answer unusable (%s, mode %s): %s; using the "
                            "embedded rule", self.name, self.cfg.model, exc.cause,
                            self.backend.last_mode, exc.message[:300])
                out = self._rule(req).model_copy(  # type: ignore[attr-defined]
                    update={"fallback_cause": exc.cause, "raw": exc.raw[:RAW_CHARS],
                            "output_mode": self.backend.last_mode})
        # every call's backend and fallback are in the run's events; the console gets the
        # fallbacks (warnings above) and the summary's counts, not a line per call
        log.debug("supporter %s backend=%s fallback_cause=%s", self.name,
                  out.backend, out.fallback_cause)  # type: ignore[attr-defined]
        return out
