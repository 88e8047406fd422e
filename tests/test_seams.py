"""The seams between atlas's parts stay narrow and typed.

A constructor that takes more than ``MAX_PARAMETERS`` parameters is a seam where callers pass
positional settings in the wrong order without an error; related settings go in a small
typed dataclass instead (``PhaseSettings``, ``StepShape``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_PARAMETERS = 10


def _init_parameters(fn: ast.FunctionDef) -> int:
    """Parameters a caller may pass: all of them, ``*args`` and ``**kwargs`` included, less
    ``self``."""
    a = fn.args
    return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
            + (a.kwarg is not None) - 1)


def constructors(root: Path) -> dict[str, int]:
    """``{"path:Class": parameters}`` of every hand-written ``__init__`` under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    found[f"{path.relative_to(root.parent)}:{node.name}"] = _init_parameters(fn)
    return found


def test_no_constructor_in_atlas_takes_more_than_ten_parameters() -> None:
    found = constructors(ROOT / "atlas")
    assert len(found) >= 50  # the walk saw the package, not an empty folder
    assert found["atlas/agent/graph_step.py:DecodeStep"] == 6
    assert found["atlas/fine_tuning.py:FineTuner"] == 6
    over = {k: n for k, n in found.items() if n > MAX_PARAMETERS}
    assert over == {}, f"group related settings in a typed dataclass: {over}"


def test_the_check_counts_every_kind_of_parameter(tmp_path: Path) -> None:
    """A check that cannot fail is no check: eleven parameters of mixed kinds are counted."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "wide.py").write_text(
        "class Wide:\n"
        "    def __init__(self, a, /, b, c, *args, d, e, f, g, h, i, **kw):\n"
        "        pass\n")
    assert constructors(pkg) == {"pkg/wide.py:Wide": 11}
