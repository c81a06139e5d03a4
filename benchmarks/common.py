"""Shared by the benchmark scripts: the environment record, median timing, JSON output."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # every script imports this module before srope: one line that says what to do
    import srope  # noqa: F401
except ModuleNotFoundError as missing:
    if missing.name != "srope":
        raise
    raise SystemExit(f"{Path(sys.argv[0]).name}: srope is not importable: install srope (pip install -e .) or set PYTHONPATH=src") from None
import torch

ROOT = Path(__file__).resolve().parents[1]

HBM_BYTES_PER_S = 4.25e12  # the H200's measured device-to-device copy rate (GUIDE §5)


def position_configs(**options: dict) -> dict[str, dict]:
    """Every registered position encoding (``srope.registry.positions``) as a config, with the
    benchmark's ``options[name]`` (e.g. ``rope={"theta": 500000.0}``) where given."""
    from srope.registry import positions

    return {name: {"type": name, **options.get(name, {})} for name in positions}


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Where a result came from, recorded with every result: the commit (``SROPE_COMMIT`` on a
    device copy, else HEAD), the command, library versions, date and GPU."""
    from srope.lab import provenance

    head, dirty = provenance.commit()
    info = {
        "commit": head,
        "dirty": dirty,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "fla": version("fla-core"),
        "transformers": version("transformers"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if torch.cuda.is_available():
        from srope.ops._triton import pdl

        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = list(torch.cuda.get_device_capability())
        # srope's kernels launched with programmatic dependent launch (SROPE_PDL)
        info["programmatic_dependent_launch"] = bool(pdl(torch.empty(0, device="cuda")))
    return info


def train_cli(command: list[str], *, timeout: float, skip: int) -> dict:
    """Run a ``srope train`` command line (``--out`` a temporary folder is added) and read its
    own metrics: tokens/s and step time are medians after the first ``skip`` steps
    (autotuning, the graph's warm-up and capture), peak memory the largest ``peak_gib``."""
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        began = time.perf_counter()
        result = subprocess.run([*command, "--out", tmp], capture_output=True, text=True, timeout=timeout, check=False)
        record = {"command": " ".join(command).replace(sys.executable, "python"), "wall_s": time.perf_counter() - began}
        metrics = Path(tmp) / "metrics.jsonl"
        if result.returncode != 0 or not metrics.exists():
            return record | {"error": (result.stderr or result.stdout)[-1500:]}
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    timed = [r for r in rows if r["step"] > skip] or rows
    return record | {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "step_s": statistics.median(r["step_s"] for r in timed),
        "peak_gib": max(r.get("peak_gib", float("nan")) for r in rows),
        "first_steps_s": [round(r["step_s"], 3) for r in rows if r["step"] <= skip],
        "loss": [round(r["loss"], 4) for r in rows],
        "time_s": rows[-1].get("time_s"),
        # what srope train said about the run (its description, a graph capture's fallback)
        "report": [line for line in result.stdout.splitlines() if line[:6].strip() in ("data", "model", "out", "time", "logs") or "warning" in line],
    }


def median_ms(fn, *, dry_run: bool = False, warmup: int = 1, grad_to_none=None) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on CUDA (after a warm-up
    call that also triggers autotuning), a wall clock over a few calls on the CPU."""
    for _ in range(warmup):
        fn()
    if dry_run or not torch.cuda.is_available():
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]
    import triton.testing

    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, grad_to_none=grad_to_none, return_mode="median"))


def graph_ms(fn, replays: int = 50) -> float:
    """Median ms of one replay of ``fn`` captured in a CUDA graph (warm-up on a side stream
    first, as torch.cuda.graphs requires for autograd)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times)


_FILE_PATH = re.compile(r'(?:/[^\s"\\/]+)+/([^/\s"\\]+/[^/\s"\\]+\.py)')


def write_json(path: str | Path, payload: dict, indent: int = 2) -> None:
    """Write ``payload``; file paths in recorded tracebacks are cut to ``package/file.py``
    (results get shared; the machine's folders are not ours to publish)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_FILE_PATH.sub(r"\1", json.dumps(payload, indent=indent, default=str)) + "\n")


def with_settings(module, settings: dict, fn):
    """``fn`` run with ``module``'s constants (tiles, slabs) set to ``settings``, restored after."""
    def run():
        saved = {name: getattr(module, name) for name in settings}
        try:
            for name, value in settings.items():
                setattr(module, name, value)
            return fn()
        finally:
            for name, value in saved.items():
                setattr(module, name, value)
    return run
