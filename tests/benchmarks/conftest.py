"""Runs a benchmark script as its command line would (``python benchmarks/NAME.py ARGS``)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def run_benchmark(monkeypatch):
    def run(name: str, *args: str, exit_code: int = 0) -> None:
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
        monkeypatch.syspath_prepend(str(BENCHMARKS))  # its `common`, as when run from the command line
        try:
            runpy.run_path(str(BENCHMARKS / f"{name}.py"), run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code or 0
        assert code == exit_code, f"{name}.py exited with {code}, expected {exit_code}"

    return run
