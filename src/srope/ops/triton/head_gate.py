"""The generator's per-head phase gate after its short conv, as one Triton kernel each way.

With the full-rank ω map and the standard gate (the paper's best configuration), one
projection of x̂ gives, per token n, ``u [N, H·R]`` (head h's R angle inputs, the conv's
input) and ``y [N, H, H]`` (head h's share of every head's gate logit: a map of x is the sum
of its per-head shares), as two tensors (:func:`srope.ops.projection.normalized_head_projection`
with ``split``). After the conv (fla's, unchanged) the generator computes::

    s[n, g] = sigmoid(Σ_h y[n, h, g] + gate_bias[g])         (the gate)
    φ[n, h, r] = (act(c[n, h·R + r]) + e[h, r]) · s[n, h]   (c = conv output, e = exp(bias))

The conv's activation (SiLU or none) is applied here, not by fla's conv: fla's backward of
a conv with its fused activation first recomputes the conv's forward (for the
pre-activation), while this kernel reads c anyway (one conv forward, 0.018 ms, less per
step at the GLA-370M layer on the H200).

With torch that is a sum over heads, an add, a sigmoid, a broadcast add and a broadcast
multiply, and in the backward the products, two reductions over r and n, the sigmoid's
gradient and an expand: a dozen kernels, several of them not vectorised (0.3 ms of the
generator's 1.1 ms at 8 × 4096 tokens × 4 heads × 64 pairs on the H200,
``benchmarks/results/profile_layer_h200.json``). Here :func:`apply_head_gate` is one kernel
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

from srope.ops.triton.kernels import await_predecessor
from srope.ops.triton.ops import interpreting, on_device, pdl

BLOCK_N = 64  # tokens per program (the interpreter: 16)
ACTIVATIONS = (None, "silu", "swish")  # the conv's (srope.ops.conv.ACTIVATIONS)


@triton.jit
def _gate(y, gate_bias, nn, mn, h, H: tl.constexpr, BH: tl.constexpr):
    """``s[n, h] = sigmoid(Σ_j y[n, j, h] + gate_bias[h])`` for the block's tokens ``nn``."""
    jj = tl.arange(0, BH)
    shares = tl.load(y + (nn[:, None] * H + jj[None, :]) * H + h, mask=mn[:, None] & (jj < H)[None, :], other=0.0)
    return tl.sigmoid(tl.sum(shares, axis=1) + tl.load(gate_bias + h))


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
    slope = 1.0
    if SILU:
        sig = tl.sigmoid(value)
        slope = sig * (1.0 + value * (1.0 - sig))
        value = value * sig
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = _gate(y, gate_bias, nn, mn, h, H, BH)
    scaled = grad * gate[:, None]
    tl.store(dc + nn[:, None] * (H * R) + h * R + rr[None, :], scaled * slope, mask=tile)
    logit_grad = tl.where(mn, tl.sum(grad * value, axis=1) * gate * (1.0 - gate), 0.0)
    tl.store(dlogit + nn * H + h, logit_grad, mask=mn)
    tl.store(partial_bias + pn * H + h, tl.sum(logit_grad, axis=0))
    if HAS_BIAS:
        tl.store(partial_e + (pn * H + h) * R + rr, tl.sum(scaled, axis=0), mask=mr)


def _launch(x: torch.Tensor):
    block_n = 16 if interpreting() else BLOCK_N
    return block_n, triton.cdiv(x.shape[0], block_n)


def _meta(heads: int, pairs: int, block_n: int) -> dict:
    return dict(H=heads, R=pairs, BN=block_n, BR=triton.next_power_of_2(pairs), BH=triton.next_power_of_2(heads))


@torch.library.custom_op("srope::head_gate_apply", mutates_args=())
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


@torch.library.custom_op("srope::head_gate_apply_bwd", mutates_args=())
def _apply_bwd_op(
    dphi: torch.Tensor, c: torch.Tensor, y: torch.Tensor, gate_bias: torch.Tensor, e: torch.Tensor | None, silu: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(dc, dlogit [N, H], dgate_bias, de)`` (de empty without a bias)."""
    count, heads = y.shape[:2]
    pairs = c.shape[1] // heads
    dphi = dphi.contiguous()
    dc = torch.empty_like(c)
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
    _check_device(c)
    return _apply_op(c, y, gate_bias, e, activation is not None)
