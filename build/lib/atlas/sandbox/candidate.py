"""Helpers a task evaluator uses *inside a sandbox worker* to load and police candidate code.

A task's evaluator raises ``CandidateError`` to classify a failure (e.g. a wrong return
type); any other exception escaping candidate code is classified as ``exception``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atlas.types import FailureKind


class CandidateError(Exception):
    """A classified candidate failure; ``kind`` becomes ``Evaluation.failure_kind``."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def load_candidate(code: str, entry_point: str,
                   namespace: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Compile and execute candidate source in a fresh namespace and return its entry point."""
    try:
        compiled = compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in source
        raise CandidateError(FailureKind.SYNTAX_ERROR, f"{type(exc).__name__}: {exc}") from exc
    ns: dict[str, Any] = {"__name__": "candidate"}
    if namespace:
        ns.update(namespace)
    exec(compiled, ns)  # noqa: S102 - this is the sandbox worker; see atlas/sandbox
    fn = ns.get(entry_point)
    if not callable(fn):
        raise CandidateError(FailureKind.MISSING_ENTRY_POINT,
                             f"the program defines no function named {entry_point!r}")
    return fn
