"""One chat call to an OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp server, OpenAI).

Transport failures are translated into the fallback causes the loop counts
(``unreachable``: no connection; ``timeout``; ``http_error``: the server answered with an
error status, e.g. an unknown model name or an internal error); the answer text is returned untouched for the role to
parse. Retries are the client's own (bounded by ``max_retries``), so one call costs at
most ``(1 + max_retries) * timeout_s`` seconds per output mode tried.

Structured outputs (``structured_output``): the role's JSON schema is sent as
``json_schema`` (OpenAI / vLLM / Ollama form: ``{"type": "json_schema", "json_schema":
{"name", "schema", "strict"}}``), else as ``json_object_schema`` (llama-cpp-python form:
``{"type": "json_object", "schema": ...}``), else no response format (``text``: the
free-text parser). With ``auto`` the modes are tried in that order; a mode the server
rejects with HTTP 400/422/500/501 is skipped, and the first mode that gets an answer is
remembered per ``base_url`` (``negotiated_modes()``) so later calls of every role go
straight to it. A mode is only remembered after an answer came back, so a server that is
down or rejects every mode leaves nothing remembered.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from atlas.supporters.config import RoleConfig

#: ``auto``'s order: the OpenAI form, the schema-in-json_object form, free text
NEGOTIATION_ORDER: tuple[str, ...] = ("json_schema", "json_object_schema", "text")
#: status codes meaning "this response_format is not supported here": try the next mode
_FORMAT_REJECTED = frozenset({400, 422, 500, 501})
_NEGOTIATED: dict[str, str] = {}  # base_url -> the mode that got an answer
_LOCK = threading.Lock()


def negotiated_modes() -> dict[str, str]:
    """``{base_url: output mode}`` remembered so far in this process."""
    with _LOCK:
        return dict(_NEGOTIATED)


def forget_negotiated(base_url: str | None = None) -> None:
    """Forget what one server (or, with None, every server) was found to support."""
    with _LOCK:
        if base_url is None:
            _NEGOTIATED.clear()
        else:
            _NEGOTIATED.pop(base_url, None)


def response_format(mode: str, schema: dict[str, Any] | None, name: str) -> dict | None:
    """The ``response_format`` request field of an output mode (None: send none)."""
    if mode == "text":
        return None
    if mode == "json_object":
        return {"type": "json_object"}
    if schema is None:  # nothing to constrain to: a schema mode degrades to plain JSON
        return {"type": "json_object"}
    if mode == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    raise ValueError(f"unknown structured_output mode {mode!r}; use auto, "
                     f"{', '.join(NEGOTIATION_ORDER)} or json_object")


class SupporterError(Exception):
    """A failed supporter answer, classified by the fallback ``cause`` the loop counts."""

    def __init__(self, cause: str, message: str, raw: str = "", status: int | None = None
                 ) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.message = message
        self.raw = raw
        self.status = status  # the HTTP status of an http_error


class ChatBackend:
    """A thin wrapper around ``openai.OpenAI`` for one role (its model and sampling)."""

    def __init__(self, cfg: RoleConfig, seed: int | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self.last_mode: str | None = None
        api_key = cfg.api_key or os.environ.get(cfg.api_key_env) or "not-needed"
        # deferred: the embedded supporters never reach a server, so a node without the
        # openai package runs them
        import openai

        self.client = openai.OpenAI(base_url=cfg.base_url, api_key=api_key,
                                    timeout=cfg.timeout_s, max_retries=cfg.max_retries)

    def modes(self) -> tuple[str, ...]:
        """Output modes to try, in order, for the next call."""
        want = self.cfg.structured_output
        if want != "auto":
            return (want,)
        with _LOCK:
            known = _NEGOTIATED.get(self.cfg.base_url)
        return (known,) if known else NEGOTIATION_ORDER

    def complete(self, system: str, user: str, schema: dict[str, Any] | None = None,
                 name: str = "answer") -> str:
        """The assistant's answer text; raises ``SupporterError`` on transport failures.

        ``self.last_mode`` says which output mode produced (or last failed to produce) it.
        """
        modes = self.modes()
        for i, mode in enumerate(modes):
            self.last_mode = mode
            final = i == len(modes) - 1
            try:
                text = self._create(system, user, response_format(mode, schema, name),
                                    probe=not final)
            except SupporterError as exc:
                if final or exc.status not in _FORMAT_REJECTED:
                    raise
                continue  # this server does not take this response_format: try the next
            if self.cfg.structured_output == "auto":
                with _LOCK:
                    _NEGOTIATED.setdefault(self.cfg.base_url, mode)
            return text
        raise AssertionError("unreachable: the last mode returns or raises")  # pragma: no cover

    def _create(self, system: str, user: str, fmt: dict | None, probe: bool) -> str:
        import openai  # deferred: see __init__

        kwargs: dict[str, Any] = {}
        if fmt is not None:
            kwargs["response_format"] = fmt
        if self.seed is not None:
            kwargs["seed"] = self.seed
        # a probe of a mode the server may not support is not retried (a 500 is its answer)
        client = self.client.with_options(max_retries=0) if probe else self.client
        try:
            resp = client.chat.completions.create(
                model=self.cfg.model or "", temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": user}], **kwargs)
        except openai.APITimeoutError as exc:  # subclass of APIConnectionError: test first
            raise SupporterError("timeout", f"no answer from {self.cfg.base_url} within "
                                 f"{self.cfg.timeout_s}s ({exc})") from exc
        except openai.APIConnectionError as exc:
            raise SupporterError("unreachable", f"{self.cfg.base_url}: {exc}") from exc
        except openai.APIStatusError as exc:  # 4xx/5xx: unknown model, server error
            raise SupporterError("http_error", f"{self.cfg.base_url} answered HTTP "
                                 f"{exc.status_code}: {str(exc)[:300]}",
                                 status=exc.status_code) from exc
        except (openai.APIError, ValueError) as exc:  # a body that is not a chat completion
            raise SupporterError("malformed", f"unreadable response: {exc!r:.300}") from exc
        except Exception as exc:  # noqa: BLE001 - transport surprises must not end the run
            raise SupporterError("unreachable", f"{type(exc).__name__}: {exc!s:.300}") from exc
        try:
            content = resp.choices[0].message.content
        except (AttributeError, IndexError, TypeError) as exc:
            raise SupporterError("malformed", f"response has no choices[0].message: {resp!r:.300}"
                                 ) from exc
        return content or ""
