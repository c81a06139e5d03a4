"""Per-kernel GPU times of the Selective RoPE rotation across tile configurations.

For each shape of the op benchmark (bf16), one fwd+bwd is profiled (``torch.profiler``,
mean of 5 calls after a warm-up) per configuration and every kernel's time recorded with
the HBM rate its own bytes imply. Swept separately, since a kernel's time does not depend
on the other kernels' tiles: the rotation kernels' chunk length, sub-tile and warps (and
the float32 in-tile scan against the float64 one), the light kernels' chunks per program
and warps (and the chunk sums without ``maxnreg``), the chunk scans' steps and channels per program (``--scan-only``), and the
backward without the phi gradient (no dL/dangle scratch). Our RoPE
kernels give the same-bytes reference. Results: JSON (``--out``), written as they come.

    python benchmarks/tune_rotation.py --out tune.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time

import torch
import triton

from benchmarks.bench_op import kernel_time
from benchmarks.common import environment, write_json

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="0,1,2,3", help="indices into SHAPES")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting measurements after this")
    parser.add_argument("--light-only", action="store_true", help="sweep only the light kernels' tiles")
    parser.add_argument("--scan-only", action="store_true", help="sweep only the chunk scans' tiles")
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
