"""``benchmarks/bench_embedding.py --dry-run``: the embedding benchmark's plumbing on tiny CPU shapes."""

from __future__ import annotations

import json


def test_bench_embedding_dry_run_times_both_embeddings_at_every_shape(tmp_path, run_benchmark):
    out = tmp_path / "embedding.json"
    run_benchmark("bench_embedding", "--dry-run", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["environment"]["commit"] and "--dry-run" in report["environment"]["command"]
    assert list(report["shapes"]) == ["gla-370m", "st-gla-s2", "mqar-512"]
    for row in report["shapes"].values():
        for label in ("nn.Embedding", "srope Embedding"):
            assert row[label]["eager_ms"] > 0 and "graph_ms" not in row[label]  # no CUDA graphs on the CPU
            assert row[label]["repeats_bitwise"]  # the CPU's backward is deterministic either way
        assert row["eager_ms_ratio"] == row["srope Embedding"]["eager_ms"] / row["nn.Embedding"]["eager_ms"]
        shape = row["shape"]
        assert row["floor_bytes"] == shape["batch"] * shape["length"] * (shape["width"] * 4 + 8) + shape["vocab"] * shape["width"] * 4


def test_bench_embedding_rejects_unknown_shapes(tmp_path, run_benchmark, capsys):
    run_benchmark("bench_embedding", "--dry-run", "--shapes", "gla-370m,bogus", "--out", str(tmp_path / "e.json"), exit_code=2)
    assert "expected names among gla-370m, st-gla-s2, mqar-512" in capsys.readouterr().err
