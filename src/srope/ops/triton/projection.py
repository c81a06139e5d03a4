"""The input gradient of :func:`srope.ops.projection.normalized_head_projection` in one kernel.

For ``y[n, h] = r[n, h] · z[n, h]`` with ``z = x[n, h] @ W[h]`` and ``r = (|x[n, h]|² + ε)^(-1/2)``:

    dx[n, h] = (r · dy[n, h]) @ W[h]ᵀ  -  r³ (dy[n, h] · z[n, h]) · x[n, h]

PyTorch takes a batched GEMM with an awkward inner size (M = R + gate outputs, 65 in the
370M layer) and a broadcast multiply-add over x: 0.37 + 0.33 ms of GPU time on the H200
at 8 × 4096 tokens × hidden 1024 (``benchmarks/results/profile_layer_h200.json``), for an
output whose bytes alone take 0.03 ms. Here each program takes BN tokens × BI input
channels of one head, forms ``r·dy`` and ``r³ (dy·z)`` from its rows, runs the small GEMM
in BK-wide slices of M in float32 (IEEE products, no TF32), adds the norm term and writes
dx once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops.triton.ops import interpreting, on_device


@triton.jit
def projection_dx_kernel(
    dy, z, inv_norm, x, weight, dx, N,
    H: tl.constexpr, I: tl.constexpr, M: tl.constexpr,
    BN: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, F64: tl.constexpr,
):
    """dy, z ``[N, H, M]``; inv_norm ``[N, H]``; x, dx ``[N, H, I]``; weight ``[H, I, M]``; all contiguous."""
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    pid_n, h, pid_i = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    nn = pid_n * BN + tl.arange(0, BN)
    ii = pid_i * BI + tl.arange(0, BI)
    mn, mi = nn < N, ii < I
    r = tl.load(inv_norm + nn * H + h, mask=mn, other=0.0).to(CD)
    rows = (nn * H + h) * M
    dot_z = tl.zeros([BN], dtype=CD)
    for k0 in range(0, M, BK):
        kk = k0 + tl.arange(0, BK)
        m = mn[:, None] & (kk < M)[None, :]
        g = tl.load(dy + rows[:, None] + kk[None, :], mask=m, other=0.0).to(CD)
        dot_z += tl.sum(g * tl.load(z + rows[:, None] + kk[None, :], mask=m, other=0.0).to(CD), 1)
    acc = tl.zeros([BN, BI], dtype=CD)
    for k0 in range(0, M, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < M
        dz = tl.load(dy + rows[:, None] + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0).to(CD) * r[:, None]
        w_t = tl.load(weight + (h * I + ii[None, :]) * M + kk[:, None], mask=mk[:, None] & mi[None, :], other=0.0).to(CD)
        if F64:
            acc += tl.sum(dz[:, :, None] * w_t[None, :, :], 1)
        else:
            acc = tl.dot(dz, w_t, acc, input_precision="ieee")
    d_norm = -dot_z * r * r * r
    offsets = (nn[:, None] * H + h) * I + ii[None, :]
    mask = mn[:, None] & mi[None, :]
    xs = tl.load(x + offsets, mask=mask, other=0.0).to(CD)
    tl.store(dx + offsets, (acc + d_norm[:, None] * xs).to(dx.dtype.element_ty), mask=mask)


def projection_input_grad(dy: torch.Tensor, z: torch.Tensor, inv_norm: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``dx [N, H, I]`` of the normalised per-head projection from the output gradient
    ``dy [N, H, M]``, the saved un-normalised outputs ``z [N, H, M]``, ``inv_norm [N, H]``,
    the input ``x [N, H, I]`` and ``weight [H, I, M]`` (float32 or float64, one dtype; on
    CUDA, or on the CPU under ``TRITON_INTERPRET=1``)."""
    count, heads, chunk = x.shape
    width = weight.shape[-1]
    if weight.shape != (heads, chunk, width) or dy.shape != (count, heads, width) or z.shape != dy.shape or inv_norm.shape != (count, heads):
        raise ValueError(
            f"expected dy, z [N, H, M], inv_norm [N, H], x [N, H, I], weight [H, I, M]; got {tuple(dy.shape)}, "
            f"{tuple(z.shape)}, {tuple(inv_norm.shape)}, {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if len({t.dtype for t in (dy, z, inv_norm, x, weight)}) != 1 or x.dtype not in (torch.float32, torch.float64):
        raise TypeError("dy, z, inv_norm, x and weight must share one dtype, float32 or float64")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the projection kernel needs CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")
    return _launch(dy, z, inv_norm, x, weight)


def _launch(dy, z, inv_norm, x, weight) -> torch.Tensor:
    count, heads, chunk = x.shape
    width = weight.shape[-1]
    dy, z, inv_norm, x, weight = (t.contiguous() for t in (dy, z, inv_norm, x, weight))
    dx = torch.empty_like(x)
    f64 = x.dtype == torch.float64
    block_n, block_i = (16, 16) if interpreting() else ((32, 32) if f64 else (64, 64))
    if count > 0:
        with on_device(x):
            projection_dx_kernel[(triton.cdiv(count, block_n), heads, triton.cdiv(chunk, block_i))](
                dy, z, inv_norm, x, weight, dx, count, H=heads, I=chunk, M=width,
                BN=block_n, BI=block_i, BK=16, F64=f64, num_warps=4,
            )
    return dx
