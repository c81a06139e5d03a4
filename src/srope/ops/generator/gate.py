"""The generator's per-head phase gate after its short conv, as one Triton kernel each way.

With the full-rank ω map and the standard gate (the paper's best configuration), one
projection of x̂ gives, per token n, ``u [N, H·R]`` (head h's R angle inputs, the conv's
input) and ``y [N, H, H]`` (head h's share of every head's gate logit: a map of x is the sum
of its per-head shares), as two tensors (:func:`srope.ops.generator.projection.normalized_head_projection`
with ``split``). After the conv (fla's, unchanged) the generator computes::

    s[n, g] = sigmoid(Σ_h y[n, h, g] + gate_bias[g])         (the gate)
    φ[n, h, r] = (act(c[n, h·R + r]) + e[h, r]) · s[n, h]   (c = conv output, e = exp(bias))

The conv's activation (SiLU or none) is applied here, not by fla's conv: fla's backward of
a conv with its fused activation first recomputes the conv's forward (for the
pre-activation), while this kernel reads c anyway.

With torch that is a sum over heads, an add, a sigmoid, a broadcast add and a broadcast
multiply, and in the backward the products, two reductions over r and n, the sigmoid's
gradient and an expand: a dozen kernels, several of them not vectorised (a large share of
the generator's time, docs/kernels.md). Here :func:`apply_head_gate` is one kernel
each way, the gate recomputed from y (H numbers per token) rather than stored. The logits'
gradient ``ds·s(1-s)`` reaches every head's share of a logit unchanged, so y's gradient is
that ``[N, H]`` tensor broadcast over the shares (the projection's backward reads it in
place). The reductions over tokens (the gradients of ``gate_bias`` and ``e``) are
per-block partial sums added in a fixed order: deterministic, no atomics.

float32 only (the generator's dtype under autocast); the float64 reference is the torch
route in :meth:`srope.modules.SelectiveRoPE.generator_inputs` / ``phase_increments``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops._triton import await_predecessor, cdiv, interpreting, kernel_op, next_power_of_2, on_device, pdl

BLOCK_N = 64  # tokens per program
INTERPRET_BLOCK_N = 16  # under TRITON_INTERPRET=1 (quicker tests); 0: the GPU's
# The conv-fused backward's first pass holds several [tokens, R] tiles at once (dφ, the
# recomputed conv, dc, the taps for dw): tokens per program such that ptxas keeps them in
# registers on sm_90 (64 tokens spilled at R = 64, K = 4; tests/ops/compile_sm90.py).
CONV_BWD_TILE = 32 * 64 * 4  # tokens x pairs (padded to a power of two) x max(taps, 4)
# Offsets are int32 in the kernels: calls with more elements are refused.
MAX_ELEMENTS = 2**31 - 1
ACTIVATIONS = (None, "silu", "swish")  # the conv's (srope.ops.conv.ACTIVATIONS)


@triton.jit
def _gate(y, gate_bias, nn, mn, h, H: tl.constexpr, BH: tl.constexpr):
    """``s[n, h] = sigmoid(Σ_j y[n, j, h] + gate_bias[h])`` for the block's tokens ``nn``."""
    jj = tl.arange(0, BH)
    shares = tl.load(y + (nn[:, None] * H + jj[None, :]) * H + h, mask=mn[:, None] & (jj < H)[None, :], other=0.0)
    return tl.sigmoid(tl.sum(shares, axis=1) + tl.load(gate_bias + h))


@triton.jit
def _gate_grad(grad, value, y, gate_bias, e, nn, mn, h, rr, mr, H: tl.constexpr, R: tl.constexpr, HAS_BIAS: tl.constexpr,
               SILU: tl.constexpr, BH: tl.constexpr):
    """From dφ and the conv's output c at the tokens ``nn``: ``(dc, dφ·s, the logit's gradient)``."""
    slope = 1.0
    if SILU:
        sig = tl.sigmoid(value)
        slope = sig * (1.0 + value * (1.0 - sig))
        value = value * sig
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = _gate(y, gate_bias, nn, mn, h, H, BH)
    scaled = grad * gate[:, None]
    logit_grad = tl.where(mn, tl.sum(grad * value, axis=1) * gate * (1.0 - gate), 0.0)
    return scaled * slope, scaled, logit_grad


@triton.jit
def apply_fwd_kernel(c, y, gate_bias, e, phi, N, H: tl.constexpr, R: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                     BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr = False):
    await_predecessor(PDL)
    nn = tl.program_id(0) * BN + tl.arange(0, BN)
    h = tl.program_id(1)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    tile = mn[:, None] & mr[None, :]
    value = tl.load(c + nn[:, None] * (H * R) + h * R + rr[None, :], mask=tile, other=0.0)
    if SILU:
        value = value * tl.sigmoid(value)
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = _gate(y, gate_bias, nn, mn, h, H, BH)
    tl.store(phi + (nn[:, None] * H + h) * R + rr[None, :], value * gate[:, None], mask=tile)


@triton.jit
def apply_bwd_kernel(dphi, c, y, gate_bias, e, dc, dlogit, partial_bias, partial_e, N, H: tl.constexpr, R: tl.constexpr,
                     HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr = False):
    """dc = dφ·s·act'(c); the logit's gradient ``dlogit = s(1-s) Σ_r dφ·(act(c) + e)`` and its
    sum over the block's tokens (``partial_bias``); with a bias, ``partial_e``: Σ over the
    block of dφ·s."""
    await_predecessor(PDL)
    pn, h = tl.program_id(0), tl.program_id(1)
    nn = pn * BN + tl.arange(0, BN)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    tile = mn[:, None] & mr[None, :]
    grad = tl.load(dphi + (nn[:, None] * H + h) * R + rr[None, :], mask=tile, other=0.0)
    value = tl.load(c + nn[:, None] * (H * R) + h * R + rr[None, :], mask=tile, other=0.0)
    grad_c, scaled, logit_grad = _gate_grad(grad, value, y, gate_bias, e, nn, mn, h, rr, mr, H, R, HAS_BIAS, SILU, BH)
    tl.store(dc + nn[:, None] * (H * R) + h * R + rr[None, :], grad_c, mask=tile)
    tl.store(dlogit + nn * H + h, logit_grad, mask=mn)
    tl.store(partial_bias + pn * H + h, tl.sum(logit_grad, axis=0))
    if HAS_BIAS:
        tl.store(partial_e + (pn * H + h) * R + rr, tl.sum(scaled, axis=0), mask=mr)


def _launch(x: torch.Tensor, block_n: int = BLOCK_N):
    block_n = INTERPRET_BLOCK_N if interpreting() and INTERPRET_BLOCK_N else block_n
    return block_n, cdiv(x.shape[0], block_n)


def _conv_fwd_block_n(pairs: int) -> int:
    return max(8, min(BLOCK_N, BLOCK_N * 64 // next_power_of_2(pairs)))  # 64 x 128 spilled on sm_90


def _conv_bwd_block_n(pairs: int, width: int) -> int:
    fits = CONV_BWD_TILE // (next_power_of_2(pairs) * max(width, 4))
    return max(8, min(32, 1 << (fits.bit_length() - 1) if fits else 0))


def _meta(heads: int, pairs: int, block_n: int) -> dict:
    return dict(H=heads, R=pairs, BN=block_n, BR=next_power_of_2(pairs), BH=next_power_of_2(heads))


@kernel_op("srope::head_gate_apply")
def _apply_op(c: torch.Tensor, y: torch.Tensor, gate_bias: torch.Tensor, e: torch.Tensor | None, silu: bool) -> torch.Tensor:
    count, heads = y.shape[:2]
    pairs = c.shape[1] // heads
    c, y, gate_bias = c.contiguous(), y.contiguous(), gate_bias.contiguous()
    phi = torch.empty(count, heads, pairs, dtype=c.dtype, device=c.device)
    block_n, blocks = _launch(c)
    if count:
        with on_device(c):
            apply_fwd_kernel[(blocks, heads)](c, y, gate_bias, c if e is None else e.contiguous(), phi, count,
                                              HAS_BIAS=e is not None, SILU=silu, **_meta(heads, pairs, block_n), **pdl(c))
    return phi


@_apply_op.register_fake
def _(c, y, gate_bias, e, silu):
    return c.new_empty((y.shape[0], y.shape[1], c.shape[1] // y.shape[1]))


@kernel_op("srope::head_gate_apply_bwd")
def _apply_bwd_op(
    dphi: torch.Tensor, c: torch.Tensor, y: torch.Tensor, gate_bias: torch.Tensor, e: torch.Tensor | None, silu: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(dc, dlogit [N, H], dgate_bias, de)`` (de zeros without a bias)."""
    count, heads = y.shape[:2]
    pairs = c.shape[1] // heads
    # autograd saved the forward's inputs as given: the kernel reads them packed
    dphi, c, y, gate_bias = dphi.contiguous(), c.contiguous(), y.contiguous(), gate_bias.contiguous()
    e = None if e is None else e.contiguous()
    dc = torch.empty(c.shape, dtype=c.dtype, device=c.device)
    dlogit = torch.empty(count, heads, dtype=c.dtype, device=c.device)
    block_n, blocks = _launch(c)
    partial_bias = torch.empty(blocks, heads, dtype=c.dtype, device=c.device)
    partial_e = torch.empty(blocks if e is not None else 0, heads, pairs, dtype=c.dtype, device=c.device)
    if count:
        with on_device(c):
            apply_bwd_kernel[(blocks, heads)](dphi, c, y, gate_bias, c if e is None else e, dc, dlogit, partial_bias, partial_e,
                                              count, HAS_BIAS=e is not None, SILU=silu, **_meta(heads, pairs, block_n), **pdl(c))
    return dc, dlogit, partial_bias.sum(0), partial_e.sum(0)


@_apply_bwd_op.register_fake
def _(dphi, c, y, gate_bias, e, silu):
    count, heads = y.shape[:2]
    return torch.empty_like(c), c.new_empty((count, heads)), c.new_empty((heads,)), c.new_empty((heads, c.shape[1] // heads))


def _apply_setup(ctx, inputs, output):
    c, y, gate_bias, e, ctx.silu = inputs
    ctx.has_bias = e is not None
    ctx.save_for_backward(c, y, gate_bias, e)


def _apply_backward(ctx, dphi):
    c, y, gate_bias, e = ctx.saved_tensors
    dc, dlogit, dgate_bias, de = _apply_bwd_op(dphi, c, y, gate_bias, e if ctx.has_bias else None, ctx.silu)
    dy = dlogit[:, None, :].expand(y.shape)  # every head's share of a logit gets all of its gradient
    return dc, dy, dgate_bias, de if ctx.has_bias else None, None


_apply_op.register_autograd(_apply_backward, setup_context=_apply_setup)


def _check(name: str, tensor: torch.Tensor, shape: tuple, device: torch.device) -> None:
    if tensor.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {tensor.dtype}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device} like the other inputs")


def _check_size(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.numel() > MAX_ELEMENTS:
            raise ValueError(f"the fused head gate indexes with int32: at most {MAX_ELEMENTS:,} elements per tensor, "
                             f"got {tensor.numel():,} ({list(tensor.shape)}); split the batch")


def _check_device(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused head gate needs CUDA tensors, or TRITON_INTERPRET=1; got {x.device}")


def apply_head_gate(
    c: torch.Tensor, y: torch.Tensor, gate_bias: torch.Tensor, e: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """``φ[n, h, r] = (act(c[n, h·R + r]) + e[h, r]) · s[n, h]``, ``s[n, g] = sigmoid(Σ_h y[n, h, g] + gate_bias[g])``
    (without e: ``act(c) · s``).

    Args:
        c: ``[N, H·R]`` float32, the conv's output.
        y: ``[N, H, H]`` float32, every head's share of every head's gate logit.
        gate_bias: ``[H]`` float32.
        e: ``[H, R]`` float32 or None, the exponentiated bias.
        activation: the conv's, applied to c first: ``"silu"`` (or ``"swish"``) or None.

    Returns ``φ [N, H, R]``; differentiable in c, y, gate_bias and e (y's gradient is a
    broadcast over its second dimension).
    """
    if y.dim() != 3 or y.shape[1] != y.shape[2] or y.shape[1] < 1:
        raise ValueError(f"y must be [N, H, H] with H >= 1, got {list(y.shape)}")
    heads = y.shape[1]
    if c.dim() != 2 or c.shape[0] != y.shape[0] or c.shape[1] % heads or c.shape[1] == 0:
        raise ValueError(f"c must be [N, H·R] with R >= 1 for y [N, H, H] = {list(y.shape)}, got {list(c.shape)}")
    _check("c", c, tuple(c.shape), c.device)
    _check("y", y, tuple(y.shape), c.device)
    _check("gate_bias", gate_bias, (heads,), c.device)
    if e is not None:
        _check("e", e, (heads, c.shape[1] // heads), c.device)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    _check_size(c, y)
    _check_device(c)
    return _apply_op(c, y, gate_bias, e, activation is not None)


# ----------------------------------------------------------------- with the conv fused in
#
# For rows without padding, packing or a carried state (a training step), the generator's
# short conv runs inside the gate's kernels instead of as an op of its own:
#
#     c[n, ch] = Σ_j w[ch, j] · u[n - (K-1) + j, ch] + b[ch]     (taps before the row's start: 0)
#
# The forward reads u's K taps per token from the cache instead of reading c. The backward
# recomputes c and the gate once per token to form dc, which it stores (float32) with dw's
# and db's per-block partial sums; a second kernel sums du[n] = Σ_s w[:, K-1-s] · dc[n+s]
# over the later tokens of n's row (recomputing dc at each of the K tokens that u[n] reached
# would repeat the conv and the gate K times). This drops the conv's own kernels and
# launches, whose host time is about ten times their kernels' time, and c's round trip
# through memory in the forward.


@triton.jit
def _conv(u, w, conv_bias, nn, t, mn, ch, mr, C: tl.constexpr, K: tl.constexpr, HAS_CONV_BIAS: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
    """c at the tokens ``nn`` (position ``t`` in their row) for the channels ``ch``."""
    acc = tl.zeros((BN, BR), dtype=tl.float32)
    for j in tl.static_range(K):
        ok = mn & (t >= K - 1 - j)
        taps = tl.load(u + (nn - (K - 1 - j))[:, None] * C + ch[None, :], mask=ok[:, None] & mr[None, :], other=0.0)
        acc += taps * tl.load(w + ch * K + j, mask=mr, other=0.0)[None, :]
    if HAS_CONV_BIAS:
        acc += tl.load(conv_bias + ch, mask=mr, other=0.0)[None, :]
    return acc


@triton.jit
def conv_gate_fwd_kernel(u, w, conv_bias, y, gate_bias, e, phi, N, T, H: tl.constexpr, R: tl.constexpr, K: tl.constexpr,
                         HAS_CONV_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BN: tl.constexpr,
                         BR: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr = False):
    await_predecessor(PDL)
    nn = tl.program_id(0) * BN + tl.arange(0, BN)
    h = tl.program_id(1)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    value = _conv(u, w, conv_bias, nn, nn % T, mn, h * R + rr, mr, H * R, K, HAS_CONV_BIAS, BN, BR)
    if SILU:
        value = value * tl.sigmoid(value)
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = _gate(y, gate_bias, nn, mn, h, H, BH)
    tl.store(phi + (nn[:, None] * H + h) * R + rr[None, :], value * gate[:, None], mask=mn[:, None] & mr[None, :])


@triton.jit
def _conv_gate_grad(dphi, u, w, conv_bias, y, gate_bias, e, nn, t, mn, h, rr, mr, H: tl.constexpr, R: tl.constexpr,
                    K: tl.constexpr, HAS_CONV_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                    BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr):
    """At the tokens ``nn``: ``(dc, dφ·s, the logit's gradient)``, c and the gate recomputed."""
    grad = tl.load(dphi + (nn[:, None] * H + h) * R + rr[None, :], mask=mn[:, None] & mr[None, :], other=0.0)
    value = _conv(u, w, conv_bias, nn, t, mn, h * R + rr, mr, H * R, K, HAS_CONV_BIAS, BN, BR)
    return _gate_grad(grad, value, y, gate_bias, e, nn, mn, h, rr, mr, H, R, HAS_BIAS, SILU, BH)


@triton.jit
def conv_gate_bwd_kernel(dphi, u, w, conv_bias, y, gate_bias, e, dc_out, dlogit, partial_w, partial_conv_bias, partial_bias,
                         partial_e, N, T, H: tl.constexpr, R: tl.constexpr, K: tl.constexpr, HAS_CONV_BIAS: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr,
                         PDL: tl.constexpr = False):
    """The first pass: dc (the conv output's gradient, float32), dlogit and per-block partial
    sums of dw ``[C, K]``, db ``[C]``, the gate bias's gradient ``[H]`` and (with a bias) de
    ``[H, R]``."""
    await_predecessor(PDL)
    pn, h = tl.program_id(0), tl.program_id(1)
    nn = pn * BN + tl.arange(0, BN)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    t = nn % T
    ch = h * R + rr
    dc, scaled, logit_grad = _conv_gate_grad(dphi, u, w, conv_bias, y, gate_bias, e, nn, t, mn, h, rr, mr, H, R, K,
                                             HAS_CONV_BIAS, HAS_BIAS, SILU, BN, BR, BH)
    tl.store(dc_out + nn[:, None] * (H * R) + ch[None, :], dc, mask=mn[:, None] & mr[None, :])
    tl.store(dlogit + nn * H + h, logit_grad, mask=mn)
    tl.store(partial_bias + pn * H + h, tl.sum(logit_grad, axis=0))
    if HAS_BIAS:
        tl.store(partial_e + (pn * H + h) * R + rr, tl.sum(scaled, axis=0), mask=mr)
    if HAS_CONV_BIAS:
        tl.store(partial_conv_bias + pn * H * R + ch, tl.sum(dc, axis=0), mask=mr)
    for j in tl.static_range(K):  # dw[:, j] = Σ_n dc[n] · u[n - (K-1) + j]
        ok = mn & (t >= K - 1 - j)
        taps = tl.load(u + (nn - (K - 1 - j))[:, None] * (H * R) + ch[None, :], mask=ok[:, None] & mr[None, :], other=0.0)
        tl.store(partial_w + (pn * H * R + ch) * K + j, tl.sum(dc * taps, axis=0), mask=mr)


@triton.jit
def conv_taps_bwd_kernel(dc, w, du, N, T, H: tl.constexpr, R: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                         BR: tl.constexpr, PDL: tl.constexpr = False):
    """The second pass: ``du[n] = Σ_s w[:, K-1-s] · dc[n+s]`` over the tokens of n's row."""
    await_predecessor(PDL)
    nn = tl.program_id(0) * BN + tl.arange(0, BN)
    h = tl.program_id(1)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    t = nn % T
    ch = h * R + rr
    acc = tl.zeros((BN, BR), dtype=tl.float32)
    for s in tl.static_range(K):  # u[n] reached c[n + s] through tap K-1-s
        later = mn & (t + s < T)
        grad = tl.load(dc + (nn + s)[:, None] * (H * R) + ch[None, :], mask=later[:, None] & mr[None, :], other=0.0)
        acc += grad * tl.load(w + ch * K + (K - 1 - s), mask=mr, other=0.0)[None, :]
    tl.store(du + nn[:, None] * (H * R) + ch[None, :], acc, mask=mn[:, None] & mr[None, :])


@kernel_op("srope::conv_head_gate")
def _conv_gate_op(u: torch.Tensor, w: torch.Tensor, conv_bias: torch.Tensor | None, y: torch.Tensor, gate_bias: torch.Tensor,
                  e: torch.Tensor | None, silu: bool) -> torch.Tensor:
    batch, length, channels = u.shape
    heads = y.shape[1]
    u, w, y, gate_bias = u.contiguous(), w.contiguous(), y.contiguous(), gate_bias.contiguous()
    phi = torch.empty(batch * length, heads, channels // heads, dtype=u.dtype, device=u.device)
    block_n, blocks = _launch(phi, _conv_fwd_block_n(channels // heads))
    if phi.shape[0]:
        with on_device(u):
            conv_gate_fwd_kernel[(blocks, heads)](
                u, w, u if conv_bias is None else conv_bias.contiguous(), y, gate_bias, u if e is None else e.contiguous(), phi,
                batch * length, length, K=w.shape[1], HAS_CONV_BIAS=conv_bias is not None, HAS_BIAS=e is not None, SILU=silu,
                **_meta(heads, channels // heads, block_n), **pdl(u),
            )
    return phi


@_conv_gate_op.register_fake
def _(u, w, conv_bias, y, gate_bias, e, silu):
    return u.new_empty((u.shape[0] * u.shape[1], y.shape[1], u.shape[2] // y.shape[1]))


@kernel_op("srope::conv_head_gate_bwd")
def _conv_gate_bwd_op(
    dphi: torch.Tensor, u: torch.Tensor, w: torch.Tensor, conv_bias: torch.Tensor | None, y: torch.Tensor, gate_bias: torch.Tensor,
    e: torch.Tensor | None, silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(du, dw, dconv_bias, dlogit [N, H], dgate_bias, de)`` (dconv_bias, de empty without them)."""
    batch, length, channels = u.shape
    heads = y.shape[1]
    pairs = channels // heads
    # autograd saved the forward's inputs as given: the kernel reads them packed
    dphi, u, w, y, gate_bias = dphi.contiguous(), u.contiguous(), w.contiguous(), y.contiguous(), gate_bias.contiguous()
    conv_bias = None if conv_bias is None else conv_bias.contiguous()
    e = None if e is None else e.contiguous()
    du = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    count = batch * length
    dc = torch.empty(count, channels, dtype=torch.float32, device=u.device)
    dlogit = torch.empty(count, heads, dtype=u.dtype, device=u.device)
    block_n, blocks = _launch(dlogit, _conv_bwd_block_n(pairs, w.shape[1]))
    partial_w = torch.empty(blocks, channels, w.shape[1], dtype=u.dtype, device=u.device)
    partial_conv_bias = torch.empty(blocks if conv_bias is not None else 0, channels, dtype=u.dtype, device=u.device)
    partial_bias = torch.empty(blocks, heads, dtype=u.dtype, device=u.device)
    partial_e = torch.empty(blocks if e is not None else 0, heads, pairs, dtype=u.dtype, device=u.device)
    if count:
        with on_device(u):
            conv_gate_bwd_kernel[(blocks, heads)](
                dphi, u, w, u if conv_bias is None else conv_bias, y, gate_bias, u if e is None else e, dc, dlogit,
                partial_w, partial_conv_bias, partial_bias, partial_e, count, length, K=w.shape[1],
                HAS_CONV_BIAS=conv_bias is not None, HAS_BIAS=e is not None, SILU=silu, **_meta(heads, pairs, block_n), **pdl(u),
            )
            taps_n, taps_blocks = _launch(dlogit, _conv_fwd_block_n(pairs))
            conv_taps_bwd_kernel[(taps_blocks, heads)](dc, w, du, count, length, H=heads, R=pairs, K=w.shape[1], BN=taps_n,
                                                       BR=next_power_of_2(pairs), **pdl(u))
    dconv_bias = partial_conv_bias.sum(0) if conv_bias is not None else u.new_empty(0)
    return du, partial_w.sum(0), dconv_bias, dlogit, partial_bias.sum(0), partial_e.sum(0) if e is not None else u.new_empty(0)


@_conv_gate_bwd_op.register_fake
def _(dphi, u, w, conv_bias, y, gate_bias, e, silu):
    count, heads = u.shape[0] * u.shape[1], y.shape[1]
    return (torch.empty_like(u), torch.empty_like(w), u.new_empty((u.shape[2] if conv_bias is not None else 0,)),
            u.new_empty((count, heads)), u.new_empty((heads,)), u.new_empty((heads, u.shape[2] // heads) if e is not None else (0,)))


def _conv_gate_setup(ctx, inputs, output):
    u, w, conv_bias, y, gate_bias, e, ctx.silu = inputs
    ctx.has_conv_bias, ctx.has_bias = conv_bias is not None, e is not None
    ctx.save_for_backward(u, w, conv_bias, y, gate_bias, e)


def _conv_gate_backward(ctx, dphi):
    u, w, conv_bias, y, gate_bias, e = ctx.saved_tensors
    du, dw, dconv_bias, dlogit, dgate_bias, de = _conv_gate_bwd_op(
        dphi, u, w, conv_bias if ctx.has_conv_bias else None, y, gate_bias, e if ctx.has_bias else None, ctx.silu
    )
    dy = dlogit[:, None, :].expand(y.shape)
    return du, dw, dconv_bias if ctx.has_conv_bias else None, dy, dgate_bias, de if ctx.has_bias else None, None


_conv_gate_op.register_autograd(_conv_gate_backward, setup_context=_conv_gate_setup)


def conv_head_gate(
    u: torch.Tensor,
    weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    y: torch.Tensor,
    gate_bias: torch.Tensor,
    e: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """:func:`apply_head_gate` of ``c`` = the causal depthwise conv of every row of ``u``
    (no padding, no packed sequences, zeros before each row's first token), fused.

    Args:
        u: ``[B, T, H·R]`` float32, the conv's input.
        weight: ``[H·R, K]`` float32 taps, the current token last (:meth:`ShortConvolution.kernel`).
        conv_bias: ``[H·R]`` float32 or None.
        y, gate_bias, e, activation: as for :func:`apply_head_gate`.

    Returns ``φ [B·T, H, R]``; differentiable in every tensor argument.
    """
    if u.dim() != 3:
        raise ValueError(f"u must be [B, T, H·R], got {list(u.shape)}")
    if y.dim() != 3 or y.shape[1] != y.shape[2] or y.shape[1] < 1 or y.shape[0] != u.shape[0] * u.shape[1]:
        raise ValueError(f"y must be [B·T, H, H] with H >= 1 for u {list(u.shape)}, got {list(y.shape)}")
    heads, channels = y.shape[1], u.shape[2]
    if channels % heads or channels == 0:
        raise ValueError(f"u's last dimension must be H·R with R >= 1 for H = {heads}, got {channels}")
    _check("u", u, tuple(u.shape), u.device)
    if weight.dim() != 2 or weight.shape[0] != channels or weight.shape[1] < 1:
        raise ValueError(f"weight must be [H·R, K] = [{channels}, K] with K >= 1, got {list(weight.shape)}")
    _check("weight", weight, tuple(weight.shape), u.device)
    if conv_bias is not None:
        _check("conv_bias", conv_bias, (channels,), u.device)
    _check("y", y, tuple(y.shape), u.device)
    _check("gate_bias", gate_bias, (heads,), u.device)
    if e is not None:
        _check("e", e, (heads, channels // heads), u.device)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    _check_size(u, y)
    _check_device(u)
    return _conv_gate_op(u, weight, conv_bias, y, gate_bias, e, activation is not None)
