"""``benchmarks/bench_model.py --dry-run``: the model benchmark's plumbing on the CPU (gla-tiny)."""

from __future__ import annotations

import json


def test_bench_model_dry_run_times_each_encoding_and_writes_the_table(tmp_path, run_benchmark):
    out = tmp_path / "model.json"
    run_benchmark("bench_model", "--dry-run", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["environment"]["commit"] and "--dry-run" in report["environment"]["command"]
    assert [r["position"] for r in report["results"]] == ["nope", "rope", "selective_rope"]
    for record in report["results"]:
        assert "error" not in record, record["error"]
        assert record["tokens_per_s"] > 0 and record["decode_ms_per_token"] > 0 and record["loss"] > 0
        assert "graph_tokens_per_s" not in record  # no CUDA graphs on the CPU
    by = {r["position"]: r for r in report["results"]}
    assert by["selective_rope"]["parameters"] > by["nope"]["parameters"] == by["rope"]["parameters"]
    assert report["ratios"]["train_tokens_per_s_srope_over_nope"] == by["selective_rope"]["tokens_per_s"] / by["nope"]["tokens_per_s"]
    table = out.with_suffix(".md").read_text()
    assert all(f"| {name} | " in table for name in by)
