"""The generator's normalised per-head projection as Triton kernels: forward and backward.

:func:`srope.ops.generator.projection.normalized_head_projection` computes ``y = r · x @ weight`` per
token n and head h, ``r = (|x|² + ε)^(-1/2)``. On CUDA its float32 forward and its
low-precision backward (under autocast) run here.

**Forward** (:func:`projection_forward`), float32-accurate on tensor cores. Each program forms
r from its tokens' head chunk, then reads the chunk again (from L2) in steps of BK inputs:
x̂ = r·x (every |x̂_i| <= 1) split into two float16 parts ``hi + lo`` (22 bits), times the
weight split the same way (each column first scaled by a power of two so that its largest
entry is at most 1, undone exactly after): ``hi·w_hi + hi·w_lo + lo·w_hi``. The dropped
``lo·w_lo`` and the residuals are about 2^-22 of each product, and parts below float16's
normal range keep an absolute error of at most 2^-25 (no part can overflow). The main
product of each step starts from a zero accumulator and is added in float32: chained
through one accumulator over the whole chunk the tensor cores' truncation as they add
doubles the error (measurements in docs/kernels.md, "Tuning"). With ``cast`` the first
pass also writes x rounded to bf16/fp16 (what a host's linear maps read under autocast),
at no extra read of x. With ``split`` the outputs go to two tensors, columns ``[0, S)`` and ``[S, M)``, one
column tile each (the generator's: the conv's input, then the gate's shares), and the
backward reads dy and y from such parts at their own strides (the gate's gradient is a
broadcast over heads).

**Backward** (:func:`projection_backward`), with ``dz = r · dy`` and x rounded to bf16/fp16
and everything else in float32::

    dx[n, h, :] = dz[n, h, :] @ weight[h]ᵀ - r² (dy · y)[n, h] · x[n, h, :]
    dw[h] = Σ_n x_low[n, h]ᵀ dz[n, h]

Each program takes a slab of tokens of one head and a slice of its inputs: per step of BN
tokens it forms dz and the norm's coefficient from its dy and y tiles, multiplies on
tensor cores (on [inputs, tokens] tiles, ``dxᵀ = W dzᵀ``, where both products share one
layout), adds the norm's term and writes dx, and adds the step's ``x_lowᵀ dz`` to the
slab's weight gradient, kept in float32 registers and written once; the slabs' partials
are summed in a fixed order (deterministic). x is read once and nothing else of its size
is written. With ``host_grad`` (the gradient the host's maps send back to that copy of x)
dx also gets it added: x then gets one gradient instead of two that autograd adds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops._triton import await_predecessor, cdiv, interpreting, kernel_op, next_power_of_2, on_device, pdl


@triton.jit
def _dz_columns(dy, y, z_out, rows, mn, r, h, start, end, col, dot_y, write, dy_n: tl.constexpr, dy_h: tl.constexpr,
                y_n: tl.constexpr, y_h: tl.constexpr, H: tl.constexpr, M: tl.constexpr, BM: tl.constexpr, dtype: tl.constexpr,
                STORE_Z: tl.constexpr, UPCAST: tl.constexpr):
    """Columns ``[start, end)`` (a BM tile), read from one part of dy and y (at column ``col``
    of the part, rows ``dy_n``/``y_n`` apart and heads ``dy_h``/``y_h``): dz = r·dy rounded to
    ``dtype`` ([BN, BM]) and ``dot_y += Σ dy·y`` over them; STORE_Z: dz also written to
    ``z_out`` [N, H, M] where ``write``."""
    mm = tl.arange(0, BM)
    tile = mn[:, None] & (start + mm < end)[None, :]
    g = tl.load(dy + rows[:, None] * dy_n + h * dy_h + col + mm[None, :], mask=tile, other=0.0)
    dot_y += tl.sum(g * tl.load(y + rows[:, None] * y_n + h * y_h + col + mm[None, :], mask=tile, other=0.0), axis=1)
    z = (g * r[:, None]).to(dtype, fp_downcast_rounding="rtne")
    if STORE_Z:
        tl.store(z_out + (rows[:, None] * H + h) * M + start + mm[None, :], z, mask=tile & write)
    return z.to(tl.float32) if UPCAST else z, dot_y


@triton.jit
def _load_weight(weight, h, ii, mi, start, end, I: tl.constexpr, M: tl.constexpr, BM: tl.constexpr, UPCAST: tl.constexpr):
    mm = start + tl.arange(0, BM)
    w = tl.load(weight + (h * I + ii[:, None]) * M + mm[None, :], mask=mi[:, None] & (mm < end)[None, :], other=0.0)
    return w.to(tl.float32) if UPCAST else w


@triton.jit
def _store_weight_grad(dw, grad, ps, h, ii, mi, start, end, H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, BM: tl.constexpr):
    mm = start + tl.arange(0, BM)
    tl.store(dw + ((ps * H + h) * I + ii[:, None]) * M + mm[None, :], grad, mask=mi[:, None] & (mm < end)[None, :])


@triton.jit
def _add_weight_grads(x_low, z1, z2, grad1, grad2, TWO: tl.constexpr, UPCAST: tl.constexpr):
    """The step's weight-gradient products ``x_low @ z`` ([BI, BN] times each column block
    [BN, BM]) added into the float32 accumulators."""
    if UPCAST:
        x_low = x_low.to(tl.float32)
    grad1 = tl.dot(x_low, z1, grad1)
    if TWO:
        grad2 = tl.dot(x_low, z2, grad2)
    return grad1, grad2


@triton.jit
def _input_grad_step(dy1, dy2, y1, y2, inv_norm, x, host_grad, dx, z_out, w1, w2, start, N, x_n, h, ii, mi, write,
                     STRIDES: tl.constexpr, dtype: tl.constexpr, H: tl.constexpr,
                     I: tl.constexpr, M: tl.constexpr, W1: tl.constexpr, C2: tl.constexpr, BN: tl.constexpr,
                     BM1: tl.constexpr, BM2: tl.constexpr, TWO: tl.constexpr, HOST_GRAD: tl.constexpr,
                     STORE_Z: tl.constexpr, UPCAST: tl.constexpr):
    """One step of BN tokens on [inputs, tokens] tiles: writes ``dxᵀ = W dzᵀ - r²(dy·y) xᵀ``
    (+ host_grad); returns xᵀ and the dz column blocks."""
    nn = start + tl.arange(0, BN)
    mn = nn < N
    rows = nn.to(tl.int64)  # x's offsets pass 2^31 at 2^21 tokens of 1024
    r = tl.load(inv_norm + rows * H + h, mask=mn, other=0.0)
    dot_y = tl.zeros([BN], dtype=tl.float32)
    z1, dot_y = _dz_columns(dy1, y1, z_out, rows, mn, r, h, 0, W1, 0, dot_y, write, STRIDES[0], STRIDES[1], STRIDES[4],
                            STRIDES[5], H, M, BM1, dtype, STORE_Z, UPCAST)
    acc = tl.dot(w1, tl.trans(z1))
    z2 = z1
    if TWO:
        z2, dot_y = _dz_columns(dy2, y2, z_out, rows, mn, r, h, W1, M, C2, dot_y, write, STRIDES[2], STRIDES[3], STRIDES[6],
                                STRIDES[7], H, M, BM2, dtype, STORE_Z, UPCAST)
        acc = tl.dot(w2, tl.trans(z2), acc)
    tile = mi[:, None] & mn[None, :]
    xt = tl.load(x + rows[None, :] * x_n + h * I + ii[:, None], mask=tile, other=0.0)
    out = acc - xt * (dot_y * r * r)[None, :]
    if HOST_GRAD:
        out += tl.load(host_grad + (rows[None, :] * H + h) * I + ii[:, None], mask=tile, other=0.0).to(tl.float32)
    tl.store(dx + (rows[None, :] * H + h) * I + ii[:, None], out, mask=tile)
    return xt, z1, z2


@triton.jit
def backward_kernel(
    dy1, dy2, y1, y2, inv_norm, weight, x, host_grad, dx, dw, z_out,
    N, x_n, tokens,
    STRIDES: tl.constexpr, H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, W1: tl.constexpr, C2: tl.constexpr,
    BN: tl.constexpr, BI: tl.constexpr, BM1: tl.constexpr, BM2: tl.constexpr, TWO: tl.constexpr,
    HOST_GRAD: tl.constexpr, WEIGHT_GRAD: tl.constexpr, STORE_Z: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (slab of ``tokens`` tokens, head, slice of BI inputs of the head chunk): ``dx``
    there, in steps of BN tokens, and (WEIGHT_GRAD) the slab's share of the weight gradient
    ``Σ x_lowᵀ dz`` over them, accumulated in registers and written as one partial
    ``dw[slab, h]``. The tiles are [inputs, tokens] (``dxᵀ = W dzᵀ``): both products then
    share one wgmma layout (7 layout conversions per step in the TTGIR, against 11 on
    [tokens, inputs] tiles). HOST_GRAD: dx also gets ``host_grad`` (the gradient of the
    forward's 16-bit copy of x, [N, H, I]). STORE_Z: dz is written to ``z_out`` [N, H, M]
    (by the first input slice's programs; for a weight gradient computed elsewhere). The
    weight's tile is loaded once. Columns as in the forward: ``[0, W1)`` from the first
    part of dy and y and, if TWO, ``[W1, M)`` from the second (at its column C2; the parts'
    rows and heads are ``STRIDES``: (dy1's token and head strides, dy2's, y1's, y2's),
    constexprs, so that the compiler knows their alignment; a head stride may be 0). ``UPCAST``: multiply in
    float32 (the interpreter's dot misreads 16-bit operands; products of 16-bit numbers
    are exact in float32, so only the summation order differs)."""
    await_predecessor(PDL)
    ps, h, pi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ii = pi * BI + tl.arange(0, BI)
    mi = ii < I
    w1 = _load_weight(weight, h, ii, mi, 0, W1, I, M, BM1, UPCAST)
    w2 = _load_weight(weight, h, ii, mi, W1, M, I, M, BM2, UPCAST)  # all masked unless TWO
    grad1 = tl.zeros([BI, BM1], dtype=tl.float32)
    grad2 = tl.zeros([BI, BM2], dtype=tl.float32)
    first = ps * tokens
    for start in range(first, tl.minimum(first + tokens, N), BN):
        xt, z1, z2 = _input_grad_step(dy1, dy2, y1, y2, inv_norm, x, host_grad, dx, z_out, w1, w2, start, N, x_n, h, ii, mi,
                                      pi == 0, STRIDES, weight.dtype.element_ty,
                                      H, I, M, W1, C2, BN, BM1, BM2, TWO, HOST_GRAD, STORE_Z, UPCAST)
        if WEIGHT_GRAD:
            x_low = xt.to(weight.dtype.element_ty, fp_downcast_rounding="rtne")
            grad1, grad2 = _add_weight_grads(x_low, z1, z2, grad1, grad2, TWO, UPCAST)
    if WEIGHT_GRAD:
        _store_weight_grad(dw, grad1, ps, h, ii, mi, 0, W1, H, I, M, BM1)
        if TWO:
            _store_weight_grad(dw, grad2, ps, h, ii, mi, W1, M, H, I, M, BM2)


# BN tokens x BI of the head chunk per step, warps, pipeline stages and a register cap, at
# least SLAB tokens per program: the fastest tile measured (docs/kernels.md, "Tuning").
BACKWARD_TILE = (32, 128, 8, 3, 128)  # BN, BI, warps, stages, maxnreg
SLAB = 1024
MAX_SLABS = 256  # the partial weight gradients take at most this many times the weight's size


def slab_tokens(count: int, block_n: int, slab: int) -> int:
    """Tokens per program: ``slab``, or more where that would make over MAX_SLABS
    partials; a multiple of ``block_n``."""
    tokens = max(slab, cdiv(count, MAX_SLABS))
    return cdiv(tokens, block_n) * block_n


def _columns(width: int, split: int | None) -> dict:
    """The kernels' column tiles over ``width`` outputs: ``[0, W1)`` in a BM1 tile and, if TWO,
    ``[W1, width)`` in a BM2 tile. Unsplit (one output tensor) as :func:`column_blocks`; split
    into two tensors at ``split``, one tile per part (a part whose width is not a power of two
    leaves some of its tile's columns masked)."""
    if split is None:
        first, rest = column_blocks(width)
        w1 = min(first, width)
    else:
        w1, first = split, max(16, next_power_of_2(split))
        rest = 0 if width == split else max(16, next_power_of_2(width - split))
    return dict(M=width, W1=w1, BM1=first, BM2=max(rest, 16), TWO=rest > 0)


def part_strides(*parts: torch.Tensor) -> tuple[int, ...]:
    """The token and head strides of each part, as the backward kernel's STRIDES."""
    return tuple(stride for part in parts for stride in part.stride()[:2])


def _unit_columns(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit column stride (any row and head strides, broadcasts included)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


@kernel_op("srope::normalized_projection_backward")
def _backward_op(
    dy: torch.Tensor, dy_rest: torch.Tensor | None, y: torch.Tensor, y_rest: torch.Tensor | None, inv_norm: torch.Tensor,
    weight: torch.Tensor, x: torch.Tensor, host_grad: torch.Tensor | None, weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    count, heads, chunk = x.shape
    width = weight.shape[2]
    split = None if dy_rest is None else dy.shape[2]
    dy, y, inv_norm, weight = _unit_columns(dy), _unit_columns(y), inv_norm.contiguous(), weight.contiguous()
    dy2, y2 = (dy, y) if split is None else (_unit_columns(dy_rest), _unit_columns(y_rest))
    host_grad = None if host_grad is None else host_grad.contiguous()
    dx = torch.empty(count, heads, chunk, dtype=torch.float32, device=x.device)
    block_n, block_i, warps, stages, *maxnreg = (16, 16, 4, 1) if interpreting() else BACKWARD_TILE
    block_i = min(block_i, max(16, next_power_of_2(chunk)))
    tokens = slab_tokens(count, block_n, 32 if interpreting() else SLAB)
    slabs = cdiv(count, tokens) if weight_grad else 0
    if count == 0 or width == 0:
        dx = dx.zero_() if host_grad is None else host_grad.to(torch.float32, copy=True)
        return dx, torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
    partial = torch.empty(slabs, heads, chunk, width, dtype=torch.float32, device=x.device)
    columns = _columns(width, split)
    with on_device(x):
        backward_kernel[(cdiv(count, tokens), heads, cdiv(chunk, block_i))](
            dy, dy2, y, y2, inv_norm, weight, x, dx if host_grad is None else host_grad, dx, partial, dx, count, x.stride(0),
            tokens, STRIDES=part_strides(dy, dy2, y, y2), H=heads, I=chunk, C2=columns["W1"] if split is None else 0, BN=block_n, BI=block_i, **columns,
            HOST_GRAD=host_grad is not None, WEIGHT_GRAD=weight_grad, STORE_Z=False, UPCAST=interpreting(), num_warps=warps,
            num_stages=stages, **({"maxnreg": maxnreg[0]} if maxnreg else {}), **pdl(x),
        )
    # (without the weight gradient: zeros of its shape, which the caller drops)
    return dx, partial[0] if slabs == 1 else partial.sum(0)  # a fixed order: deterministic


@_backward_op.register_fake
def _backward_op_fake(dy, dy_rest, y, y_rest, inv_norm, weight, x, host_grad, weight_grad):
    return x.new_empty(x.shape, dtype=torch.float32), x.new_empty(weight.shape, dtype=torch.float32)


def _parts(name: str, t) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A tensor ``[N, H, M]`` or a pair of its column parts, as ``(first, rest or None)``."""
    if isinstance(t, torch.Tensor):
        return t, None
    if not (isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(p, torch.Tensor) for p in t)):
        raise TypeError(f"{name} must be a tensor [N, H, M] or a pair of tensors [N, H, S] and [N, H, M - S]")
    return t[0], t[1]


def projection_backward(
    dy, y, inv_norm: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, weight_grad: bool = True,
    host_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradients of ``y = r · x @ weight``, ``r = (|x|² + ε)^(-1/2)`` per token and head
    (:func:`srope.ops.generator.projection.normalized_head_projection`), with 16-bit products.

    Args:
        dy: ``[N, H, M]`` float32, the gradient of y, or the pair of the gradients of its
            column parts ``[N, H, S]`` and ``[N, H, M - S]`` (any row and head strides: a
            broadcast over heads is read in place).
        y: ``[N, H, M]`` float32 (or its two parts, split as dy), the forward's output.
        inv_norm: ``[N, H]`` float32, the forward's r.
        weight: ``[H, I, M]`` bfloat16 or float16, the weight rounded to the products' dtype.
        x: ``[N, H, I]`` float32, or x rounded to the weight's dtype (the last two dimensions
            contiguous, any token stride).
        weight_grad: also return the weight's gradient, else None for it.
        host_grad: ``[N, H, I]`` (any float dtype) or None: the gradient of the forward's
            16-bit copy of x (:func:`projection_forward`'s ``cast``), added into dx.

    Returns ``dx [N, H, I]`` and ``dw [H, I, M]`` (or None), float32: with ``dz = r · dy``
    and x rounded to the weight's dtype, ``dx = dz @ weightᵀ - r²(dy·y)·x (+ host_grad)``
    and ``dw = Σ_n x_lowᵀ dz``, accumulated in float32.
    """
    (dy, dy_rest), (y, y_rest) = _parts("dy", dy), _parts("y", y)
    tensors = [t for t in (dy, dy_rest, y, y_rest, inv_norm) if t is not None]
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"weight must be bfloat16 or float16 (the products' dtype), got {weight.dtype}")
    if any(t.dtype != torch.float32 for t in tensors):
        raise TypeError(f"dy, y and inv_norm must be float32, got {[t.dtype for t in tensors]}")
    if x.dtype not in (torch.float32, weight.dtype):
        raise TypeError(f"x must be float32 or the weight's dtype {weight.dtype}, got {x.dtype}")
    tensors.append(x)
    if x.dim() != 3 or weight.dim() != 3 or inv_norm.dim() != 2 or any(t.dim() != 3 for t in (dy, dy_rest, y, y_rest) if t is not None):
        raise ValueError("expected dy and y [N, H, M] (or pairs of [N, H, ·]), inv_norm [N, H], weight [H, I, M], x [N, H, I]")
    count, heads, chunk = x.shape
    width = dy.shape[2] + (0 if dy_rest is None else dy_rest.shape[2])
    same_split = (dy_rest is None) == (y_rest is None) and y.shape == dy.shape
    same_split = same_split and (y_rest is None or y_rest.shape == dy_rest.shape)
    if (not same_split or tuple(dy.shape[:2]) != (count, heads) or (dy_rest is not None and tuple(dy_rest.shape[:2]) != (count, heads))
            or tuple(weight.shape) != (heads, chunk, width) or tuple(inv_norm.shape) != (count, heads)):
        raise ValueError(f"shapes disagree: dy {[tuple(t.shape) for t in (dy, dy_rest) if t is not None]}, "
                         f"y {[tuple(t.shape) for t in (y, y_rest) if t is not None]}, inv_norm {tuple(inv_norm.shape)}, "
                         f"weight {tuple(weight.shape)}, x {tuple(x.shape)}")
    if host_grad is not None and (tuple(host_grad.shape) != tuple(x.shape) or not host_grad.is_floating_point()):
        raise ValueError(f"host_grad must be a floating-point tensor of x's shape {tuple(x.shape)}, got "
                         f"{tuple(host_grad.shape)} {host_grad.dtype}")
    if len({t.device for t in [*tensors, weight] + ([] if host_grad is None else [host_grad])}) != 1:
        raise ValueError("dy, y, inv_norm, weight, x (and host_grad) must be on one device")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused projection gradient needs CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")
    dx, dw = _backward_op(dy, dy_rest, y, y_rest, inv_norm, weight, x, host_grad, weight_grad)
    return dx, dw if weight_grad else None


# --------------------------------------------------------------------------- forward


@triton.jit
def split_weight_kernel(weight, w_hi, w_lo, scale, I, M, BI: tl.constexpr, BM: tl.constexpr, PDL: tl.constexpr = False):
    """Program (head, block of columns): each column's power-of-two scale (the smallest power
    of two >= its largest |entry|; 1 for a zero column), and the scaled column as a float16
    pair ``hi + lo``."""
    await_predecessor(PDL)
    h, pm = tl.program_id(0), tl.program_id(1)
    mm = pm * BM + tl.arange(0, BM)
    mm_ok = mm < M
    peak = tl.zeros([BM], dtype=tl.float32)
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        m = (ii < I)[:, None] & mm_ok[None, :]
        peak = tl.maximum(peak, tl.max(tl.abs(tl.load(weight + (h * I + ii[:, None]) * M + mm[None, :], mask=m, other=0.0)), 0))
    # 2^(e+1) for peak = 1.f·2^e, from the exponent bits (exact; no log2/exp2 rounding).
    biased = (peak.to(tl.int32, bitcast=True) >> 23) & 0xFF
    power = ((tl.minimum(biased, 253) + 1) << 23).to(tl.float32, bitcast=True)
    power = tl.where(peak > 0, power, 1.0)
    tl.store(scale + h * M + mm, power, mask=mm_ok)
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        m = (ii < I)[:, None] & mm_ok[None, :]
        offsets = (h * I + ii[:, None]) * M + mm[None, :]
        w = tl.load(weight + offsets, mask=m, other=0.0) / power[None, :]
        hi = w.to(tl.float16, fp_downcast_rounding="rtne")
        tl.store(w_hi + offsets, hi, mask=m)
        tl.store(w_lo + offsets, (w - hi.to(tl.float32)).to(tl.float16, fp_downcast_rounding="rtne"), mask=m)


@triton.jit
def _chunk_products(xh, kk, mk, h, start, end, w_hi, w_lo, acc, corr, I: tl.constexpr, M: tl.constexpr, BM: tl.constexpr,
                    UPCAST: tl.constexpr):
    """One chunk of the head's inputs (``xh [BN, BK]`` = x̂ at input rows ``kk``) times
    columns ``start + [0, BM)`` (those below ``end``) of the weight, as float16 splits: ``hi·w_hi`` from a zero
    accumulator, added to ``acc`` in float32 (the tensor cores truncate when they add into
    an accumulator, and a long chain of such adds drifts), and ``lo·w_hi + hi·w_lo`` into
    ``corr`` (terms 2^-11 the size: their rounding is far below float32's)."""
    hi = xh.to(tl.float16, fp_downcast_rounding="rtne")
    lo = (xh - hi.to(tl.float32)).to(tl.float16, fp_downcast_rounding="rtne")
    mm = start + tl.arange(0, BM)
    offsets = (h * I + kk[:, None]) * M + mm[None, :]
    m = mk[:, None] & (mm < end)[None, :]
    w_hi, w_lo = tl.load(w_hi + offsets, mask=m, other=0.0), tl.load(w_lo + offsets, mask=m, other=0.0)
    if UPCAST:
        hi, lo, w_hi, w_lo = hi.to(tl.float32), lo.to(tl.float32), w_hi.to(tl.float32), w_lo.to(tl.float32)
    acc += tl.dot(hi, w_hi)
    corr = tl.dot(lo, w_hi, corr)
    return acc, tl.dot(hi, w_lo, corr)


@triton.jit
def _store_columns(out, acc, scale, nn, mn, h, start, end, col, H: tl.constexpr, M: tl.constexpr, WIDTH: tl.constexpr,
                   BM: tl.constexpr):
    """Columns ``[start, end)`` into ``out`` [N, H, WIDTH] from its column ``col``."""
    mm = tl.arange(0, BM)
    mm_ok = start + mm < end
    power = tl.load(scale + h * M + start + mm, mask=mm_ok, other=0.0)
    offsets = (nn[:, None].to(tl.int64) * H + h) * WIDTH + col + mm[None, :]
    tl.store(out + offsets, acc * power[None, :], mask=mn[:, None] & mm_ok[None, :])


@triton.jit
def forward_kernel(
    x, w_hi, w_lo, scale, y1, y2, inv_norm, x_cast, N, x_n, eps,
    H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, W1: tl.constexpr, Y1W: tl.constexpr, Y2W: tl.constexpr,
    C2: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BM1: tl.constexpr, BM2: tl.constexpr, TWO: tl.constexpr,
    CAST: tl.constexpr, UPCAST: tl.constexpr, NORM_BK: tl.constexpr, NORM_STAGES: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (token block, head): ``r`` and ``y = (r·x) @ weight`` there, the products as
    float16 splits (module docstring): columns ``[0, W1)`` (a BM1 tile) into ``y1`` [N, H, Y1W]
    and, if TWO, ``[W1, M)`` (a BM2 tile) into ``y2`` [N, H, Y2W] from its column C2.
    x is read twice: for r (and, if CAST, its copy rounded to ``x_cast``'s dtype, [N, H, I])
    in chunks of NORM_BK inputs, software-pipelined over NORM_STAGES, then (from L2) for the
    products in chunks of BK."""
    await_predecessor(PDL)
    pn, h = tl.program_id(0), tl.program_id(1)
    nn = pn * BN + tl.arange(0, BN)
    mn = nn < N
    rows = x + nn[:, None].to(tl.int64) * x_n + h * I
    squares = tl.zeros([BN], dtype=tl.float32)
    for start in tl.range(0, I, NORM_BK, num_stages=NORM_STAGES):
        kk = start + tl.arange(0, NORM_BK)
        tile = mn[:, None] & (kk < I)[None, :]
        xs = tl.load(rows + kk[None, :], mask=tile, other=0.0)
        squares += tl.sum(xs * xs, 1)
        if CAST:
            cast = xs.to(x_cast.dtype.element_ty, fp_downcast_rounding="rtne")
            tl.store(x_cast + (nn[:, None].to(tl.int64) * H + h) * I + kk[None, :], cast, mask=tile)
    r = 1.0 / tl.sqrt_rn(squares + eps)
    acc1, corr1 = tl.zeros([BN, BM1], dtype=tl.float32), tl.zeros([BN, BM1], dtype=tl.float32)
    acc2, corr2 = tl.zeros([BN, BM2], dtype=tl.float32), tl.zeros([BN, BM2], dtype=tl.float32)
    for start in range(0, I, BK):
        kk = start + tl.arange(0, BK)
        mk = kk < I
        xh = tl.load(rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0) * r[:, None]
        acc1, corr1 = _chunk_products(xh, kk, mk, h, 0, W1, w_hi, w_lo, acc1, corr1, I, M, BM1, UPCAST)
        if TWO:
            acc2, corr2 = _chunk_products(xh, kk, mk, h, W1, M, w_hi, w_lo, acc2, corr2, I, M, BM2, UPCAST)
    _store_columns(y1, acc1 + corr1, scale, nn, mn, h, 0, W1, 0, H, M, Y1W, BM1)
    if TWO:
        _store_columns(y2, acc2 + corr2, scale, nn, mn, h, W1, M, C2, H, M, Y2W, BM2)
    tl.store(inv_norm + nn * H + h, r, mask=mn)


# BN tokens x BK inputs per step, warps, stages. 32-input tiles: a 64-input tile faults in
# Triton 3.6 on some head chunks (illegal address; docs/kernels.md, "Tuning").
FORWARD_TILE = (64, 32, 4, 3)  # BN, BK, warps, software-pipeline stages
# The norm's pass: inputs per step and software-pipeline stages (with 1 stage each step's load
# waits for the last: Triton pipelines only the products' loads by itself).
NORM_PASS = (64, 2)
INTERPRETED_FORWARD = ((16, 16, 4, 1), (16, 1))  # (FORWARD_TILE, NORM_PASS) under TRITON_INTERPRET=1


def column_blocks(width: int) -> tuple[int, int]:
    """The forward's two column tiles: the largest power of two <= ``width`` (at least 16),
    and a power of two (at least 16) for the rest, or 0 where the first covers them all."""
    first = max(16, 1 << (width.bit_length() - 1))
    return first, 0 if width <= first else max(16, next_power_of_2(width - first))


@kernel_op("srope::normalized_projection_forward")
def _forward_op(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cast: torch.dtype | None, split: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    weight = weight.contiguous()
    count, heads, chunk = x.shape
    width = weight.shape[2]
    first = width if split is None else split
    y = torch.empty(count, heads, first, dtype=x.dtype, device=x.device)
    y_rest = torch.empty(count, heads, width - first, dtype=x.dtype, device=x.device)
    inv_norm = torch.empty(count, heads, dtype=x.dtype, device=x.device)
    x_cast = torch.empty(x.shape if cast is not None else (0, heads, chunk), dtype=cast or x.dtype, device=x.device)
    if count == 0 or width == 0:
        if count:  # no outputs: r and the cast still come out
            inv_norm.copy_(torch.rsqrt(x.square().sum(-1) + eps))
            if cast is not None:
                x_cast.copy_(x)
        return y, y_rest, inv_norm, x_cast
    w_hi = torch.empty(weight.shape, dtype=torch.float16, device=x.device)
    w_lo = torch.empty_like(w_hi)
    scale = torch.empty(heads, width, dtype=torch.float32, device=x.device)
    (block_n, block_k, warps, stages), (norm_k, norm_stages) = INTERPRETED_FORWARD if interpreting() else (FORWARD_TILE, NORM_PASS)
    columns = _columns(width, split)
    # unsplit, the second tile's columns go to y as well, from its column W1
    second = dict(Y2W=width, C2=columns["W1"]) if split is None else dict(Y2W=width - split, C2=0)
    with on_device(x):
        split_weight_kernel[(heads, cdiv(width, 32))](weight, w_hi, w_lo, scale, chunk, width, BI=64, BM=32, **pdl(x))
        forward_kernel[(cdiv(count, block_n), heads)](
            x, w_hi, w_lo, scale, y, y if split is None else y_rest, inv_norm, x_cast if cast is not None else y, count,
            x.stride(0), eps, H=heads, I=chunk, Y1W=first, **second, BN=block_n, BK=block_k, **columns,
            CAST=cast is not None, UPCAST=interpreting(), NORM_BK=norm_k, NORM_STAGES=norm_stages, num_warps=warps, num_stages=stages,
            **pdl(x),
        )
    return y, y_rest, inv_norm, x_cast


@_forward_op.register_fake
def _forward_op_fake(x, weight, eps, cast, split):
    count, heads, width = x.shape[0], x.shape[1], weight.shape[2]
    first = width if split is None else split
    return (x.new_empty((count, heads, first)), x.new_empty((count, heads, width - first)), x.new_empty(x.shape[:2]),
            x.new_empty(x.shape if cast is not None else (0, *x.shape[1:]), dtype=cast or x.dtype))


def projection_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cast: torch.dtype | None = None, split: int | None = None
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """``y = r · x @ weight`` and ``r = (|x|² + ε)^(-1/2)`` per token and head
    (:func:`srope.ops.generator.projection.normalized_head_projection`'s forward), float32-accurate
    on tensor cores (module docstring).

    Args:
        x: ``[N, H, I]`` float32 (the last two dimensions contiguous, any token stride).
        weight: ``[H, I, M]`` float32.
        eps: ε of the norm, >= 0.
        cast: bfloat16, float16 or None: also return x rounded to this dtype (to nearest),
            written on the way (what autocast would give the host's linear maps).
        split: None, or ``S`` with ``1 <= S < M``: y comes as two contiguous tensors, its
            columns ``[0, S)`` and ``[S, M)``, written where they go (no copy splits them).

    Returns ``y [N, H, M]`` (or its pair of parts) and ``inv_norm [N, H]``, float32, and the
    cast ``[N, H, I]`` (or None).
    """
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise TypeError(f"x and weight must be float32, got {x.dtype} and {weight.dtype}")
    if x.dim() != 3 or weight.dim() != 3 or tuple(weight.shape[:2]) != tuple(x.shape[1:]):
        raise ValueError(f"expected x [N, H, I] and weight [H, I, M], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x and weight must be on one device, got {x.device} and {weight.device}")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused projection needs CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if cast not in (None, torch.bfloat16, torch.float16):
        raise TypeError(f"cast must be None, torch.bfloat16 or torch.float16, got {cast}")
    if split is not None and (isinstance(split, bool) or not isinstance(split, int) or not 1 <= split < weight.shape[2]):
        raise ValueError(f"split must be None or an int in [1, {weight.shape[2]}) (the outputs M = {weight.shape[2]}), "
                         f"got {split!r}")
    y, y_rest, inv_norm, x_cast = _forward_op(x, weight, float(eps), cast, split)
    return y if split is None else (y, y_rest), inv_norm, x_cast if cast is not None else None
