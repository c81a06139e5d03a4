"""``benchmarks/bench_op.py --dry-run``: the GPU benchmark's plumbing on tiny CPU sizes."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# --dry-run times the Triton ops on the CPU, which only the interpreter runs (on a GPU machine
# without it they are recorded as skipped, and the GPU run itself is the benchmark)
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="the dry run's Triton ops need TRITON_INTERPRET=1")
def test_bench_op_dry_run_writes_the_json_and_table(tmp_path, monkeypatch):
    out = tmp_path / "op.json"
    argv = ["bench_op.py", "--dry-run", "--out", str(out), "--only", "srope_triton,srope_torch,rope_fla,rope_srope"]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_op.py"), run_name="__main__")
    except SystemExit as done:
        assert done.code == 0
    report = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "fla", "results"} <= set(report)
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


def _variants(tmp_path, monkeypatch, *options):
    out = tmp_path / "variants.json"
    monkeypatch.setattr(sys, "argv", ["projection_variants.py", "--small", "--out", str(out), *options])
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its `common`
    try:
        runpy.run_path(str(ROOT / "benchmarks" / "projection_variants.py"), run_name="__main__")
    except SystemExit as done:
        assert done.code == 0
    return json.loads(out.read_text())["results"]


def test_projection_variants_match_float64(tmp_path, monkeypatch):
    """The projection variants measured on the GPU compute the shipped projection (one tile each)."""
    results = _variants(tmp_path, monkeypatch)
    assert [r["name"].split(" ")[0] for r in results] == ["shipped", "parts:", "dx", "split:", "split,", "forward", "forward", "forward"]
    assert [r["name"] for r in _variants(tmp_path, monkeypatch, "--only", "forward shipped")] == ["forward shipped"]
    for record in results:
        assert "error" not in record and not record.get("wrong"), record
        errors = [value for key, value in record.items() if key.endswith("_error") and value is not None]
        assert len(errors) == (1 if record["name"].startswith("dx alone") else 2) and max(errors) <= 1e-6, record
