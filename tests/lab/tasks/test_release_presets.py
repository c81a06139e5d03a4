"""Each release-exact preset equals the table of docs/release-presets.md, field by field, and a
run records whether it left the release."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from srope.lab.tasks import release
from srope.lab.tasks.runner import get_task, resolve_preset
from srope.lab.tasks.zoology_model import ZoologyConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "release-presets.md"
SECTION = re.compile(r"^## (\w+) --preset (\w+)$")
ROW = re.compile(r"^\| `([\w.]+)` \| `(.+?)` \| (.+) \|$")


def cited() -> dict[tuple[str, str], list[tuple[str, object, str]]]:
    """``{(task, preset): [(field, value, source), ...]}`` from the page's tables."""
    out: dict = {}
    current = None
    for line in DOC.read_text().splitlines():
        if match := SECTION.match(line):
            current = out.setdefault(match.groups(), [])
        elif line.startswith("## "):
            current = None
        elif current is not None and (match := ROW.match(line)):
            field, value, source = match.groups()
            current.append((field, json.loads(value), source))
    return out


def preset_values(task: str, preset: str) -> dict[str, object]:
    """The preset's fields flattened as the page names them; a Zoology model's unset options
    take ``ZoologyConfig``'s defaults."""
    cfg = resolve_preset(task, preset)
    flat = release._flat(cfg.to_dict())
    if cfg.architecture == "zoology":
        for f in dataclasses.fields(ZoologyConfig):
            flat.setdefault(f"model.{f.name}", list(f.default) if isinstance(f.default, tuple) else f.default)
    return flat


def mismatches(values: dict[str, object], rows) -> list[str]:
    return [f"{field}: page {value!r}, preset {values.get(field, '(missing)')!r}" for field, value, _ in rows
            if field not in values or values[field] != value or isinstance(values[field], bool) != isinstance(value, bool)]


SECTIONS = cited()


def test_the_page_covers_every_release_preset():
    expected = {(task, name) for task in ("mqar", "copying", "state_tracking", "mad") for name in getattr(get_task(task), "RELEASE_PRESETS", ())}
    assert set(SECTIONS) == expected
    assert all(len(rows) >= 25 for rows in SECTIONS.values())


@pytest.mark.parametrize("task,preset", sorted(SECTIONS))
def test_a_release_preset_equals_its_cited_table(task, preset):
    rows = SECTIONS[(task, preset)]
    assert all(re.search(r"[\w/.-]+\.(py|yaml|md):\d+", source) for _, _, source in rows), "every row cites a file and line"
    assert mismatches(preset_values(task, preset), rows) == []


@pytest.mark.parametrize("task,preset", sorted(SECTIONS))
def test_changing_any_cited_field_is_caught(task, preset):
    rows = SECTIONS[(task, preset)]
    values = preset_values(task, preset)
    for field, value, _ in rows:
        changed = {**values, field: ["changed"] if isinstance(value, list) else not value if isinstance(value, bool) else "changed"}
        assert mismatches(changed, rows), field


def test_a_run_records_how_it_leaves_the_release():
    copying = get_task("copying")
    arm = resolve_preset("copying", "release", {"position.gate": "standard", "position.bias": True, "seeds": "[0, 1, 2]", "max_steps": 10})
    assert release.differences(copying, "release", arm) == []  # a released arm; max_steps is budget, judged by the report
    off = resolve_preset("copying", "release", {"position.gate": "per-channel", "init": "model"})
    assert release.differences(copying, "release", off) == ["init: 'release' -> 'model'", "position.selective_rope.gate: None -> 'per-channel'"]
    assert release.differences(copying, "authors", resolve_preset("copying", "authors")) is None
