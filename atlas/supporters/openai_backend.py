"""One chat call to an OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp server, OpenAI).

Transport failures are translated into the fallback causes the loop counts
(``unreachable``: no connection; ``timeout``; ``http_error``: the server answered with an
error status, e.g. an unknown model name or an internal error); the answer text is returned untouched for the role to
parse. Retries are the client's own (bounded by ``max_retries``), so one call costs at
most ``(1 + max_retries) * timeout_s`` seconds.
"""

from __future__ import annotations

import os
from typing import Any

import openai

from atlas.supporters.config import RoleConfig


class SupporterError(Exception):
    """A failed supporter answer, classified by the fallback ``cause`` the loop counts."""

    def __init__(self, cause: str, message: str, raw: str = "") -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.message = message
        self.raw = raw


class ChatBackend:
    """A thin wrapper around ``openai.OpenAI`` for one role (its model and sampling)."""

    def __init__(self, cfg: RoleConfig, seed: int | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        api_key = cfg.api_key or os.environ.get(cfg.api_key_env) or "not-needed"
        self.client = openai.OpenAI(base_url=cfg.base_url, api_key=api_key,
                                    timeout=cfg.timeout_s, max_retries=cfg.max_retries)

    def complete(self, system: str, user: str) -> str:
        """The assistant's answer text; raises ``SupporterError`` on transport failures."""
        kwargs: dict[str, Any] = {}
        if self.cfg.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        if self.seed is not None:
            kwargs["seed"] = self.seed
        try:
            resp = self.client.chat.completions.create(
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
                                 f"{exc.status_code}: {str(exc)[:300]}") from exc
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
