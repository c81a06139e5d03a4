"""Shared by the benchmark scripts: the environment record, median timing, JSON output."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

HBM_BYTES_PER_S = 4.25e12  # the H200's measured device-to-device copy rate (GUIDE §5)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """GPU and library versions, recorded with every result."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "fla": version("fla-core"),
        "transformers": version("transformers"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if torch.cuda.is_available():
        from srope.ops.triton.ops import pdl

        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = list(torch.cuda.get_device_capability())
        # srope's kernels launched with programmatic dependent launch (SROPE_PDL)
        info["programmatic_dependent_launch"] = bool(pdl(torch.empty(0, device="cuda")))
    return info


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
    (the results are committed; the machine's folders are not ours to publish)."""
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
