"""``benchmarks/tune.py``: the tuner's command line (its sweeps need a CUDA GPU)."""

from __future__ import annotations

import pytest
import torch


def test_the_tuner_offers_both_sweeps(run_benchmark, capsys):
    run_benchmark("tune", "--help")
    usage = capsys.readouterr().out
    assert "rotation" in usage and "projection" in usage
    run_benchmark("tune", "rotation", "--help")
    assert "--scan-only" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
@pytest.mark.parametrize("sweep", ["rotation", "projection"])
def test_the_tuner_says_it_needs_a_gpu(run_benchmark, capsys, tmp_path, sweep):
    run_benchmark("tune", sweep, "--out", str(tmp_path / "t.json"), exit_code=2)
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
