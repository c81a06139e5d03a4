"""``benchmarks/bench_host_cpu.py``: host time of srope's eager calls with the kernels skipped,
and how many kernels each call launches (any machine's count, measured here)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benchmarks.conftest import BENCHMARKS
from tests.benchmarks.test_command_lines import SROPE_ENV

# Launches per forward + backward: the rotation is three kernels each way; the module adds the
# generator's weights and conv-gate kernels (one forward, two backward) and, on the CPU, runs the
# normalised projection through PyTorch (two launches more on a GPU). RoPE: one kernel each way.
LAUNCHES = {
    "op: selective_rope forward + backward": 6,
    "module nope: host_input + call + backward": 0,
    "module rope: host_input + call + backward": 2,
    "module selective_rope: host_input + call + backward": 11,
    "GLA layer selective_rope: forward + backward": 11,
}


def test_every_case_is_timed_and_its_launches_counted(tmp_path):
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_host_cpu.py"), "--calls", "1", "--rounds", "1",
                           "--shape", "64,8,2", "--out", str(out)], cwd=tmp_path, env=SROPE_ENV, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    entries = report["entries"]
    assert len(entries) == 7 and all(entry["host_us"] > 0 for entry in entries.values())
    assert {name: entries[name]["launches"] for name in LAUNCHES} == LAUNCHES
    assert report["shape"] == {"hidden": 64, "length": 8, "heads": 2} and report["environment"]["torch"]
