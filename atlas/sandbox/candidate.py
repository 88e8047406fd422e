"""Helpers a task evaluator uses *inside a sandbox worker* to load and police candidate code.

A task's evaluator raises ``CandidateError`` to classify a failure (e.g. a wrong return
type); any other exception escaping candidate code is classified as ``exception``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from atlas.types import FailureKind


class CandidateError(Exception):
    """A classified candidate failure; ``kind`` becomes ``Evaluation.failure_kind``."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


#: the name a candidate's module has (``__name__``, ``sys.modules``, classes' ``__module__``)
CANDIDATE_MODULE = "candidate"


def load_candidate(code: str, entry_point: str,
                   namespace: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Compile and execute candidate source as a fresh module and return its entry point.

    The module is a real one, registered in ``sys.modules`` (``@dataclass``, ``typing``'s
    ``get_type_hints``, ``enum`` and pickling look their class's module up there), and the
    code compiles with its own ``__future__`` flags only (``dont_inherit``): this file's
    ``from __future__ import annotations`` must not turn a candidate's annotations into
    strings it never asked for."""
    try:
        compiled = compile(code, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in source
        raise CandidateError(FailureKind.SYNTAX_ERROR, f"{type(exc).__name__}: {exc}") from exc
    module = types.ModuleType(CANDIDATE_MODULE)
    if namespace:
        module.__dict__.update(namespace)
    sys.modules[CANDIDATE_MODULE] = module
    exec(compiled, module.__dict__)  # noqa: S102 - this is the sandbox worker; see atlas/sandbox
    fn = getattr(module, entry_point, None)
    if not callable(fn):
        raise CandidateError(FailureKind.MISSING_ENTRY_POINT,
                             f"the program defines no function named {entry_point!r}")
    return fn
