"""The seams between atlas's parts stay narrow and typed.

A constructor that takes more than ``MAX_PARAMETERS`` parameters is a seam where callers pass
positional settings in the wrong order without an error; related settings go in a small
typed dataclass instead (``PhaseSettings``, ``StepShape``). The supporters' requests read
the task's quality metrics through typed views, never a ``getattr``/``.get`` fallback that
turns a mistyped declaration into a metric named ``None``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from atlas.supporters import requests as sreq
from atlas.supporters.schemas import QualityMetricView
from atlas.tasks.base import QualityMetric

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


def test_requests_read_quality_metrics_through_typed_views_only() -> None:
    source = (ROOT / "atlas" / "supporters" / "requests.py").read_text()
    assert "_get(" not in source


def test_quality_views_of_every_declared_form_agree() -> None:
    """A task's ``QualityMetric`` tuple, its ``metric_directions()`` mapping, views and
    mappings of fields all give the same views; anything else is refused by name."""
    declared = (QualityMetric("nmr", "max", "normalised regret"),
                QualityMetric("val_ic", "min"))
    views = sreq.quality_views(declared)
    assert views == [QualityMetricView(name="nmr", direction="max",
                                       description="normalised regret"),
                     QualityMetricView(name="val_ic", direction="min", description="")]
    assert sreq.quality_views(views) == views
    assert sreq.quality_views([{"name": "nmr", "direction": "max",
                                "description": "normalised regret"},
                               {"name": "val_ic", "direction": "min"}]) == views
    by_name = sreq.quality_views({"nmr": "max", "val_ic": "min"})
    assert [(v.name, v.direction) for v in by_name] == [("nmr", "max"), ("val_ic", "min")]
    assert sreq.quality_views(None) == sreq.quality_views(()) == []
    with pytest.raises(TypeError, match="not tuple"):
        sreq.quality_views([("nmr", "max")])
