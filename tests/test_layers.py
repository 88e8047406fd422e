"""The house has no import circle and no import that climbs back up.

The layers are the table under "## Layers" in docs/architecture.md, parsed here, so the doc
and the code cannot drift apart. Every module under atlas/ is read with ``ast``: imports in
function bodies and under ``if TYPE_CHECKING`` count, since a deferred import still ties the
two modules together.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the atlas package by its dotted name (a package by its own name)."""
    out = {}
    for path in sorted((root / "atlas").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_map(text: str) -> dict[str, int]:
    """Module prefix -> layer number, from the table under "## Layers"."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, int] = {}
    for row in re.findall(r"^\| *(\d+)[^|]*\|(.*)\|$", section, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", row[1]):
            assert name not in out, f"{name} is listed twice under ## Layers"
            out[name] = int(row[0])
    return out


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the longest listed name that is ``module`` or a package holding it."""
    name = module
    while name:
        if name in layers:
            return layers[name]
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The atlas modules that ``module`` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # ``from pkg import sub`` imports the module pkg.sub; ``from mod import name`` mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("atlas") and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer_and_every_listed_name_exists() -> None:
    layers = layer_map(DOC.read_text())
    known = modules()
    assert [m for m in known if layer_of(m, layers) is None] == []
    assert [name for name in layers if name not in known] == []


def test_no_module_imports_a_higher_layer() -> None:
    layers = layer_map(DOC.read_text())
    upward = [f"{m} (layer {layer_of(m, layers)}) imports {t} (layer {layer_of(t, layers)})"
              for m, targets in sorted(graph().items()) for t in sorted(targets)
              if layer_of(t, layers) > layer_of(m, layers)]
    assert upward == []


def test_no_import_circle() -> None:
    assert cycles(graph()) == []


def test_the_checks_see_a_circle_and_a_deferred_import(tmp_path: Path) -> None:
    """The reader finds an import in a function body and under TYPE_CHECKING, and Tarjan
    finds a circle of three."""
    pkg = tmp_path / "atlas"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from atlas.b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from atlas import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    known = modules(tmp_path)
    edges = {m: imports(m, p, known) for m, p in known.items()}
    assert edges["atlas.a"] == {"atlas.b"} and edges["atlas.b"] == {"atlas.c"}
    assert edges["atlas.c"] == {"atlas.a"}
    assert cycles(edges) == [["atlas.a", "atlas.b", "atlas.c"]]
    assert layer_of("atlas.tasks.__main__", {"atlas.tasks": 3, "atlas.tasks.__main__": 10}) == 10


def _is_atlas(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "atlas" for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == "atlas"
    return False


def deferred_imports(path: Path) -> list[tuple[int, str]]:
    """(line, source) of each import of an atlas module inside a function body that carries no
    comment on its line or above its block of imports: a function-level import must say what
    heavy dependency it defers, never dodge a cycle in silence."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for fn in ast.walk(ast.parse(text, str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for holder in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(holder, field, None)
                if not isinstance(block, list):
                    continue
                first = last = None  # the run of adjacent imports (no blank line) it is in
                for stmt in block:
                    if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        first = None
                        continue
                    if first is None or stmt.lineno != last.end_lineno + 1:
                        first = stmt
                    last = stmt
                    above = lines[first.lineno - 2].strip() if first.lineno > 1 else ""
                    said = "#" in lines[stmt.lineno - 1] or above.startswith("#")
                    if _is_atlas(stmt) and not said:
                        out.append((stmt.lineno, lines[stmt.lineno - 1].strip()))
    return sorted(set(out))

def test_a_function_level_import_says_what_it_defers() -> None:
    """No import hides in a function body to dodge a cycle: one is kept only where it defers a
    heavy dependency (torch, transformers, ...), and a comment says so."""
    silent = [f"{path.relative_to(ROOT)}:{line}: {src}"
              for path in modules().values() for line, src in deferred_imports(path)]
    assert silent == []


def test_the_check_sees_a_silent_deferred_import(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from atlas.b import x\n"
                    "def g():\n    # deferred: loads torch\n    from atlas.c import y\n"
                    "    import atlas.d\n    import json\n    x = 1\n    import atlas.e\n"
                    "    import atlas.f  # deferred: loads peft\n    import json\n\n"
                    "    from atlas import g\n")
    assert deferred_imports(path) == [(2, "from atlas.b import x"), (9, "import atlas.e"),
                                      (13, "from atlas import g")]
