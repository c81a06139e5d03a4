"""GPU time of the generator projection's Triton kernels (srope.ops.generator.projection_kernels) per
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

    python benchmarks/tune_projection_grad.py --out tune_projection_grad.json [--backward-only]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.bench_op import kernel_time
from benchmarks.common import environment, with_settings, write_json
from srope.ops.generator import projection_kernels as fused
from srope.ops.generator.projection import _weight_grad

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


def measure(name: str, fn, reference, moved: int, report: dict, out: str, against: str = "torch") -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--backward-only", action="store_true", help="skip the forward's tiles")
    args = parser.parse_args()
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
    measure("forward torch", torch_forward, exact, forward_bytes, report, args.out, "float64")
    for tile in () if args.backward_only else FORWARD_TILES:
        measure(f"forward fused {tile}", with_settings(fused, {"FORWARD_TILE": tile}, lambda: fused._forward_op(x, weight, eps, None, None)),
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
    measure("backward torch", torch_grad, reference, grad_bytes, report, args.out)
    for tile in BACKWARD_TILES:
        for slab in SLABS:
            run = with_settings(fused, {"BACKWARD_TILE": tile}, lambda: fused._backward_op(dy, None, y, None, inv_norm, weight_low, x, None, True))
            measure(f"backward fused {tile} slab {slab}", with_settings(fused, {"SLAB": slab}, run), reference, grad_bytes, report, args.out)


if __name__ == "__main__":
    main()
