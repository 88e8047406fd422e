"""Novelty: is a proposed program new, or a copy of one the run already has?

A small agent asked for "a better version" of the programs in its prompt often writes one of
them out again, and DPO on its own best programs can teach it to (ThetaEvolve's "lazy
output"). A copy costs a sandbox run and teaches nothing, so every proposal is labelled:

- ``copy``: the same program as one already proposed or filed (the database, the prompt's
  parents, an earlier proposal of the round). "The same" is the syntax tree of what can run:
  comments, docstrings and top-level definitions the entry point never reaches are dropped,
  so a supporter's patch with an unused ``policy_v3`` appended is still that patch.
- ``same_behaviour``: new code that behaves as a program already filed on the same equation
  (regime): a rename, a reordering, code that changes nothing the evaluator sees. Where
  both programs have a behaviour fingerprint (``Evaluation.behaviour``: their play on the
  task's public input, ``atlas.sandbox.behaviour``; bandit and bin packing), the
  fingerprints are compared: each program faces hidden inputs of its own, so equal behaviour
  no longer gives equal scores. Where either has none (PINN, records written before), the
  scores are: on the same hidden inputs an equal score means the same play.
- ``constants_only``: new code that differs from a parent in its prompt only in numeric
  literals: the blind tuning EvoReplay finds behind much of the field's gains.
- ``new``: anything else.

``beats_parents``: a program that passed with a score above the best parent in its prompt
(scored on the same equation).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atlas.types import parse_program

COPY, SAME_BEHAVIOUR, CONSTANTS_ONLY, NEW = "copy", "same_behaviour", "constants_only", "new"
LABELS = (COPY, SAME_BEHAVIOUR, CONSTANTS_ONLY, NEW)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
                ast.Assign, ast.AnnAssign)


def _bound_names(stmt: ast.stmt) -> set[str] | None:
    """Names a top-level definition binds; None for a statement that is not a definition
    (it runs when the module loads, so it is always live)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        return {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    return None


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


def live_tree(code: str, entry_point: str | None) -> ast.Module:
    """The program as it can run: no docstrings, and only the top-level definitions that the
    entry point (or a statement that runs at import) reaches. Raises SyntaxError/ValueError
    as ``ast.parse``. Without ``entry_point``, or where the code does not define it, every
    definition is kept."""
    tree = parse_program(code)
    _strip_docstrings(tree)
    bound = [_bound_names(s) for s in tree.body]
    defined = set().union(*(b for b in bound if b))
    if not entry_point or entry_point not in defined:
        return tree
    live: set[str] = {entry_point}
    for stmt, names in zip(tree.body, bound):
        if names is None:
            live |= _names_used(stmt)
    changed = True
    while changed:
        changed = False
        for stmt, names in zip(tree.body, bound):
            if names and names & live:
                new = _names_used(stmt) - live
                if new:
                    live |= new
                    changed = True
    tree.body = [s for s, names in zip(tree.body, bound) if names is None or names & live]
    return tree


def _plain(code: str) -> str:
    return "\n".join(line.strip() for line in code.strip().splitlines() if line.strip())


def program_key(code: str, entry_point: str | None = None) -> str:
    """What makes two programs the same program (module docstring): the dump of their
    ``live_tree``; the stripped text where the code does not parse."""
    try:
        return ast.dump(live_tree(code, entry_point))
    except (SyntaxError, ValueError, RecursionError):
        return _plain(code)


class _Literals(ast.NodeTransformer):
    """Every numeric literal (with its sign) becomes one placeholder."""

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant) \
                and _numeric(node.operand.value):
            return ast.Constant(value="<num>")
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value="<num>") if _numeric(node.value) else node


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def shape_key(code: str, entry_point: str | None = None) -> str | None:
    """``program_key`` with every numeric literal replaced by one placeholder: two programs
    of one shape differ at most in their constants (None where the code does not parse)."""
    try:
        return ast.dump(_Literals().visit(live_tree(code, entry_point)))
    except (SyntaxError, ValueError, RecursionError):
        return None


@dataclass
class Known:
    """A program the index has seen: its id, score (None unless it passed), equation."""

    id: int
    score: float | None
    regime: str


@dataclass
class NoveltyIndex:
    """The programs a run has proposed or filed, by ``program_key``; labels new proposals.

    ``add`` records a program once it is filed (or proposed, for a copy that is not
    evaluated); ``is_copy`` and ``label`` read the index as it stands, so a round's second
    proposal of one program is a copy of its first."""

    entry_point: str | None
    keys: dict[str, int] = field(default_factory=dict)  # program key -> first id
    scores: dict[str, set[float]] = field(default_factory=dict)  # regime -> passed scores
    #: regime -> scores of the passed programs without a behaviour fingerprint
    blind_scores: dict[str, set[float]] = field(default_factory=dict)
    #: regime -> behaviour fingerprints of the passed programs
    behaviours: dict[str, set[str]] = field(default_factory=dict)
    _shapes: dict[int, str | None] = field(default_factory=dict)

    def key(self, code: str) -> str:
        return program_key(code, self.entry_point)

    def copy_of(self, code: str | None, parents: Iterable[Any] = ()) -> int | None:
        """The id of the program ``code`` repeats (an indexed one or a parent), else None.
        Code that could not be extracted (None or empty) repeats nothing."""
        if not code:
            return None
        k = self.key(code)
        if k in self.keys:
            return self.keys[k]
        for p in parents:
            if self.key(p.code) == k:
                return int(p.id)
        return None

    def same_behaviour(self, score: float | None, regime: str,
                       behaviour: str | None = None) -> bool:
        """Whether a passed program behaves as one already indexed on ``regime``: its
        fingerprint against theirs, its score against those of programs that have none;
        without a fingerprint, its score against every one (module docstring)."""
        if score is None or not math.isfinite(score):
            return False
        if behaviour is None:
            return score in self.scores.get(regime, ())
        return (behaviour in self.behaviours.get(regime, ())
                or score in self.blind_scores.get(regime, ()))

    def label(self, code: str | None, score: float | None, regime: str,
              parents: Sequence[Any] = (), behaviour: str | None = None) -> str:
        """The label of a program not yet added (module docstring); ``score`` None when it
        failed or was not evaluated, ``behaviour`` its fingerprint where it has one."""
        if self.copy_of(code, parents) is not None:
            return COPY
        if self.same_behaviour(score, regime, behaviour):
            return SAME_BEHAVIOUR
        if code:
            shape = shape_key(code, self.entry_point)
            if shape is not None and any(shape == self._shape(p) for p in parents):
                return CONSTANTS_ONLY
        return NEW

    def _shape(self, p: Any) -> str | None:
        pid = int(p.id)
        if pid not in self._shapes:
            self._shapes[pid] = shape_key(p.code, self.entry_point)
        return self._shapes[pid]

    def add(self, pid: int, code: str | None, score: float | None, regime: str,
            behaviour: str | None = None) -> None:
        if code:
            self.keys.setdefault(self.key(code), int(pid))
        if score is not None and math.isfinite(score):
            self.scores.setdefault(regime, set()).add(float(score))
            if behaviour is None:
                self.blind_scores.setdefault(regime, set()).add(float(score))
            else:
                self.behaviours.setdefault(regime, set()).add(behaviour)

    def add_program(self, p: Any) -> None:
        """Index a filed ``Program`` (its score and fingerprint only if it passed)."""
        passed = p.passed
        self.add(p.id, p.code, p.score if passed else None, p.regime,
                 p.evaluation.behaviour if passed else None)


def beats_parents(score: float | None, regime: str, parents: Sequence[Any]) -> bool | None:
    """Whether a passing ``score`` is above the best parent scored on the same equation;
    None where no parent was (the question has no answer), False when it failed."""
    same = [p.score for p in parents
            if p.passed and p.regime == regime and math.isfinite(p.score)]
    if not same:
        return None
    return score is not None and math.isfinite(score) and score > max(same)


def tally(programs: Sequence[dict[str, Any]], skipped: Sequence[Any] = ()) -> dict[str, Any]:
    """Novelty counts of one writer's proposals: ``programs`` as ``programs.jsonl`` records
    them (evaluated), ``skipped`` the copies that were not evaluated. ``new_valid``: new and
    passed; ``new_beats_parents``: new, passed and above the best parent; ``beats_parents``:
    passed and above the best parent whatever its label, so blind tuning (all
    ``constants_only``, never ``new``) can be measured on it too."""
    labels = {label: 0 for label in LABELS}
    for p in programs:
        key = p.get("novelty") or "unlabelled"
        labels[key] = labels.get(key, 0) + 1
    labels[COPY] += len(skipped)
    evaluated, proposals = len(programs), len(programs) + len(skipped)
    passed = [p for p in programs if (p.get("evaluation") or {}).get("passed")]
    new_valid = [p for p in passed if p.get("novelty") == NEW]

    def share(n: int, d: int) -> float | None:
        return n / d if d else None
    return {"proposals": proposals, "evaluated": evaluated, "labels": labels,
            "copies": labels[COPY], "copy_rate": share(labels[COPY], proposals),
            "valid": len(passed), "valid_rate": share(len(passed), evaluated),
            "new_share_of_evaluated": share(labels[NEW], evaluated),
            "new_valid": len(new_valid), "new_valid_per_proposal": share(len(new_valid), proposals),
            "new_beats_parents": sum(1 for p in new_valid if p.get("beats_parents")),
            "beats_parents": sum(1 for p in passed if p.get("beats_parents") is True)}


def labelled(programs: Sequence[dict[str, Any]], entry_point: str | None
             ) -> list[dict[str, Any]]:
    """``programs.jsonl`` records with ``novelty`` and ``beats_parents``: a record's own
    labels where it has them, else those a run would have given it, replayed in id order
    (records written before labels existed)."""
    index = NoveltyIndex(entry_point)
    by_id: dict[int, Any] = {}
    out = []
    for rec in sorted(programs, key=lambda p: int(p["id"])):
        rec = dict(rec)
        ev = rec.get("evaluation") or {}
        passed = bool(ev.get("passed")) and ev.get("score") is not None
        score = float(ev["score"]) if passed else None
        behaviour = ev.get("behaviour") if passed and isinstance(ev.get("behaviour"), str) \
            else None
        view = _View(int(rec["id"]), rec.get("code") or "", score, rec.get("regime", ""))
        if rec.get("source", "agent") in ("agent", "supporter") and not rec.get("novelty"):
            parents = [by_id[int(i)] for i in rec.get("parents") or [] if int(i) in by_id]
            rec["novelty"] = index.label(view.code, score, view.regime, parents, behaviour)
            rec["beats_parents"] = beats_parents(score, view.regime, parents)
        index.add(view.id, view.code, score, view.regime, behaviour)
        by_id[view.id] = view
        out.append(rec)
    return out


@dataclass
class _View:
    """What labelling reads of a program record (the attributes a ``Program`` has)."""

    id: int
    code: str
    score_or_none: float | None
    regime: str

    @property
    def passed(self) -> bool:
        return self.score_or_none is not None

    @property
    def score(self) -> float:
        return self.score_or_none if self.score_or_none is not None else -math.inf
