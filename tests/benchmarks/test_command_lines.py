"""Every benchmark script starts as its usage line says (``python benchmarks/NAME.py --help``,
its own process, from another folder): its imports resolve and its options parse, on a
machine without a GPU. srope comes from where this process has it (installed, or PYTHONPATH=src);
without it a script says so in one line. ``srope bench`` runs its script the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import srope
from srope.lab import cli
from tests.benchmarks.conftest import BENCHMARKS

SROPE_ENV = {**os.environ, "PYTHONPATH": str(Path(srope.__file__).resolve().parents[1])}  # the srope under test
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text() and p.stem != "fast_autotune")


def test_the_list_of_scripts_is_not_empty():
    assert {"bench_op", "bench_model", "check_cuda", "profile_synth", "tune"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_starts_and_prints_its_options(name, tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"], cwd=tmp_path, env=SROPE_ENV,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


@pytest.mark.parametrize("name", [*SCRIPTS, "fast_autotune"])
def test_without_srope_a_script_says_how_to_get_it(name, tmp_path):
    """torch importable, srope not (``python -S``: no site-packages and so no .pth of an editable
    install; PYTHONPATH names torch's folder alone): common.py, which every script imports before
    srope, stops with one line that says what to do."""
    site = Path(torch.__file__).resolve().parents[1]
    if (site / "srope").exists():
        pytest.skip(f"srope is installed beside torch in {site}")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-S", str(BENCHMARKS / f"{name}.py"), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr == f"{name}.py: srope is not importable: install srope (pip install -e .) or set PYTHONPATH=src\n"


def test_srope_bench_runs_the_script_in_its_own_process(tmp_path, monkeypatch, capfd):
    """``srope bench LEVEL ARGS`` is ``python benchmarks/bench_LEVEL.py ARGS`` with this srope, from
    any folder; its exit code is the script's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # srope bench names the srope it runs
    assert cli.main(["bench", "op", "--help"]) == 0
    assert "usage: bench_op.py" in capfd.readouterr().out
    assert cli.main(["bench", "layer", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capfd.readouterr().err


def test_srope_bench_without_a_checkout_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site-packages" / "srope" / "lab" / "cli.py"))
    assert cli.main(["bench", "model"]) == 2
    assert "srope bench needs a source checkout" in capsys.readouterr().err
