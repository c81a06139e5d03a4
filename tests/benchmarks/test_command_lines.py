"""Every benchmark script starts as its usage line says (``python benchmarks/NAME.py --help``,
its own process, from another folder): its imports resolve and its options parse, on a
machine without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.benchmarks.conftest import BENCHMARKS

SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text() and p.stem != "fast_autotune")


def test_the_list_of_scripts_is_not_empty():
    assert {"bench_op", "bench_model", "check_cuda", "profile_synth", "tune"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_starts_and_prints_its_options(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
