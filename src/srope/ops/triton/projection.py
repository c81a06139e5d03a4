"""Input gradient of the generator's normalised per-head projection, in one Triton kernel.

The backward of :func:`srope.ops.projection.normalized_head_projection`
(``y = r · x @ weight`` per token n and head h, ``r = (|x|² + ε)^(-1/2)``) with
low-precision products (under autocast) needs, with ``dz = r · dy`` rounded to bf16/fp16
and everything else in float32::

    dx[n, h, :] = dz[n, h, :] @ weight[h]ᵀ - r² (dy · y)[n, h] · x[n, h, :]

With torch: multiplies and a reduction over dy, a cast, a cuBLAS product written to memory
and read back by a mixed-dtype add (not vectorised, 0.19 ms at 8 × 4096 tokens × 1024 on the
H200), a cast of x: 0.42 ms of kernels (benchmarks/tune_projection_grad.py). Here each
program forms dz and the norm's coefficient from its dy and y tiles, multiplies on tensor
cores, adds the norm's term, and writes dx, plus the rounded x and dz that the weight
gradient's cuBLAS products read: 0.21 ms. x is read once and nothing else of its size is
written. (A forward kernel with ``tf32x3`` products, float32-accurate, took 0.25-0.63 ms
against torch's 0.27: not used.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops.triton.ops import interpreting, on_device


@triton.jit
def input_grad_kernel(
    dy, y, inv_norm, weight, x, dx, x_low, dz_low,
    N, x_n,
    H: tl.constexpr, I: tl.constexpr, M: tl.constexpr,
    BN: tl.constexpr, BI: tl.constexpr, BM: tl.constexpr, WRITE_LOW: tl.constexpr, UPCAST: tl.constexpr,
):
    """Program (token block, head, slice of the head chunk): ``dx`` and ``x_low`` there; the
    programs of the first slice also write ``dz_low``. ``UPCAST``: multiply in float32 (the
    interpreter's dot misreads bf16 operands; products of 16-bit numbers are exact in
    float32, so only the summation order differs)."""
    pn, h, pi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    nn = pn * BN + tl.arange(0, BN)
    ii = pi * BI + tl.arange(0, BI)
    mn, mi = nn < N, ii < I
    r = tl.load(inv_norm + nn * H + h, mask=mn, other=0.0)
    acc = tl.zeros([BN, BI], dtype=tl.float32)
    dot_y = tl.zeros([BN], dtype=tl.float32)
    for start in range(0, M, BM):
        mm = start + tl.arange(0, BM)
        tile = mn[:, None] & (mm < M)[None, :]
        offsets = (nn[:, None] * H + h) * M + mm[None, :]
        g = tl.load(dy + offsets, mask=tile, other=0.0)
        dot_y += tl.sum(g * tl.load(y + offsets, mask=tile, other=0.0), axis=1)
        g = (g * r[:, None]).to(weight.dtype.element_ty, fp_downcast_rounding="rtne")
        if WRITE_LOW:
            tl.store(dz_low + offsets, g, mask=tile & (pi == 0))
        w = tl.load(weight + (h * I + ii[:, None]) * M + mm[None, :], mask=mi[:, None] & (mm < M)[None, :], other=0.0)
        if UPCAST:
            g, w = g.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(g, tl.trans(w), acc)
    xs = tl.load(x + nn[:, None] * x_n + h * I + ii[None, :], mask=mn[:, None] & mi[None, :], other=0.0)
    out = acc - xs * (dot_y * r * r)[:, None]
    tl.store(dx + (nn[:, None] * H + h) * I + ii[None, :], out, mask=mn[:, None] & mi[None, :])
    if WRITE_LOW:
        tl.store(x_low + (nn[:, None] * H + h) * I + ii[None, :], xs.to(x_low.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mn[:, None] & mi[None, :])


# BN tokens x BI of the chunk per program, in steps of BM outputs, with this many warps: the
# fastest of the tiles benchmarks/tune_projection_grad.py measured on the H200.
GRAD_TILE = (64, 128, 16, 8)  # BN, BI, BM, warps


@torch.library.custom_op("srope::normalized_projection_input_grad", mutates_args=())
def _input_grad_op(
    dy: torch.Tensor, y: torch.Tensor, inv_norm: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, write_low: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    count, heads, chunk = x.shape
    width = weight.shape[2]
    dy, y, inv_norm, weight = dy.contiguous(), y.contiguous(), inv_norm.contiguous(), weight.contiguous()
    dx = torch.empty(count, heads, chunk, dtype=x.dtype, device=x.device)
    low = count if write_low else 0
    x_low = torch.empty(low, heads, chunk, dtype=weight.dtype, device=x.device)
    dz_low = torch.empty(low, heads, width, dtype=weight.dtype, device=x.device)
    block_n, block_i, block_m, warps = (16, 16, 16, 4) if interpreting() else GRAD_TILE
    if count > 0:
        with on_device(x):
            input_grad_kernel[(triton.cdiv(count, block_n), heads, triton.cdiv(chunk, block_i))](
                dy, y, inv_norm, weight, x, dx, x_low, dz_low, count, x.stride(0),
                H=heads, I=chunk, M=width, BN=block_n, BI=block_i, BM=block_m, WRITE_LOW=write_low, UPCAST=interpreting(),
                num_warps=warps,
            )
    return dx, x_low, dz_low


@_input_grad_op.register_fake
def _input_grad_op_fake(dy, y, inv_norm, weight, x, write_low):
    count, heads, chunk = x.shape
    low = count if write_low else 0
    return (x.new_empty((count, heads, chunk)), x.new_empty((low, heads, chunk), dtype=weight.dtype),
            x.new_empty((low, heads, weight.shape[2]), dtype=weight.dtype))


def projection_input_grad(
    dy: torch.Tensor, y: torch.Tensor, inv_norm: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, write_low: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The input gradient of ``y = r · x @ weight``, ``r = (|x|² + ε)^(-1/2)`` per token and
    head (:func:`srope.ops.projection.normalized_head_projection`), with 16-bit products.

    Args:
        dy: ``[N, H, M]`` float32, the gradient of y.
        y, inv_norm: ``[N, H, M]`` and ``[N, H]`` float32, the forward's outputs.
        weight: ``[H, I, M]`` bfloat16 or float16, the weight rounded to the products' dtype.
        x: ``[N, H, I]`` float32 (the last two dimensions contiguous, any token stride).
        write_low: also return x and ``dz = r · dy`` rounded to the weight's dtype (for
            the weight gradient ``Σ_n x_lowᵀ dz_low``), else None for both.

    Returns ``dx [N, H, I]`` float32, ``x_low [N, H, I]`` and ``dz_low [N, H, M]`` (or None).
    """
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"weight must be bfloat16 or float16 (the products' dtype), got {weight.dtype}")
    if any(t.dtype != torch.float32 for t in (dy, y, inv_norm, x)):
        raise TypeError(f"dy, y, inv_norm and x must be float32, got {dy.dtype}, {y.dtype}, {inv_norm.dtype} and {x.dtype}")
    if x.dim() != 3 or dy.dim() != 3 or weight.dim() != 3 or inv_norm.dim() != 2:
        raise ValueError("expected dy and y [N, H, M], inv_norm [N, H], weight [H, I, M], x [N, H, I]")
    count, heads, chunk = x.shape
    if tuple(dy.shape) != (count, heads, weight.shape[2]) or y.shape != dy.shape or tuple(weight.shape[:2]) != (heads, chunk) \
            or tuple(inv_norm.shape) != (count, heads):
        raise ValueError(f"shapes disagree: dy {tuple(dy.shape)}, y {tuple(y.shape)}, inv_norm {tuple(inv_norm.shape)}, "
                         f"weight {tuple(weight.shape)}, x {tuple(x.shape)}")
    if len({t.device for t in (dy, y, inv_norm, weight, x)}) != 1:
        raise ValueError("dy, y, inv_norm, weight and x must be on one device")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused projection gradient needs CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")
    dx, x_low, dz_low = _input_grad_op(dy, y, inv_norm, weight, x, write_low)
    return (dx, x_low, dz_low) if write_low else (dx, None, None)
