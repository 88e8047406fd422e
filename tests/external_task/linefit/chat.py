"""A supporter chat backend from outside atlas (``supporters.strategist.backend=linefit.chat.
Scripted``): it answers from a script instead of a model, which is what a lab's own
in-process model or API client would put behind the same two members. atlas parses, bounds
and counts its answers exactly like an OpenAI-compatible server's."""

from __future__ import annotations

import json
from typing import Any

from atlas.supporters.openai_backend import SupporterError


class Scripted:
    """Answers role ``<name>`` with ``ANSWERS[name]``; a role without an answer is a failure
    the role falls back from (cause ``unreachable``)."""

    ANSWERS: dict[str, dict[str, Any]] = {
        "strategist_answer": {"beta": 0.2, "rationale": "scripted: sharper preferences"},
    }

    def __init__(self, cfg: Any, seed: int = 0) -> None:
        self.cfg, self.seed = cfg, seed
        self.last_mode: str | None = None

    def complete(self, system: str, user: str, schema: dict | None = None,
                 name: str = "answer") -> str:
        self.last_mode = "scripted"
        if name not in self.ANSWERS:
            raise SupporterError("unreachable", f"no scripted answer for {name}", "")
        return json.dumps(self.ANSWERS[name])
