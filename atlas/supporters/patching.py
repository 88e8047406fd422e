"""Source-level code edits the embedded exploration rule makes, found with ``ast``.

Edits are applied to the original text by character offsets (not ``ast.unparse``) so the
agent's comments and layout survive: patched programs go back into prompts the small agent
reads, and a reformatted program would look like a different one to it.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass

from atlas.evolution.extract import find_entry_point, parse

#: names that mark a numeric constant as a loop bound/index rather than a hyper-parameter
_NON_HYPER = {"range", "len", "zeros", "ones", "empty", "eye", "reshape", "shape", "argmax",
              "argmin", "round", "int", "print"}
ROBUST_MARKERS = re.compile(r"huber|clip|clamp|smooth_l1|log1p|pseudo", re.IGNORECASE)
HELPER = "_atlas_pseudo_huber"
HELPER_SRC = (
    f"def {HELPER}(x, delta=1.0):\n"
    "    # smooth Huber (added by the exploration supporter): quadratic near 0, linear in\n"
    "    # the tails, so one exploding component cannot dominate the gradient\n"
    "    return delta ** 2 * ((1.0 + (x / delta) ** 2) ** 0.5 - 1.0)\n\n\n"
)


@dataclass(frozen=True)
class NumericSite:
    """A numeric literal that looks like a tunable hyper-parameter."""

    name: str  # the variable/keyword/attribute it is bound to, for the critique
    value: float
    is_int: bool
    start: tuple[int, int]  # (line, col) of the literal, 1-based lines, 0-based cols
    end: tuple[int, int]


def _bound_name(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
        return str(target.slice.value)
    return None


def _literal(node: ast.AST | None) -> ast.Constant | None:
    """A plain int/float literal (not bool), positive only: signs are semantic, not tunable."""
    if (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool) and node.value > 0):
        return node
    return None


def _tunable(value: float, is_int: bool) -> bool:
    # 0 and 1 ints are almost always indices, flags or identities, not hyper-parameters
    return not (is_int and value < 2)


def find_numeric_sites(code: str) -> list[NumericSite]:
    """Numeric literals bound to a name (``w = 50``, ``self.lam = 0.1``, ``f(alpha=2.0)``,
    ``def f(x, window=50)``) in source order. Returns [] for code that does not parse."""
    tree = parse(code)
    if tree is None:
        return []
    found: list[tuple[str, ast.Constant]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lit = _literal(node.value)
            name = _bound_name(targets[0]) if len(targets) == 1 else None
            if lit is not None and name is not None:
                found.append((name, lit))
            elif (len(targets) == 1 and isinstance(targets[0], ast.Tuple)
                  and isinstance(node.value, ast.Tuple)
                  and len(targets[0].elts) == len(node.value.elts)):
                # ``window, alpha, lam = 50, 1.0, 1.0``: one site per element
                for target, value in zip(targets[0].elts, node.value.elts):
                    lit, name = _literal(value), _bound_name(target)
                    if lit is not None and name is not None:
                        found.append((name, lit))
        elif isinstance(node, ast.Call):
            fname = _bound_name(node.func) or ""
            if fname in _NON_HYPER:
                continue
            for kw in node.keywords:
                lit = _literal(kw.value)
                if lit is not None and kw.arg:
                    found.append((kw.arg, lit))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults))
            defaults += list(node.args.defaults) + list(node.args.kw_defaults)
            for arg, default in zip(args, defaults):
                lit = _literal(default)
                if lit is not None:
                    found.append((arg.arg, lit))
    sites = []
    for name, lit in found:
        is_int = isinstance(lit.value, int)
        if _tunable(float(lit.value), is_int) and lit.end_lineno is not None:
            sites.append(NumericSite(name, float(lit.value), is_int,
                                     (lit.lineno, lit.col_offset),
                                     (lit.end_lineno, lit.end_col_offset or 0)))
    sites.sort(key=lambda s: s.start)
    return sites


def _replace(code: str, start: tuple[int, int], end: tuple[int, int], text: str) -> str:
    lines = code.splitlines(keepends=True)

    def char_offset(pos: tuple[int, int]) -> int:  # ast columns are UTF-8 byte offsets
        line, col = pos
        prefix = lines[line - 1].encode()[:col].decode(errors="ignore")
        return sum(len(x) for x in lines[: line - 1]) + len(prefix)

    a, b = char_offset(start), char_offset(end)
    return code[:a] + text + code[b:]


def format_number(value: float, is_int: bool) -> str:
    """A short literal of the same type: ints stay ints (>= 1), floats keep 3 significant
    digits and a decimal point or exponent (``5.0``, not ``5``)."""
    if is_int:
        return str(max(1, int(round(value))))
    text = repr(float(f"{value:.3g}"))
    return text


def perturb(code: str, site: NumericSite, factor: float) -> tuple[str, str]:
    """Scale one literal by ``factor``; returns (new code, new literal text)."""
    new_value = site.value * factor
    if site.is_int and int(round(new_value)) == int(site.value):  # 2 * 0.5 -> 1 ... keep moving
        new_value = site.value + (1 if factor > 1 else -1)
    text = format_number(new_value, site.is_int)
    return _replace(code, site.start, site.end, text), text


def add_robust_loss(code: str, entry_point: str) -> str | None:
    """Replace squared terms (``x ** 2``, ``square(x)``) inside the entry point with a smooth
    Huber, unless the program already clips/robustifies. None if nothing applies."""
    if ROBUST_MARKERS.search(code):
        return None
    fn = find_entry_point(code, entry_point)
    if fn is None:
        return None
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for node in ast.walk(fn):
        inner: ast.AST | None = None
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)
                and isinstance(node.right, ast.Constant) and node.right.value == 2):
            inner = node.left
        elif (isinstance(node, ast.Call) and (_bound_name(node.func) or "") == "square"
              and len(node.args) == 1 and not node.keywords):
            inner = node.args[0]
        if inner is not None and node.end_lineno is not None:
            src = ast.get_source_segment(code, inner)
            if src:
                edits.append(((node.lineno, node.col_offset),
                              (node.end_lineno, node.end_col_offset or 0),
                              f"{HELPER}({src})"))
    # outermost edits only, applied back to front so offsets stay valid
    edits.sort(key=lambda e: (e[0], (-e[1][0], -e[1][1])))
    kept: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for e in edits:
        if kept and e[0] < kept[-1][1]:
            continue
        kept.append(e)
    if not kept:
        return None
    for start, end, text in reversed(kept):
        code = _replace(code, start, end, text)
    lines = code.splitlines(keepends=True)
    first = fn.lineno - 1 - len(fn.decorator_list)
    patched = "".join(lines[:first]) + HELPER_SRC + "".join(lines[first:])
    with warnings.catch_warnings():  # the candidate's own invalid escapes: not the host's to print
        warnings.simplefilter("ignore")
        compile(patched, "<patch>", "exec")  # a bug here must not reach the loop silently
    return patched


def normalise(code: str) -> str:
    """Code with comments/whitespace/docstrings removed, to tell programs apart."""
    tree = parse(code)
    return " ".join(code.split()) if tree is None else ast.dump(tree)
