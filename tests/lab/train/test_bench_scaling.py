"""``benchmarks/bench_scaling.py`` on the CPU (gloo): its plumbing, not its numbers."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import as_from_the_command_line

ROOT = Path(__file__).resolve().parents[3]


def test_bench_scaling_runs_torchrun_and_compares_with_one_process(store, tmp_path, monkeypatch):
    out = tmp_path / "scaling.json"
    jobs = "gla-tiny:selective_rope:1:ddp,gla-tiny:selective_rope:2:ddp,gla-tiny:nope:999:ddp"
    argv = ["bench_scaling.py", "--data", store, "--device", "cpu", "--jobs", jobs, "--batch", "4", "--micro", "1",
            "--length", "32", "--steps", "3", "--skip", "1", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    as_from_the_command_line(monkeypatch)  # its `common`
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_scaling.py"), run_name="__main__")
    assert done.value.code == 0
    report = json.loads(out.read_text())
    one, two, three = report["runs"]
    assert report["environment"]["commit"] and "torch" in report["environment"]
    assert one["efficiency"] == 1.0 and len(one["loss"]) == 3 and not one["cuda_graph"]  # no graph on the CPU
    assert two["gpus"] == 2 and two["tokens_per_s_per_gpu"] == two["tokens_per_s"] / 2
    assert two["max_loss_diff_vs_1gpu"] < 1e-4  # the same global batch: the same losses
    assert two["efficiency_same_path"] == two["efficiency"]  # no graph on the CPU: one path
    assert three["error"].startswith("needs 999 GPUs")
    table = out.with_suffix(".md").read_text()
    assert "| gla-tiny | selective_rope | 2 | ddp | default | no |" in table and "failed" in table


def test_default_jobs_cover_each_gpu_count_and_both_parallel_modes(monkeypatch):
    as_from_the_command_line(monkeypatch)
    from bench_scaling import default_jobs, parse_job

    jobs = [parse_job(spec) for spec in default_jobs([1, 2, 4]).split(",")]
    assert {(j["gpus"], j["parallel"]) for j in jobs if j["preset"] == "gla-370m" and j["mode"] == "default"} == {
        (1, "ddp"), (2, "ddp"), (2, "fsdp"), (4, "ddp"), (4, "fsdp")}
    assert any(j["preset"] == "gla-1.3b" and j["parallel"] == "fsdp" and j["gpus"] == 4 for j in jobs)
    assert default_jobs([1]).count("fsdp") == 0
