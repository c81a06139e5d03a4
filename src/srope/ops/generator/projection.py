"""The Selective RoPE generator's first step: per-head linear maps of the ℓ2-normalised input.

``y[..., h, :] = x̂_h @ weight[h]`` with ``x̂_h = x_h / sqrt(|x_h|² + ε)`` for every head
chunk ``x_h``. Since the normalisation is one scalar per token and head, it is applied to
the small output instead of the input: x̂ (the size of the block input, in float32) is
never built, and every head's maps (the ω projection and the first layers of the gate)
share one read of x. The weight gradient, a reduction over all tokens into a small
matrix, is split into slabs of tokens so that it fills the GPU (one long reduction runs on
a few dozen thread blocks): :data:`TORCH_SLAB` tokens each on the torch route; on CUDA the fused backward kernel
sums its own slabs (srope.ops.generator.projection_kernels).

The forward always runs to the accuracy of the inputs' dtype (float32 or float64): the
outputs become angle increments that are summed over the whole sequence. (On CUDA the
float32 one runs on tensor cores with split float16 operands, float32-accurate:
srope.ops.generator.projection_kernels.) The backward's two products (input and weight gradients)
may run in a lower ``grad_dtype`` (bfloat16 under autocast, as autocast runs every other
matmul of the backward), accumulated and returned in the inputs' dtype: a gradient's
rounding does not accumulate along the sequence.
"""

from __future__ import annotations

import torch

from srope import backend

TORCH_SLAB = 2048  # tokens per partial weight gradient on the torch route


def _weight_grad(x: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """``Σ_n x[n, h]ᵀ dz[n, h]`` as ``[H, I, M]`` for ``x [N, H, I]``, ``dz [N, H, M]``:
    per-slab products, then their sum (fixed order: deterministic). One head at a time, so
    that every operand is a strided view cuBLAS reads in place (no copy of x)."""
    count, heads = x.shape[:2]
    slabs = count // TORCH_SLAB
    main = slabs * TORCH_SLAB if slabs > 1 else 0
    grads = []
    for head in range(heads):
        xh, dh = x[:, head], dz[:, head]
        grad = xh[main:].T @ dh[main:]
        grad = grad.float() if grad.dtype in (torch.float16, torch.bfloat16) else grad
        if main:  # the slabs' partial sums add up in at least float32
            grad = grad + torch.bmm(xh[:main].unflatten(0, (slabs, TORCH_SLAB)).mT, dh[:main].unflatten(0, (slabs, TORCH_SLAB))).sum(0, dtype=grad.dtype)
        grads.append(grad)
    return torch.stack(grads)


def _head_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a[n, h] @ b[h]`` as ``[N, H, M]`` for ``a [N, H, I]`` and ``b [H, I, M]``. Eager, the
    product is written in [N, H, M] order (cuBLAS takes the strides), so that what reads it
    next sees contiguous memory (a [H, N, M] product costs two non-vectorised copies and a
    strided multiply); torch.compile cannot trace a
    product into a strided ``out=`` and chooses its own layout."""
    if torch.compiler.is_compiling():
        return torch.bmm(a.transpose(0, 1), b).transpose(0, 1)
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=a.dtype, device=a.device)
    torch.bmm(a.transpose(0, 1), b, out=out.transpose(0, 1))
    return out


class _NormalizedHeadProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, grad_dtype: torch.dtype, cast: torch.dtype | None,
                split: int | None, x_low: torch.Tensor | None):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        if x.is_cuda and x.dtype == torch.float32 and backend.kernels(x):
            from srope.ops.generator.projection_kernels import projection_forward

            y, inv_norm, x_cast = projection_forward(x, weight, eps, cast, split)
            parts = (y,) if split is None else y
        else:
            x_cast = None if cast is None else x.to(cast)
            inv_norm = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square() + eps)  # [N, H]
            y = _head_products(x, weight).mul_(inv_norm[..., None])
            parts = (y,) if split is None else (y[..., :split].contiguous(), y[..., split:].contiguous())
        # With the backward's products in the cast's dtype, the backward reads x only as that
        # copy (the host's maps keep it anyway): saving the float32 x instead would hold the
        # block input's full-precision copy, 2x the cast's bytes, for the backward alone.
        if x_low is None and cast is not None and cast == grad_dtype:
            x_low = x_cast
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(x if x_low is None else x_low, weight, inv_norm, *parts)
        ctx.grad_dtype, ctx.parts = grad_dtype, len(parts)
        return (*parts, *(() if cast is None else (x_cast,)))

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward writes into views (bmm out=)
    def backward(ctx, *grads: torch.Tensor | None):
        x, weight, inv_norm, *parts = ctx.saved_tensors
        dys = [torch.zeros_like(p) if g is None else g for p, g in zip(parts, grads)]
        d_cast = grads[ctx.parts] if len(grads) > ctx.parts else None
        low = ctx.grad_dtype != ctx.x_dtype
        dx = dw = None
        if ctx.needs_input_grad[0] and low and x.is_cuda and ctx.x_dtype == torch.float32 and backend.kernels(x):
            from srope.ops.generator.projection_kernels import projection_backward

            dy, y = (dys[0], parts[0]) if ctx.parts == 1 else (tuple(dys), tuple(parts))
            dx, dw = projection_backward(dy, y, inv_norm, weight.to(ctx.grad_dtype), x, ctx.needs_input_grad[1], d_cast)
            return dx, dw, None, None, None, None, None
        dy, y = (dys[0], parts[0]) if ctx.parts == 1 else (torch.cat(dys, -1), torch.cat(parts, -1))
        dz_low = (dy * inv_norm[..., None]).to(ctx.grad_dtype)  # products in grad_dtype, the rest in x's
        if ctx.needs_input_grad[0]:
            # d/dx of r(x)·z(x), r = (|x|² + ε)^(-1/2), z = x @ W: the map's gradient scaled
            # by r, plus x · dr/d|x|² · 2 (dy·z) = -r³ (dy·z) x = -r² (dy·y) x.
            d_norm = -(dy * y).sum(-1) * inv_norm.square()  # [N, H]
            product = _head_products(dz_low, weight.to(dz_low.dtype).mT)
            x_full = x.to(ctx.x_dtype)
            dx = torch.addcmul(product, x_full, d_norm[..., None]) if low else product.addcmul_(x_full, d_norm[..., None])
            if d_cast is not None:
                dx += d_cast
        if ctx.needs_input_grad[1]:
            dw = _weight_grad(x.to(ctx.grad_dtype), dz_low).to(ctx.x_dtype)
        return dx, dw, None, None, None, None, None


def normalized_head_projection(
    x: torch.Tensor, weight: torch.Tensor, eps: float, grad_dtype: torch.dtype | None = None, cast: torch.dtype | None = None,
    split: int | None = None, *, x_low: torch.Tensor | None = None,
):
    """``x̂_h @ weight[h]`` for ``x [..., H, I]`` and ``weight [H, I, M]``: ``[..., H, M]``.

    Same dtype for both (the generator's float32 or float64); no autocast inside.
    ``grad_dtype`` (default: that dtype) is the dtype of the backward's two matrix
    products, float16 or bfloat16 for speed (the gradients come back in x's dtype).

    ``cast`` (bfloat16 or float16): also return x rounded to that dtype, as autocast would
    round it for other linear maps of x. Maps that read this copy send their gradient back
    through this function, which adds it into x's: one gradient for x instead of two that
    autograd adds (and, on CUDA, the copy is written by the forward kernel, which reads x
    anyway). Returns ``(y, x_cast)`` then. With ``grad_dtype == cast`` the backward keeps
    only that copy of x (its ``-r²(dy·y)·x`` term then reads x rounded to ``cast``, like the
    products).

    ``split`` (``1 <= S < M``): y as two contiguous tensors, its columns ``[0, S)`` and
    ``[S, M)`` (``((y_first, y_rest), x_cast)`` with ``cast``). On CUDA the kernels write
    and read the parts where they are, so a consumer that needs one part contiguous (the
    generator's conv) gets it without a copy; a part's gradient may be a broadcast.

    ``x_low`` (instead of ``cast``): x already rounded to ``grad_dtype`` (float16 or bfloat16),
    a copy the caller holds anyway (a host layer's autocast input, which its own maps read
    before this runs): the backward keeps it instead of x, as with ``cast == grad_dtype``.
    No gradient flows into it."""
    if x.dim() < 2 or weight.dim() != 3 or x.shape[-2:] != weight.shape[:2]:
        raise ValueError(f"x [..., H, I] and weight [H, I, M] must agree, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    if grad_dtype is None:
        grad_dtype = x.dtype
    if grad_dtype not in (x.dtype, torch.float16, torch.bfloat16):
        raise TypeError(f"grad_dtype must be None, {x.dtype}, torch.float16 or torch.bfloat16, got {grad_dtype}")
    if cast not in (None, torch.float16, torch.bfloat16):
        raise TypeError(f"cast must be None, torch.float16 or torch.bfloat16, got {cast}")
    if split is not None and (isinstance(split, bool) or not isinstance(split, int) or not 1 <= split < weight.shape[2]):
        raise ValueError(f"split must be None or an int in [1, {weight.shape[2]}) (the outputs M), got {split!r}")
    if x_low is not None:
        if cast is not None:
            raise ValueError("pass either cast (a copy made here) or x_low (the caller's copy), not both")
        if not isinstance(x_low, torch.Tensor) or x_low.shape != x.shape or x_low.dtype != grad_dtype or grad_dtype == x.dtype:
            got = f"{tuple(x_low.shape)} {x_low.dtype}" if isinstance(x_low, torch.Tensor) else type(x_low).__name__
            raise ValueError(f"x_low must be x {tuple(x.shape)} in a lower grad_dtype (got grad_dtype {grad_dtype}), "
                             f"got {got}")
        x_low = x_low.detach().reshape(-1, *x.shape[-2:])
    lead = x.shape[:-2]
    out = _NormalizedHeadProjection.apply(x.reshape(-1, *x.shape[-2:]), weight, eps, grad_dtype, cast, split, x_low)
    out = out if isinstance(out, tuple) else (out,)
    parts = [p.reshape(*lead, *p.shape[-2:]) for p in out[: 1 if split is None else 2]]
    y = parts[0] if split is None else tuple(parts)
    return y if cast is None else (y, out[-1].reshape(x.shape))
