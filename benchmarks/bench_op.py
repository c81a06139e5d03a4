"""Op-level benchmark of the rotation: Selective RoPE (Triton, torch, torch.compile) and fixed
RoPE (fla's kernel, ours), forward / backward / both, plus the one-token decode step.

Timings are ``triton.testing.do_bench`` medians (L2 flushed before every call) after a
warm-up call (autotuning) on random bf16 data. Where the CPU side (Python, autograd, the
launches) is slower than the GPU, those medians time the CPU, so every entry also has
``fwd_bwd_ms_graph`` (fwd+bwd captured once in a CUDA graph and replayed: GPU time without
launch overhead; decode: the step) and ``kernel_ms`` (the sum of the GPU kernel durations
of one fwd+bwd, from ``torch.profiler``, with the kernel names). ``floor_ms`` is the
minimal HBM traffic over 4.25e12 B/s (the H200's device-to-device copy rate):

    Selective RoPE  forward : read q, k, phi; write q, k      = 4·BTHD·e + BTHR·e_phi
                    backward: read dq', dk', q, k, phi;
                              write dq, dk, dphi              = 6·BTHD·e + 2·BTHR·e_phi
    fixed RoPE      forward : read q, k; write q, k           = 4·BTHD·e
                    backward: read dq', dk'; write dq, dk     = 4·BTHD·e

(e = 2 bytes for bf16; R = D/2; H = Hk). phi is bf16 like q and k (e_phi = 2), except in
``srope_triton_phi32``: float32 phi (e_phi = 4), what the module's generator produces for
a bf16 or autocast model, since it computes phases in float32. ``impl_bytes`` adds what our
kernels move on top: the forward reads phi twice (chunk sums, then the rotation) and the
backward writes and reads a dL/dangle scratch (2·BTHR·e_phi: bf16 for a bf16 phi, else
float32), plus per-chunk float64 vectors.

Usage (repository root, GPU machine):

    python benchmarks/bench_op.py --out out/bench/op_h200.json

writes the JSON and a markdown table beside it (``op_h200.md``). ``--dry-run`` runs the
plumbing on the CPU with tiny sizes and a wall-clock timer (the Triton entries only under
``TRITON_INTERPRET=1``); ``--sweep-block-t`` also times the Triton op at chunk lengths 16-128.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from common import HBM_BYTES_PER_S, environment, graph_ms, write_json

from srope.modules import RoPE, SelectiveRoPE
from srope.ops import rope, selective_rope
from srope.ops.rotary import naive as reference

SHAPES = [(8, 4096, 4, 128), (1, 65536, 4, 128), (16, 4096, 16, 64), (1, 4096, 4, 128)]
DRY_SHAPES = [(2, 24, 2, 8), (1, 40, 1, 8)]
DECODE_BATCHES = (1, 8, 32)
IMPLS = ("srope_triton", "srope_triton_phi32", "srope_torch", "srope_compile", "rope_fla", "rope_srope")
THETA = 500000.0


class Skip(Exception):
    """An implementation that cannot run here (the reason is recorded)."""


def traffic(shape, impl: str, elt: int = 2) -> dict:
    batch, length, heads, dim = shape
    phi_elt = 4 if impl == "srope_triton_phi32" else 2
    big, small = batch * length * heads * dim * elt, batch * length * heads * (dim // 2) * phi_elt
    if impl.startswith("rope"):
        fwd, bwd = 4 * big, 4 * big
    else:
        fwd, bwd = 4 * big + small, 6 * big + 2 * small
    out = {"fwd_bytes": fwd, "bwd_bytes": bwd, "floor_ms": (fwd + bwd) / HBM_BYTES_PER_S * 1e3}
    if impl.startswith("srope_triton"):
        out["impl_bytes"] = fwd + bwd + 3 * small
    return out


def make_impl(impl: str, shape, dtype, device, block_t=None):
    """``(fn, leaves)``: fn(*leaves) returns the rotated (q, k)."""
    batch, length, heads, dim = shape
    pairs = dim // 2
    # Random data come from the CPU generator: a failed CUDA-graph capture leaves the CUDA
    # generator unusable, and the entries after it must still run.
    g = torch.Generator().manual_seed(0)
    randn = lambda *s: torch.randn(*s, generator=g).to(device, dtype)
    q, k = randn(batch, length, heads, dim), randn(batch, length, heads, dim)
    temperature = reference.rope_inverse_frequencies(dim, THETA).to(device, torch.float32)
    if impl.startswith("srope"):
        phi_dtype = torch.float32 if impl == "srope_triton_phi32" else dtype
        phi = (torch.rand(batch, length, heads, pairs, generator=g) * 2).to(device, phi_dtype)
        leaves = [x.requires_grad_() for x in (q, k, phi)]
        if impl.startswith("srope_triton"):
            if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                raise Skip("Triton on the CPU needs TRITON_INTERPRET=1")
            if block_t is None:
                return (lambda q, k, phi: selective_rope(q, k, phi, temperature, backend="triton")[:2]), leaves
            from srope.ops.rotary.chunk import selective_rope_triton

            return (lambda q, k, phi: selective_rope_triton(q, k, phi, temperature, block_t=block_t)[:2]), leaves
        if impl == "srope_torch":
            return (lambda q, k, phi: selective_rope(q, k, phi, temperature, backend="torch")[:2]), leaves
        if impl == "srope_compile":
            from torch._functorch import config as functorch_config

            functorch_config.donated_buffer = False  # the bwd timing replays one graph (retain_graph)
            compiled = torch.compile(lambda q, k, phi: reference.selective_rope(q, k, phi, temperature)[:2],
                                     backend="inductor" if device == "cuda" else "eager")
            return compiled, leaves
    leaves = [q.requires_grad_(), k.requires_grad_()]
    if impl == "rope_srope":
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise Skip("Triton on the CPU needs TRITON_INTERPRET=1")
        positions = torch.arange(length, device=device).expand(batch, length)
        inv_freq = reference.rope_inverse_frequencies(dim, THETA).to(device)
        return (lambda q, k: rope(q, k, positions, inv_freq, backend="triton")), leaves
    if impl == "rope_fla":
        if device != "cuda":
            raise Skip("fla needs CUDA")
        try:
            from fla.modules import RotaryEmbedding
        except ImportError as err:
            raise Skip(f"fla is not installed: {err}") from None
        embedding = RotaryEmbedding(dim, base=THETA).to(device)
        return (lambda q, k: embedding(q, k, seqlen_offset=0, max_seqlen=length)), leaves
    raise ValueError(impl)


class Timer:
    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            from triton.testing import do_bench

            self.bench = lambda fn: do_bench(fn, return_mode="median")
            self.graph = graph_ms
        else:
            self.bench = self.graph = self.wall

    @staticmethod
    def wall(fn, repeats: int = 1) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)


def kernel_time(fn, repeats: int = 5) -> dict:
    """GPU kernel time of one call of ``fn`` (profiler, mean over ``repeats``) and its kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time / 1e3 / repeats
    return {"kernel_ms": sum(kernels.values()), "kernels": {k: round(v, 4) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])}}


def time_rotation(timer: Timer, fn, leaves) -> dict:
    out = fn(*leaves)
    grads = [torch.randn(x.shape).to(x.device, x.dtype) for x in out]
    torch.autograd.grad(fn(*leaves), leaves, grads)  # warm-up: compile, autotune
    step = lambda: torch.autograd.grad(fn(*leaves), leaves, grads)  # noqa: E731
    result = {"fwd_ms": timer.bench(lambda: fn(*leaves))}
    out = fn(*leaves)
    result["bwd_ms"] = timer.bench(lambda: torch.autograd.grad(out, leaves, grads, retain_graph=True))
    result["fwd_bwd_ms"] = timer.bench(step)
    if timer.device == "cuda":
        result.update(kernel_time(step))
    # Captured with fresh leaves: the eager timings above ran on the default stream, and
    # autograd's AccumulateGrad nodes of those leaves keep that stream, which invalidates a
    # capture on another stream (pytorch/pytorch#164302: "operation would make the legacy
    # stream depend on a capturing blocking stream").
    fresh = [x.detach().clone().requires_grad_() for x in leaves]
    fresh_step = lambda: torch.autograd.grad(fn(*fresh), fresh, grads)  # noqa: E731
    try:
        result["fwd_bwd_ms_graph"] = timer.graph(fresh_step)  # dry run: the wall clock stands in
    except Exception:  # noqa: BLE001 - recorded; a failed capture leaves the other timings valid
        result["graph_error"] = traceback.format_exc(limit=4)
    return result


def decode_entries(timer: Timer, device: str, dtype, batches) -> list[dict]:
    """Per-token position-encoding step at the GLA-370M layer (hidden 1024, 4 heads, D 128)."""
    entries = []
    torch.manual_seed(0)
    module = SelectiveRoPE(1024, 4, 128).to(device=device, dtype=dtype)
    rope_module = RoPE(128, theta=THETA)
    for batch in batches:
        x = torch.randn(batch, 17, 1024).to(device, dtype)
        q = torch.randn(batch, 17, 4, 128).to(device, dtype)
        k = torch.randn(batch, 17, 4, 128).to(device, dtype)
        with torch.no_grad():
            _, _, state = module(q[:, :16], k[:, :16], x[:, :16], use_cache=True)
            _, _, rope_state = rope_module(q[:, :16], k[:, :16], use_cache=True)
        step = (q[:, 16:], k[:, 16:], x[:, 16:])
        candidates = {
            "decode_srope_fused": lambda step=step, state=state: module.decode_step(*step, state),
            "decode_srope_module": lambda step=step, state=state: module(*step, state=state, use_cache=True),
            "decode_rope_srope": lambda step=step, state=rope_state: rope_module(step[0], step[1], state=state, use_cache=True),
        }
        for impl, fn in candidates.items():
            entry = {"impl": impl, "shape": [batch, 1, 4, 128], "dtype": str(dtype).removeprefix("torch."),
                     "fwd_ms": None, "bwd_ms": None, "fwd_bwd_ms": None, "floor_ms": None}
            try:
                if impl == "decode_srope_fused" and device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                    raise Skip("Triton on the CPU needs TRITON_INTERPRET=1")
                with torch.no_grad():
                    fn()
                    entry["fwd_ms"] = timer.bench(fn)
                    if device == "cuda":
                        entry.update(kernel_time(fn))
                    try:
                        entry["fwd_ms_graph"] = timer.graph(fn)
                    except Exception:  # noqa: BLE001 - recorded
                        entry["graph_error"] = traceback.format_exc(limit=4)
            except Skip as reason:
                entry["skipped"] = str(reason)
            except Exception:  # noqa: BLE001 - recorded, the other entries still run
                entry["error"] = traceback.format_exc()[-4000:]
            entries.append(entry)
            print(json.dumps(entry), flush=True)
    return entries


def markdown(report: dict) -> str:
    def fmt(value):
        return "—" if value is None else f"{value:.3f}"

    lines = [
        f"# Rotation op benchmark ({report['gpu']}; torch {report['torch']}, triton {report['triton']}, fla {report['fla']})",
        "",
        (
            "Medians in ms (triton.testing.do_bench, L2 flushed); `graph` = fwd+bwd replayed from a CUDA graph"
            " (decode: the step), i.e. without launch overhead; `GPU kernels` = sum of the kernel durations of one"
            " fwd+bwd (torch.profiler); floor = minimal HBM bytes / 4.25 TB/s."
        ),
        "",
        "| impl | shape B×T×H×D | dtype | fwd | bwd | fwd+bwd | graph | GPU kernels | floor | graph / floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        graph = r.get("fwd_bwd_ms_graph", r.get("fwd_ms_graph"))
        ratio = graph / r["floor_ms"] if graph and r.get("floor_ms") else None
        note = r.get("skipped") or ("error" if "error" in r else "graph capture failed" if "graph_error" in r else "")
        shape = "×".join(str(s) for s in r["shape"])
        lines.append(
            f"| {r['impl']} | {shape} | {r['dtype']} | {fmt(r['fwd_ms'])} | {fmt(r['bwd_ms'])} | {fmt(r['fwd_bwd_ms'])} "
            f"| {fmt(graph)} | {fmt(r.get('kernel_ms'))} | {fmt(r['floor_ms'])} | {fmt(ratio)}{' ' + note if note else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/bench/op.json", help="JSON file, a .md table is written beside it (default: out/bench/op.json)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, wall-clock timer")
    parser.add_argument("--only", default=",".join(IMPLS), help=f"comma-separated subset of {IMPLS}")
    parser.add_argument("--sweep-block-t", action="store_true", help="also time srope_triton at block_t 16..128")
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --dry-run)")
    dtype = torch.bfloat16
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    env = environment()
    report = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "triton": env["triton"],
        "fla": env["fla"],
        "env": env,
        "hbm_bytes_per_s": HBM_BYTES_PER_S,
        "bytes_model": __doc__.split("minimal HBM traffic")[1].split("Usage")[0].strip(),
        "results": [],
    }
    timer = Timer(device)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        write_json(out_path, report)
        out_path.with_suffix(".md").write_text(markdown(report))

    runs = [(impl, None) for impl in args.only.split(",")]
    if args.sweep_block_t:
        runs += [("srope_triton", bt) for bt in (16, 32, 64, 128)]
    for shape in shapes:
        for impl, block_t in runs:
            name = impl if block_t is None else f"{impl}_bt{block_t}"
            entry = {"impl": name, "shape": list(shape), "dtype": "bfloat16",
                     "fwd_ms": None, "bwd_ms": None, "fwd_bwd_ms": None, **traffic(shape, impl)}
            try:
                fn, leaves = make_impl(impl, shape, dtype, device, block_t)
                entry.update(time_rotation(timer, fn, leaves))
            except Skip as reason:
                entry["skipped"] = str(reason)
            except Exception:  # noqa: BLE001 - recorded (e.g. an inductor failure), the rest still runs
                entry["error"] = traceback.format_exc()[-4000:]
            report["results"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "error"}), flush=True)
            save()
            if device == "cuda":
                torch.cuda.empty_cache()
    if not args.skip_decode:
        report["results"] += decode_entries(timer, device, dtype, (2,) if args.dry_run else DECODE_BATCHES)
        save()
    print(f"wrote {out_path} and {out_path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
