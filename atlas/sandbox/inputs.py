"""Hidden inputs of a program's own: why no candidate's score can be forged by a relay.

A runner cannot be kept from leaving marks in the kernel's shared caches (names looked up
that do not exist, pages read): timing reads them back in the next candidate, so a candidate
can pass what it learnt of the hidden inputs (a bandit's drifting parameters estimated in
hindsight, bin packing's scored items) to the next one, which then plays them. Instead of
closing every such channel, the payoff is removed: a task that shows a runner anything
derived from its secret draws those hidden inputs from the secret *and the program*
(``program_key``), so a relay carries what one program saw to a program that faces other
inputs, and is worth nothing there.

The key is the hash of the program's syntax tree with docstrings dropped: the same program
with other comments, blank lines or docstrings faces the same inputs (an optimiser cannot
keep the luckiest of copies that differ only in a comment), and ``Sandbox`` scores a program
at most once per regime (the context without its round; its first ``Evaluation`` is returned
again), so a program cannot relay to a later run of itself either.

``INPUTS_OF`` is a context key only the trusted caller sets (tests, measurements): it makes a
program face the inputs of another program key, e.g. to score an honest fallback on an
attack's own inputs.
"""

from __future__ import annotations

import ast
import hashlib
import json
from typing import Any

#: context key a trusted caller sets to score a program on another program key's inputs
INPUTS_OF = "inputs_of"


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def program_key(code: str) -> str:
    """A 32-hex-digit key of ``code`` that ignores comments, layout and docstrings (its
    syntax tree); the text's own hash where it does not parse (it fails anyway)."""
    try:
        normal = ast.dump(_strip_docstrings(ast.parse(code)), annotate_fields=False)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        normal = "unparsed:" + code
    return hashlib.sha256(normal.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def inputs_key(code: str, context: dict[str, Any]) -> str:
    """Which program's hidden inputs ``code`` faces in ``context``: its own key, or the key
    a trusted caller named (``INPUTS_OF``)."""
    named = context.get(INPUTS_OF)
    return str(named) if isinstance(named, str) and named else program_key(code)


def evaluation_key(code: str, context: dict[str, Any]) -> str:
    """What ``Sandbox`` scores at most once: the program key and the regime, the context
    without its round (``atlas.evolution.evaluation.regime_key``: a score depends on the
    regime, never on the round; a program's inputs do not change between rounds, so a later
    round's run of it could read what an earlier one relayed)."""
    regime = {k: v for k, v in context.items() if k != "round"}
    return program_key(code) + ":" + json.dumps(regime, sort_keys=True, default=str)
