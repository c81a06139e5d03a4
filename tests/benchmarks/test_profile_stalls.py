"""``benchmarks/profile_stalls.py``: it sees torch.compile's compiles and recompiles in the
command it runs, and merges close events into stalls (Triton's hooks need a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks.conftest import BENCHMARKS, as_from_the_command_line

SCRIPT = """
import torch

@torch.compile(backend="eager", dynamic=False)
def f(x):
    return (x * 2).sum()

for n in (3, 5, 5, 7):
    f(torch.ones(n))
"""


def test_each_compile_of_a_new_shape_is_an_event(tmp_path):
    script, out = tmp_path / "shapes.py", tmp_path / "stalls.json"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "profile_stalls.py"), "--out", str(out), "--", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    compiles = [e for e in report["events"] if e["kind"] == "torch_compile"]
    assert len(compiles) == 3, compiles  # lengths 3, 5 and 7; the second 5 reuses its graph
    assert len({e["name"] for e in compiles}) == 3 and all(e["seconds"] >= 0 for e in compiles)
    assert report["summary"]["by_kind"]["torch_compile"]["count"] == 3
    assert report["exit_status"] == 0 and report["stalls"] and "longest stall" in done.stderr


def test_close_events_merge_into_one_stall(monkeypatch):
    import importlib

    as_from_the_command_line(monkeypatch)
    module = importlib.import_module("profile_stalls")
    events = [{"kind": "triton_compile", "start": 0.0, "seconds": 2.0}, {"kind": "triton_autotune", "start": 2.5, "seconds": 1.0},
              {"kind": "torch_compile", "start": 10.0, "seconds": 0.5}]
    spans = module.stalls(events, gap=1.0)
    assert [(s["start"], s["seconds"], s["events"]) for s in spans] == [(0.0, 3.5, 2), (10.0, 0.5, 1)]
    assert spans[0]["kinds"] == {"triton_compile": 1, "triton_autotune": 1}
