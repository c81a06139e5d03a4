"""The tile sweeps behind the kernels' constants (docs/kernels.md, "Tuning"), on a CUDA GPU.

    python benchmarks/tune.py rotation --out tune_rotation.json [--shapes 0,1] [--light-only | --scan-only]
    python benchmarks/tune.py projection --out tune_projection.json [--backward-only]

``rotation``: Per-kernel GPU times of the Selective RoPE rotation across tile configurations.

For each shape of the op benchmark (bf16), one fwd+bwd is profiled (``torch.profiler``,
mean of 5 calls after a warm-up) per configuration and every kernel's time recorded with
the HBM rate its own bytes imply. Swept separately, since a kernel's time does not depend
on the other kernels' tiles: the rotation kernels' chunk length, sub-tile and warps (and
the float32 in-tile scan against the float64 one), the light kernels' chunks per program
and warps (and the chunk sums without ``maxnreg``), the chunk scans' steps and channels per program (``--scan-only``), and the
backward without the phi gradient (no dL/dangle scratch). Our RoPE
kernels give the same-bytes reference. Results: JSON (``--out``), written as they come.

``projection``: GPU time of the generator projection's Triton kernels (srope.ops.generator.projection_kernels) per
tile configuration, against the torch routes they replace.

- Forward: the norm reduction, the cuBLAS float32 product, the broadcasting multiply;
  against the split-float16 kernel (with its weight split), both with their error
  against float64.
- Backward: ``dz = r·dy`` and the norm's coefficient from dy and y, the casts, the cuBLAS
  bf16 product written in place, the mixed-dtype add of the norm's term, the cast of x and
  the weight gradient's slab products (srope.ops.generator.projection's torch route); against the
  fused kernel (input and weight gradients, with the sum of its partial weight gradients)
  per tile and slab.

At the GLA-370M generator's shape (8 × 4096 tokens, 4 heads, chunk 256, 64 pairs + 4 gate
logits), kernel time from ``torch.profiler`` (mean of 5 calls after a warm-up), with the
bytes the fused kernel must move and the HBM rate they imply, and its error against the
torch route.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time

import torch
import triton

from bench_op import kernel_time
from common import environment, with_settings, write_json

SHAPES = ((8, 4096, 4, 128), (1, 65536, 4, 128), (16, 4096, 16, 64), (1, 4096, 4, 128))
THETA = 500000.0


def profile_kernels(fn, repeats: int = 5) -> dict[str, float]:
    """GPU time per kernel (ms, short names) of one call of ``fn`` after two warm-up calls."""
    fn()
    fn()
    times: dict[str, float] = {}
    for name, ms in kernel_time(fn, repeats)["kernels"].items():
        short = name.split("(")[0]
        times[short] = round(times.get(short, 0.0) + ms, 5)
    return times


def rotation(args) -> None:
    from srope.ops.rotary import chunk as ops
    from srope.ops.rotary import naive as reference

    start = time.perf_counter()
    report = {"environment": environment(), "runs": []}
    defaults = {name: getattr(ops, name) for name in ("_tile", "_light_tile", "_scan_tile", "FAST_SCAN_DTYPES", "NO_SPILL")}

    sweeps = []
    for index in (int(i) for i in args.shapes.split(",")):
        shape = SHAPES[index]
        batch, length, heads, dim = shape
        pairs = dim // 2
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(shape, generator=g).cuda().bfloat16().requires_grad_() for _ in range(2))
        phi = (torch.rand(batch, length, heads, pairs, generator=g) * 2).cuda().bfloat16().requires_grad_()
        temperature = reference.rope_inverse_frequencies(dim, THETA).cuda().float()
        grads = [torch.randn(shape, generator=g).cuda().bfloat16() for _ in range(2)]
        positions = torch.arange(length, device="cuda").expand(batch, length)
        inv_freq = reference.rope_inverse_frequencies(dim, THETA).cuda()
        default = ops.default_block_t(batch, length, heads, pairs)

        def measure(kind, block_t, *, tile=None, light=None, scan=None, maxnreg=True, fast=True, phi_grad=True,
                    shape=shape, q=q, k=k, phi=phi, temperature=temperature, grads=grads, positions=positions, inv_freq=inv_freq):
            if time.perf_counter() - start > args.budget_s:
                return
            for name, value in defaults.items():
                setattr(ops, name, value)
            if tile:
                ops._tile = lambda bt, br: {"ST": tile[0], "num_warps": tile[1]}
            if light:
                ops._light_tile = lambda *_shape: {"HPP": light[0], "CPP": light[1], "num_warps": light[2]}
            if scan:
                ops._scan_tile = lambda *_shape: {"BC": scan[0], "BRS": scan[1], "num_warps": scan[2]}
            if not maxnreg:
                ops.NO_SPILL = {}
            if not fast:
                ops.FAST_SCAN_DTYPES = ()
            leaves = (q, k, phi) if phi_grad else (q, k)
            if kind == "rope":
                fn = lambda: torch.autograd.grad(ops.rope_triton(q, k, positions, inv_freq, block_t=block_t), (q, k), grads)  # noqa: E731
            else:
                fn = lambda: torch.autograd.grad(  # noqa: E731
                    ops.selective_rope_triton(q, k, phi if phi_grad else phi.detach(), temperature, block_t=block_t)[:2], leaves, grads)
            row = {"shape": shape, "kind": kind, "block_t": block_t, "tile": tile, "light": light, "scan": scan,
                   "chunk_sum_maxnreg": maxnreg, "fast": fast, "phi_grad": phi_grad}
            try:
                row["kernels"] = profile_kernels(fn)
            except Exception as error:  # noqa: BLE001 - e.g. out of resources for one config
                row["error"] = repr(error)[:300]
            report["runs"].append(row)
            times = {n: t for n, t in row.get("kernels", {}).items() if "Fill" not in n}
            print(f"[{time.perf_counter() - start:4.0f}s] {shape} {kind} bt {block_t} tile {tile} light {light} scan {scan} "
                  f"maxnreg {maxnreg} fast {fast} "
                  f"phi_grad {phi_grad}: " + " ".join(f"{n.replace('_kernel', '')} {t:.4f}" for n, t in times.items())
                  + f" total {sum(row.get('kernels', {}).values()):.4f} {row.get('error', '')}", flush=True)
            write_json(args.out, report)

        # the shipped defaults first, for every shape; then the sweeps while the budget lasts
        measure("rope", default)
        measure("srope", default)
        if args.scan_only:
            # (chunks per step, channels per program, warps)
            chunks = triton.cdiv(length, default)
            for steps in sorted({min(4096, triton.next_power_of_2(chunks)), min(1024, triton.next_power_of_2(chunks))}):
                for channels, warps in ((1, 8), (2, 8), (4, 8), (8, 8), (4, 4), (16, 8)):
                    if steps * channels <= 32768:
                        sweeps.append(functools.partial(measure, "srope", default, scan=(steps, channels, warps)))
            continue
        measure("srope", default, fast=False)
        measure("srope", default, phi_grad=False)
        for block_t in () if args.light_only else sorted({max(16, default // 2), default, 2 * default}):
            for st, warps in itertools.product(sorted({min(block_t, 64), min(block_t, 32), 16}), (4, 8)):
                sweeps.append(functools.partial(measure, "srope", block_t, tile=(st, warps)))
        # (key heads, chunks, warps) per program of the light kernels: HPP·CPP·R channels per token step
        lights = {(min(hpp, heads), cpp, warps) for hpp, cpp, warps in (
            (4, 2, 4), (4, 4, 4), (4, 4, 8), (4, 8, 8), (4, 16, 8), (16, 1, 4), (16, 1, 8), (16, 2, 8), (16, 4, 8))}
        for light in sorted(lights):
            sweeps.append(functools.partial(measure, "srope", default, light=light))
        sweeps.append(functools.partial(measure, "srope", default, maxnreg=False))
    for sweep in sweeps:
        sweep()
    write_json(args.out, report)


# (BN, BI, warps, stages): the first compiles for sm_90 without spills at this shape, the
# larger ones spilled 100 to 2760 bytes (figures of the unspecialised compile of
# tests/ops/compile_sm90.py before it specialised as the JIT does; with that, the first takes
# 232 registers, no spills)
BACKWARD_TILES = ((64, 128, 8, 1), (64, 128, 8, 2), (64, 128, 16, 1), (128, 64, 8, 1), (64, 256, 16, 1))
SLABS = (2048, 1024)
# (BN, BK, warps, stages): those ptxas compiles for sm_90 without spills at this shape, and (the last
# two) products over 128 or 256 inputs at a time, for their error against the shipped 64's
# (the 256 one spills 116 bytes)
FORWARD_TILES = ((64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 16, 8, 3), (64, 16, 4, 3), (64, 32, 8, 3), (256, 16, 8, 3),
                 (64, 128, 8, 3), (64, 256, 8, 3))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def measure_projection(name: str, fn, reference, moved: int, report: dict, out: str, against: str = "torch") -> None:
    try:
        result = fn()
        timing = kernel_time(fn)
        row = {"impl": name, "kernel_ms": round(timing["kernel_ms"], 4), "gb_per_s": round(moved / timing["kernel_ms"] / 1e6, 1),
               f"rel_err_vs_{against}": [rel(a, b) for a, b in zip(result, reference) if a is not None]}
    except Exception as error:  # noqa: BLE001 - recorded, the others still run
        row = {"impl": name, "error": repr(error)[-300:]}
    print(row, flush=True)
    report["results"].append(row)
    write_json(out, report)


def projection(args) -> None:
    from srope.ops.generator import projection_kernels as fused
    from srope.ops.generator.projection import _weight_grad

    count, heads, chunk, width, eps = 8 * 4096, 4, 256, 68, 1e-6
    torch.manual_seed(0)
    x = torch.randn(count, heads, chunk, device="cuda")
    weight = torch.randn(heads, chunk, width, device="cuda") / 16
    dy = torch.randn(count, heads, width, device="cuda")
    report = {"environment": environment(), "shape": [count, heads, chunk, width], "results": []}

    def torch_forward():
        inv_norm = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square() + eps)
        return torch.bmm(x.transpose(0, 1), weight).transpose(0, 1) * inv_norm[..., None], inv_norm

    y, inv_norm = torch_forward()
    forward_bytes = x.numel() * 4 + y.numel() * 4 + inv_norm.numel() * 4
    r64 = torch.rsqrt(x.double().square().sum(-1) + eps)
    exact = (torch.einsum("nhi,him->nhm", x.double() * r64[..., None], weight.double()), r64)
    measure_projection("forward torch", torch_forward, exact, forward_bytes, report, args.out, "float64")
    for tile in () if args.backward_only else FORWARD_TILES:
        measure_projection(f"forward fused {tile}", with_settings(fused, {"FORWARD_TILE": tile}, lambda: fused._forward_op(x, weight, eps, None, None)),
                exact, forward_bytes, report, args.out, "float64")
    del exact, r64

    weight_low = weight.to(torch.bfloat16)

    def torch_grad():
        dz_low = (dy * inv_norm[..., None]).to(torch.bfloat16)
        d_norm = -(dy * y).sum(-1) * inv_norm.square()
        product = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        torch.bmm(dz_low.transpose(0, 1), weight_low.mT, out=product.transpose(0, 1))
        return torch.addcmul(product, x, d_norm[..., None]), _weight_grad(x.to(torch.bfloat16), dz_low)

    # read dy, y, x, r; write dx (the partial weight gradients are ~2% more at 1024-token slabs)
    grad_bytes = dy.numel() * (4 + 4) + x.numel() * (4 + 4) + inv_norm.numel() * 4
    report["grad_bytes"] = grad_bytes
    reference = torch_grad()
    measure_projection("backward torch", torch_grad, reference, grad_bytes, report, args.out)
    for tile in BACKWARD_TILES:
        for slab in SLABS:
            run = with_settings(fused, {"BACKWARD_TILE": tile}, lambda: fused._backward_op(dy, None, y, None, inv_norm, weight_low, x, None, True))
            measure_projection(f"backward fused {tile} slab {slab}", with_settings(fused, {"SLAB": slab}, run), reference, grad_bytes, report, args.out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweeps = parser.add_subparsers(dest="sweep", required=True)
    rot = sweeps.add_parser("rotation", help="the rotation's kernels at the op benchmark's shapes")
    rot.add_argument("--out", required=True)
    rot.add_argument("--shapes", default="0,1,2,3", help="indices into SHAPES")
    rot.add_argument("--budget-s", type=float, default=480.0, help="stop starting measurements after this")
    rot.add_argument("--light-only", action="store_true", help="sweep only the light kernels' tiles")
    rot.add_argument("--scan-only", action="store_true", help="sweep only the chunk scans' tiles")
    proj = sweeps.add_parser("projection", help="the generator projection's kernels at the GLA-370M generator's shape")
    proj.add_argument("--out", required=True)
    proj.add_argument("--backward-only", action="store_true", help="skip the forward's tiles")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: it times Triton kernels with the profiler")
    (rotation if args.sweep == "rotation" else projection)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
