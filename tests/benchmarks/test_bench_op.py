"""``benchmarks/bench_op.py --dry-run``: the GPU benchmark's plumbing on tiny CPU sizes."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)


# --dry-run times the Triton ops on the CPU, which only the interpreter runs (on a GPU machine
# without it they are recorded as skipped, and the GPU run itself is the benchmark)
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="the dry run's Triton ops need TRITON_INTERPRET=1")
def test_bench_op_dry_run_writes_the_json_and_table(tmp_path, run_benchmark):
    out = tmp_path / "op.json"
    run_benchmark("bench_op", "--dry-run", "--out", str(out), "--only", "srope_triton,srope_torch,rope_fla,rope_srope")
    report = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "fla", "results"} <= set(report)
    assert report["env"]["commit"] and "bench_op.py --dry-run" in report["env"]["command"]
    by_impl = {}
    for entry in report["results"]:
        assert {"impl", "shape", "dtype", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "floor_ms"} <= set(entry), entry
        assert "error" not in entry, entry.get("error")
        by_impl.setdefault(entry["impl"], []).append(entry)
    assert "skipped" in by_impl["rope_fla"][0]  # no CUDA here: recorded, not silently dropped
    for impl in ("srope_triton", "srope_torch", "rope_srope"):
        assert all(e["fwd_bwd_ms"] > 0 and e["floor_ms"] > 0 for e in by_impl[impl]), impl
    assert any("fwd_bwd_ms_graph" in e for e in by_impl["srope_triton"])
    assert {"decode_srope_fused", "decode_srope_module", "decode_rope_srope"} <= set(by_impl)
    assert by_impl["decode_srope_fused"][0]["fwd_ms"] > 0
    assert out.with_suffix(".md").read_text().count("| srope_triton |") == 2
