"""The plumbing of benchmarks/check_cuda_mixers.py, exercised on the CPU with --dry-run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "check_cuda_mixers.py"


def test_dry_run_writes_checks_and_timings(tmp_path):
    spec = importlib.util.spec_from_file_location("check_cuda_mixers", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "mixers.json"
    assert script.main(["--dry-run", "--out", str(out), "--only", "float32-packed"]) == 0
    report = json.loads(out.read_text())
    names = [c["case"] for c in report["checks"]]
    assert len(names) == 5 and all("torch->torch-float32-packed" in n for n in names)
    assert all(c["passed"] is True and c["max_error"] < c["tolerance"] for c in report["checks"])
    assert report["checks_summary"] == {"passed": 5, "failed": [], "skipped": 0}
    timed = {(t["mixer"], t["pass"]) for t in report["timings"]}
    assert {("gla", "fwd+bwd"), ("gdn", "fwd+bwd"), ("gdn", "fwd"), ("fox", "fwd+bwd"), ("attention", "fwd+bwd")} <= timed
    assert all(t["median_ms"] > 0 and t["tokens_per_s"] > 0 for t in report["timings"])
    assert report["environment"]["torch"] and report["fla_gated_backward_is_broken"] is False
