"""The generator's per-head phase gate around its short conv, in four small Triton kernels.

With the full-rank ω map and the standard gate (the paper's best configuration), one
projection of x̂ gives ``y [N, H, R + H]``: head h's R angle inputs, then head h's share of
every head's gate logit. Around the conv (fla's, unchanged) the generator computes::

    u[n, h·R + r] = y[n, h, r]                                  (the conv's input)
    s[n, g]       = sigmoid(Σ_h y[n, h, R + g] + gate_bias[g])  (the gate)
    φ[n, h, r]    = (c[n, h·R + r] + e[h, r]) · s[n, h]         (c = conv output, e = exp(bias))

With torch that is a copy of the strided u, a sum over heads, an add, a sigmoid, a
broadcast add and a broadcast multiply, and in the backward the products, two reductions
over r and n, the sigmoid's gradient, an expand and a ``cat`` that rebuilds ``dy``: a dozen
kernels, several of them not vectorised (0.3 ms of the generator's 1.1 ms at 8 × 4096
tokens × 4 heads × 64 pairs on the H200, ``benchmarks/results/profile_layer_h200.json``).
Here :func:`split_head_gate` (``y → u, s``) and :func:`apply_head_gate` (``c, s, e → φ``)
are one kernel each way. The reductions over tokens (the gradients of ``gate_bias`` and
``e``) are per-block partial sums added in a fixed order: deterministic, no atomics.

float32 only (the generator's dtype under autocast); the float64 reference is the torch
route in :meth:`srope.modules.SelectiveRoPE.generator_inputs` / ``phase_increments``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops.triton.ops import interpreting, on_device

BLOCK_N = 64  # tokens per program (the interpreter: 16)


@triton.jit
def split_fwd_kernel(y, gate_bias, u, s, N, H: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr):
    nn = tl.program_id(0) * BN + tl.arange(0, BN)
    rr, gg = tl.arange(0, BR), tl.arange(0, BH)
    mn, mr, mg = nn < N, rr < R, gg < H
    logits = tl.zeros([BN, BH], dtype=tl.float32)
    for h in range(H):
        row = (nn[:, None] * H + h) * (R + H)
        tile = tl.load(y + row + rr[None, :], mask=mn[:, None] & mr[None, :], other=0.0)
        tl.store(u + nn[:, None] * (H * R) + h * R + rr[None, :], tile, mask=mn[:, None] & mr[None, :])
        logits += tl.load(y + row + R + gg[None, :], mask=mn[:, None] & mg[None, :], other=0.0)
    logits += tl.load(gate_bias + gg, mask=mg, other=0.0)[None, :]
    tl.store(s + nn[:, None] * H + gg[None, :], tl.sigmoid(logits), mask=mn[:, None] & mg[None, :])


@triton.jit
def split_bwd_kernel(du, ds, s, dy, partial, N, H: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr):
    """dy from du and the gate logits' gradient ds·s(1-s) (every head's share of a logit
    gets all of it); that gradient summed over the block's tokens into ``partial``."""
    pn = tl.program_id(0)
    nn = pn * BN + tl.arange(0, BN)
    rr, gg = tl.arange(0, BR), tl.arange(0, BH)
    mn, mr, mg = nn < N, rr < R, gg < H
    gates = mn[:, None] & mg[None, :]
    sig = tl.load(s + nn[:, None] * H + gg[None, :], mask=gates, other=0.0)
    dlogit = tl.load(ds + nn[:, None] * H + gg[None, :], mask=gates, other=0.0) * sig * (1.0 - sig)
    for h in range(H):
        row = (nn[:, None] * H + h) * (R + H)
        tile = tl.load(du + nn[:, None] * (H * R) + h * R + rr[None, :], mask=mn[:, None] & mr[None, :], other=0.0)
        tl.store(dy + row + rr[None, :], tile, mask=mn[:, None] & mr[None, :])
        tl.store(dy + row + R + gg[None, :], dlogit, mask=gates)
    tl.store(partial + pn * H + gg, tl.sum(dlogit, axis=0), mask=mg)


@triton.jit
def apply_fwd_kernel(c, s, e, phi, N, H: tl.constexpr, R: tl.constexpr, HAS_BIAS: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
    nn = tl.program_id(0) * BN + tl.arange(0, BN)
    h = tl.program_id(1)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    tile = mn[:, None] & mr[None, :]
    value = tl.load(c + nn[:, None] * (H * R) + h * R + rr[None, :], mask=tile, other=0.0)
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = tl.load(s + nn * H + h, mask=mn, other=0.0)
    tl.store(phi + (nn[:, None] * H + h) * R + rr[None, :], value * gate[:, None], mask=tile)


@triton.jit
def apply_bwd_kernel(dphi, c, s, e, dc, ds, partial, N, H: tl.constexpr, R: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BN: tl.constexpr, BR: tl.constexpr):
    """dc = dφ·s; ds = Σ_r dφ·(c + e); ``partial`` (with a bias): Σ over the block's tokens of dφ·s."""
    pn, h = tl.program_id(0), tl.program_id(1)
    nn = pn * BN + tl.arange(0, BN)
    rr = tl.arange(0, BR)
    mn, mr = nn < N, rr < R
    tile = mn[:, None] & mr[None, :]
    grad = tl.load(dphi + (nn[:, None] * H + h) * R + rr[None, :], mask=tile, other=0.0)
    value = tl.load(c + nn[:, None] * (H * R) + h * R + rr[None, :], mask=tile, other=0.0)
    if HAS_BIAS:
        value += tl.load(e + h * R + rr, mask=mr, other=0.0)[None, :]
    gate = tl.load(s + nn * H + h, mask=mn, other=0.0)
    scaled = grad * gate[:, None]
    tl.store(dc + nn[:, None] * (H * R) + h * R + rr[None, :], scaled, mask=tile)
    tl.store(ds + nn * H + h, tl.sum(grad * value, axis=1), mask=mn)
    if HAS_BIAS:
        tl.store(partial + (pn * H + h) * R + rr, tl.sum(scaled, axis=0), mask=mr)


def _launch(x: torch.Tensor):
    block_n = 16 if interpreting() else BLOCK_N
    return block_n, triton.cdiv(x.shape[0], block_n)


def _meta(heads: int, pairs: int, block_n: int) -> dict:
    return dict(H=heads, R=pairs, BN=block_n, BR=triton.next_power_of_2(pairs))


@torch.library.custom_op("srope::head_gate_split", mutates_args=())
def _split_op(y: torch.Tensor, gate_bias: torch.Tensor, pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    count, heads = y.shape[:2]
    y, gate_bias = y.contiguous(), gate_bias.contiguous()
    u = torch.empty(count, heads * pairs, dtype=y.dtype, device=y.device)
    s = torch.empty(count, heads, dtype=y.dtype, device=y.device)
    block_n, blocks = _launch(y)
    if count:
        with on_device(y):
            split_fwd_kernel[(blocks,)](y, gate_bias, u, s, count, BH=triton.next_power_of_2(heads), **_meta(heads, pairs, block_n))
    return u, s


@_split_op.register_fake
def _(y, gate_bias, pairs):
    return y.new_empty((y.shape[0], y.shape[1] * pairs)), y.new_empty((y.shape[0], y.shape[1]))


@torch.library.custom_op("srope::head_gate_split_bwd", mutates_args=())
def _split_bwd_op(du: torch.Tensor, ds: torch.Tensor, s: torch.Tensor, pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    count, heads = s.shape
    du, ds = du.contiguous(), ds.contiguous()
    dy = torch.empty(count, heads, pairs + heads, dtype=s.dtype, device=s.device)
    block_n, blocks = _launch(s)
    partial = torch.empty(blocks, heads, dtype=s.dtype, device=s.device)
    if count:
        with on_device(s):
            split_bwd_kernel[(blocks,)](du, ds, s, dy, partial, count, BH=triton.next_power_of_2(heads), **_meta(heads, pairs, block_n))
    return dy, partial.sum(0)


@_split_bwd_op.register_fake
def _(du, ds, s, pairs):
    return s.new_empty((s.shape[0], s.shape[1], pairs + s.shape[1])), s.new_empty((s.shape[1],))


def _split_setup(ctx, inputs, output):
    ctx.pairs = inputs[2]
    ctx.save_for_backward(output[1])


def _split_backward(ctx, du, ds):
    (s,) = ctx.saved_tensors
    count, heads = s.shape
    du = s.new_zeros(count, heads * ctx.pairs) if du is None else du
    ds = torch.zeros_like(s) if ds is None else ds
    dy, dgate_bias = _split_bwd_op(du, ds, s, ctx.pairs)
    return dy, dgate_bias, None


_split_op.register_autograd(_split_backward, setup_context=_split_setup)


@torch.library.custom_op("srope::head_gate_apply", mutates_args=())
def _apply_op(c: torch.Tensor, s: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
    count, heads = s.shape
    pairs = c.shape[1] // heads
    c, s = c.contiguous(), s.contiguous()
    phi = torch.empty(count, heads, pairs, dtype=c.dtype, device=c.device)
    block_n, blocks = _launch(c)
    if count:
        with on_device(c):
            apply_fwd_kernel[(blocks, heads)](c, s, c if e is None else e.contiguous(), phi, count, HAS_BIAS=e is not None,
                                              **_meta(heads, pairs, block_n))
    return phi


@_apply_op.register_fake
def _(c, s, e):
    return c.new_empty((s.shape[0], s.shape[1], c.shape[1] // s.shape[1]))


@torch.library.custom_op("srope::head_gate_apply_bwd", mutates_args=())
def _apply_bwd_op(dphi: torch.Tensor, c: torch.Tensor, s: torch.Tensor, e: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    count, heads = s.shape
    pairs = c.shape[1] // heads
    dphi = dphi.contiguous()
    dc, ds = torch.empty_like(c), torch.empty_like(s)
    block_n, blocks = _launch(c)
    partial = torch.empty(blocks if e is not None else 0, heads, pairs, dtype=c.dtype, device=c.device)
    if count:
        with on_device(c):
            apply_bwd_kernel[(blocks, heads)](dphi, c, s, c if e is None else e, dc, ds, partial, count, HAS_BIAS=e is not None,
                                              **_meta(heads, pairs, block_n))
    return dc, ds, partial.sum(0)


@_apply_bwd_op.register_fake
def _(dphi, c, s, e):
    heads = s.shape[1]
    return torch.empty_like(c), torch.empty_like(s), c.new_empty((heads, c.shape[1] // heads))


def _apply_setup(ctx, inputs, output):
    c, s, e = inputs
    ctx.has_bias = e is not None
    ctx.save_for_backward(c, s, e)


def _apply_backward(ctx, dphi):
    c, s, e = ctx.saved_tensors
    dc, ds, de = _apply_bwd_op(dphi, c, s, e if ctx.has_bias else None)
    return dc, ds, de if ctx.has_bias else None


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


def split_head_gate(y: torch.Tensor, gate_bias: torch.Tensor, pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv's input and the per-head gate from the generator's projection.

    Args:
        y: ``[N, H, R + H]`` float32: per head chunk, its R angle inputs, then its share of
            every head's gate logit.
        gate_bias: ``[H]`` float32.
        pairs: R.

    Returns ``u [N, H·R]`` (``u[n, h·R + r] = y[n, h, r]``) and ``s [N, H] = sigmoid(Σ_h
    y[n, h, R:] + gate_bias)``; differentiable in y and gate_bias.
    """
    if y.dim() != 3 or not isinstance(pairs, int) or pairs < 1 or y.shape[2] != pairs + y.shape[1]:
        raise ValueError(f"y must be [N, H, pairs + H] with pairs >= 1, got {list(y.shape)} and pairs={pairs!r}")
    _check("y", y, tuple(y.shape), y.device)
    _check("gate_bias", gate_bias, (y.shape[1],), y.device)
    _check_device(y)
    return _split_op(y, gate_bias, pairs)


def apply_head_gate(c: torch.Tensor, s: torch.Tensor, e: torch.Tensor | None = None) -> torch.Tensor:
    """``φ[n, h, r] = (c[n, h·R + r] + e[h, r]) · s[n, h]`` (without e: ``c · s``).

    Args:
        c: ``[N, H·R]`` float32, the conv's output.
        s: ``[N, H]`` float32, the gate.
        e: ``[H, R]`` float32 or None, the exponentiated bias.

    Returns ``φ [N, H, R]``; differentiable in c, s and e.
    """
    if s.dim() != 2 or c.dim() != 2 or c.shape[0] != s.shape[0] or c.shape[1] % max(s.shape[1], 1) or s.shape[1] < 1:
        raise ValueError(f"c must be [N, H·R] and s [N, H], got {list(c.shape)} and {list(s.shape)}")
    heads = s.shape[1]
    _check("c", c, tuple(c.shape), c.device)
    _check("s", s, tuple(s.shape), c.device)
    if e is not None:
        _check("e", e, (heads, c.shape[1] // heads), c.device)
    _check_device(c)
    return _apply_op(c, s, e)
