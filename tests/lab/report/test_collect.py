"""Where ``srope report`` looks for results: a bounded walk (no system trees, no hidden folders,
a depth limit, no symlink loops), and a folder without results is an error, not an empty report."""

from __future__ import annotations

import json
import os
import time

import pytest

from srope.lab.cli import main
from srope.lab.report.collect import MAX_DEPTH, _json_files

from .conftest import build_fixture


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("where", ["/", "/etc", "/usr", "/proc"])
def test_the_filesystem_root_and_system_trees_are_refused_at_once(where, tmp_path, capsys):
    """`srope report /` walked the whole filesystem; `/etc` wrote a full "no results" report and exited 0."""
    began = time.perf_counter()
    assert main(["report", where, "--out", str(tmp_path / "r")]) == 2
    assert time.perf_counter() - began < 2
    line = _error_line(capsys)
    assert line.startswith("srope report: error: ") and "system folder" in line and where in line, line
    assert not (tmp_path / "r").exists()


def test_a_folder_without_results_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.json").write_text(json.dumps({"not": "a result"}))
    for folder in ("empty", "other"):
        assert main(["report", str(tmp_path / folder), "--out", str(tmp_path / "r")]) == 2
        line = _error_line(capsys)
        assert f"no results under {tmp_path / folder}" in line and "srope synth" in line, line
    assert not (tmp_path / "r").exists()


def test_the_walk_skips_hidden_and_too_deep_folders_and_survives_a_symlink_loop(tmp_path):
    root = build_fixture(tmp_path / "results")
    found = _json_files([root])
    assert root.resolve() / "synthetic" / "copy-nope" / "results.json" in found
    hidden = root / ".venv" / "lib" / "results.json"
    hidden.parent.mkdir(parents=True)
    hidden.write_text("{}")
    deep = root.joinpath(*[f"d{i}" for i in range(MAX_DEPTH + 1)], "results.json")
    deep.parent.mkdir(parents=True)
    deep.write_text("{}")
    ok = root.joinpath(*[f"d{i}" for i in range(MAX_DEPTH - 1)], "results.json")
    ok.write_text("{}")
    os.symlink(root, root / "synthetic" / "loop")
    began = time.perf_counter()
    again = _json_files([root])
    assert time.perf_counter() - began < 2
    assert hidden.resolve() not in again and deep.resolve() not in again and ok.resolve() in again
    assert set(found) | {ok.resolve()} == set(again)  # the loop adds nothing twice
