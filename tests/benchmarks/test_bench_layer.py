"""``benchmarks/bench_layer.py --dry-run``: every host's layer with each encoding, tiny sizes on the CPU."""

from __future__ import annotations

import json

HOSTS = ("gla", "gated_deltanet", "forgetting_attn", "attention")


def test_bench_layer_dry_run_times_every_host_and_encoding(tmp_path, run_benchmark):
    out = tmp_path / "layer.json"
    run_benchmark("bench_layer", "--dry-run", "--rounds", "1", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["environment"]["commit"] and "--dry-run" in report["environment"]["command"]
    runs = {(r["host"], r["position"]): r for r in report["results"]}
    expected = {(host, pe) for host in HOSTS for pe in ("nope", "rope", "selective_rope")} | {("gla", "selective_rope_torch")}
    assert set(runs) == expected
    for key, record in runs.items():
        assert "error" not in record, (key, record["error"])
        assert record["fwd_bwd_ms"] > 0 and len(record["fwd_bwd_ms_rounds"]) == 2, key  # the first round and one interleaved
    for name in ("selective_rope", "selective_rope_torch"):  # where GLA + Selective RoPE's time goes
        assert all(runs["gla", name][part] > 0 for part in ("generator_ms", "rotation_ms", "kernel_ms"))
    assert set(report["ratios"]) == set(HOSTS)
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| ") == len(expected) + 1  # a row per run below the header
