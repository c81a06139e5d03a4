"""GPU time of the generator projection's input gradient: the fused Triton kernel per tile
configuration against the torch route it replaces (cuBLAS bf16 product written in place,
the mixed-dtype add of the norm's term, the cast of x for the weight gradient).

At the GLA-370M generator's shape (8 × 4096 tokens, 4 heads, chunk 256, 64 pairs + 4 gate
logits), kernel time from ``torch.profiler`` (mean of 5 calls after a warm-up), with the
bytes the fused kernel must move and the HBM rate they imply.

    python benchmarks/tune_projection_grad.py --out tune_projection_grad.json
"""

from __future__ import annotations

import argparse

import torch
import triton

from benchmarks.bench_op import kernel_time
from benchmarks.common import environment, write_json
from srope.ops.triton import projection as fused
from srope.ops.triton.ops import on_device

CONFIGS = ((64, 64, 8), (32, 128, 8), (32, 64, 4), (32, 32, 4), (64, 128, 8), (128, 64, 8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    count, heads, chunk, width = 8 * 4096, 4, 256, 68
    torch.manual_seed(0)
    dz = torch.randn(count, heads, width, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(heads, chunk, width, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(count, heads, chunk, device="cuda")
    d_norm = torch.randn(count, heads, device="cuda")
    moved = x.numel() * (4 + 4 + 2) + dz.numel() * 2  # read x, write dx and x_low, read dz
    report = {"environment": environment(), "shape": [count, heads, chunk, width], "bytes": moved, "results": []}

    def torch_route():
        product = torch.empty(x.shape, dtype=dz.dtype, device=x.device)
        torch.bmm(dz.transpose(0, 1), weight.mT, out=product.transpose(0, 1))
        return torch.addcmul(product, x, d_norm[..., None]), x.to(dz.dtype)

    reference = torch_route()
    rows = [("torch", torch_route)]
    for block_n, block_i, warps in CONFIGS:
        def launch(block_n=block_n, block_i=block_i, warps=warps):
            dx = torch.empty_like(x)
            x_low = torch.empty_like(x, dtype=dz.dtype)
            with on_device(x):
                fused.input_grad_kernel[(triton.cdiv(count, block_n), heads, triton.cdiv(chunk, block_i))](
                    dz, weight, x, d_norm, dx, x_low, count, x.stride(0), H=heads, I=chunk, M=width,
                    BN=block_n, BI=block_i, BM=64, WRITE_LOW=True, UPCAST=False, num_warps=warps)
            return dx, x_low
        rows.append((f"fused BN={block_n} BI={block_i} warps={warps}", launch))
    rows.append(("fused (default)", lambda: fused.projection_input_grad(dz, weight, x, d_norm)))
    for name, fn in rows:
        try:
            dx, x_low = fn()
            err = float((dx - reference[0]).norm() / reference[0].norm())
            timing = kernel_time(fn)
            row = {"impl": name, "kernel_ms": round(timing["kernel_ms"], 4), "rel_err_vs_torch": err,
                   "x_low_equal": bool(torch.equal(x_low, reference[1])), "gb_per_s": round(moved / timing["kernel_ms"] / 1e6, 1)}
        except Exception as error:  # noqa: BLE001 - recorded, the others still run
            row = {"impl": name, "error": repr(error)[-300:]}
        print(row, flush=True)
        report["results"].append(row)
        write_json(args.out, report)


if __name__ == "__main__":
    main()
