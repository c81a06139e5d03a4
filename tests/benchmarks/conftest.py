"""Runs a benchmark script as its command line would (``python benchmarks/NAME.py ARGS``)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def as_from_the_command_line(monkeypatch) -> None:
    """What Python does for ``python benchmarks/NAME.py``: the script's folder first on sys.path,
    where its neighbours are (``from common import ...``), here for one test and undone after it.
    The tests' one change to sys.path (tests/test_no_sys_path.py); test_command_lines.py starts
    every script in a process of its own instead."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.fixture
def run_benchmark(monkeypatch):
    def run(name: str, *args: str, exit_code: int = 0) -> None:
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
        as_from_the_command_line(monkeypatch)
        try:
            runpy.run_path(str(BENCHMARKS / f"{name}.py"), run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code or 0
        assert code == exit_code, f"{name}.py exited with {code}, expected {exit_code}"

    return run
