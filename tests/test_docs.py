"""The configuration reference stays generated from conf/ and the schemas, and every field
is described somewhere (its YAML comment or its schema), so docs/configuration.md can be
regenerated instead of edited."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from atlas import docs

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / docs.OUTPUT


def test_configuration_reference_is_current() -> None:
    expected = docs.render_config(ROOT / "conf")
    assert REFERENCE.read_text() == expected, (
        "docs/configuration.md is stale: regenerate it with "
        "`python -m atlas.docs config > docs/configuration.md`")


def test_every_schema_field_and_task_field_has_a_description() -> None:
    assert docs.missing_descriptions(ROOT / "conf") == []


def test_every_schema_field_is_in_the_reference() -> None:
    text = REFERENCE.read_text()
    for owner, spec in docs.SCHEMAS.items():
        prefix = f"{owner}." if owner else ""
        for name in docs.schema_fields(docs.load_schema(spec)):
            assert f"`{prefix}{name}`" in text or (
                owner.startswith("supporters.") and f"`supporters.{name}`" in text), (
                f"{prefix}{name} is not in docs/configuration.md")


def test_a_yaml_comment_reaches_the_reference_and_a_stale_copy_is_caught(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    gate = conf / "gate" / "default.yaml"
    text = gate.read_text()
    assert "# KL trust region" in text
    gate.write_text(text.replace("# KL trust region", "# KL budget of a promotion"))
    changed = docs.render_config(conf)
    assert ("| `gate.delta` | `0.05` | number >= 0 | KL budget of a promotion: accept only if "
            "KL(cand \\|\\| ref) <= delta (nats/token) |") in changed
    assert changed != REFERENCE.read_text()


def test_a_field_without_a_description_is_reported(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    bandit = conf / "task" / "bandit.yaml"
    bandit.write_text(bandit.read_text() + "new_knob: 3\n")
    assert docs.missing_descriptions(conf) == ["task=bandit: task.new_knob"]


@pytest.mark.parametrize(("line", "key", "value", "comment"), [
    ("beta: 0.1   # inverse temperature", "beta", "0.1", "inverse temperature"),
    ("url: 'http://x/#frag'  # a quoted # stays", "url", "'http://x/#frag'", "a quoted # stays"),
    ("  - task: bandit  # the task", "defaults.task", "bandit", "the task"),
])
def test_read_yaml_doc_attaches_inline_comments(tmp_path: Path, line: str, key: str,
                                               value: str, comment: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(("defaults:\n" if line.startswith("  -") else "") + line + "\n")
    doc = docs.read_yaml_doc(path)
    assert doc.raw[key] == value and doc.comment[key] == comment


def test_read_yaml_doc_continuations_blocks_and_sections(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        "# @package _global_\n"
        "# The header.\n"
        "\n"
        "a: 1          # first line\n"
        "              # continued\n"
        "# heads the section of b\n"
        "b: 2          # b's own\n"
        "group:\n"
        "  # says why c\n"
        "  c: 3\n")
    doc = docs.read_yaml_doc(path)
    assert doc.header == "The header."
    assert doc.comment["a"] == "first line continued"
    assert doc.comment["b"] == "b's own" and doc.section["b"] == "heads the section of b"
    assert doc.comment["group.c"] == "says why c"


def test_type_text_reads_the_schema_bounds() -> None:
    from atlas.dpo.config import GateConfig
    from atlas.schema import ExploreConfig

    assert docs.field_type(GateConfig, "holdout") == "number > 0, < 1"
    assert docs.field_type(GateConfig, "bound") == "bc | percentile | normal"
    assert docs.field_type(ExploreConfig, "agent_threads") == "integer >= 1 or null"
    assert docs.field_type(ExploreConfig, "workers") == "integer >= 1 or auto"
    assert docs.field_type(ExploreConfig, "temperature_bounds") == "[number, number]"
