"""The generator's first-layer weights, weight-normed and joined, as one Triton kernel each way.

Before its projection, the generator forms one per-head weight ``[H, I, R + G]`` from its
parameters (:meth:`srope.modules.SelectiveRoPE._first_layers`): the ω map's columns, each
scaled to norm ``gain[h]`` (``ŵ = gain · w / ‖w‖``, the norm over a column's I inputs), then
head h's share of the gate's first layer (the ``[G, H·I]`` Linear weight, columns
``h·I … h·I + I - 1``, transposed). With torch that is a norm, a multiply, a divide and a
concatenation, and in the backward about a dozen small kernels more (the divide's and the
norm's gradients, sums for the gain, slices of the concatenation); the weights are small
(65k numbers at GLA-370M), so every one of those kernels is a launch and little else, in a
CUDA graph and in eager mode, where each also costs the host an operator call.

Here the forward is one kernel: per head, one program sums each column's squares and
writes the scaled columns, one copies the gate's share. The backward is one kernel::

    s = Σ_i dŵ[i] · w[i]        (per column)
    dw = (gain / ‖w‖) · (dŵ - w · s / ‖w‖²),     dgain[h] = Σ_columns s / ‖w‖

and the gate's gradient is written straight into the Linear weight's ``[G, H·I]`` layout.
float32 only (the generator's dtype under autocast); the reference is the torch route in
:meth:`srope.modules.SelectiveRoPE.projection_weight`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from srope.ops._triton import await_predecessor, interpreting, kernel_op, next_power_of_2, on_device, pdl

TILE = 2048  # inputs x columns (padded) per step of a column program
INTERPRET_TILE = 256  # under TRITON_INTERPRET=1: several steps over I even at test sizes


@triton.jit
def _column_sums(w, dout, h, I, R, width, rr, mr, BI: tl.constexpr, BR: tl.constexpr, DOTS: tl.constexpr):
    """Per column of head h's ω weight: ``Σ_i w²`` (1 for padded columns: no 0/0 after) and,
    with DOTS, ``Σ_i dout · w``."""
    squares = tl.zeros([BR], dtype=tl.float32)
    dots = tl.zeros([BR], dtype=tl.float32)
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        m = (ii < I)[:, None] & mr[None, :]
        col = tl.load(w + (h * I + ii[:, None]) * R + rr[None, :], mask=m, other=0.0)
        squares += tl.sum(col * col, axis=0)
        if DOTS:
            dots += tl.sum(tl.load(dout + (h * I + ii[:, None]) * width + rr[None, :], mask=m, other=0.0) * col, axis=0)
    return tl.where(mr, squares, 1.0), dots


@triton.jit
def _gate_shares(linear, joined, h, I, R, G, width, gate_row, BI: tl.constexpr, BG: tl.constexpr, TO_JOINED: tl.constexpr):
    """Head h's share of the gate's weight between its Linear layout (``linear [G, H·I]``) and
    the joined weight's last G columns (``joined [H, I, R + G]``), in the direction TO_JOINED."""
    gg = tl.arange(0, BG)
    mg = gg < G
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        m = (ii < I)[:, None] & mg[None, :]
        at_linear = gg[None, :] * gate_row + h * I + ii[:, None]
        at_joined = (h * I + ii[:, None]) * width + R + gg[None, :]
        if TO_JOINED:
            tl.store(joined + at_joined, tl.load(linear + at_linear, mask=m, other=0.0), mask=m)
        else:
            tl.store(linear + at_linear, tl.load(joined + at_joined, mask=m, other=0.0), mask=m)


@triton.jit
def _scaled_columns(w, dout, dst, h, I, R, width, dst_row, rr, mr, scale, coef, BI: tl.constexpr, GRAD: tl.constexpr):
    """Head h's ω columns written to ``dst`` (rows ``dst_row`` apart): ``scale · w`` or, with
    GRAD, ``scale · (dout - coef · w)`` (dout's rows ``width`` apart)."""
    for start in range(0, I, BI):
        ii = start + tl.arange(0, BI)
        m = (ii < I)[:, None] & mr[None, :]
        col = tl.load(w + (h * I + ii[:, None]) * R + rr[None, :], mask=m, other=0.0)
        if GRAD:
            col = tl.load(dout + (h * I + ii[:, None]) * width + rr[None, :], mask=m, other=0.0) - col * coef[None, :]
        tl.store(dst + (h * I + ii[:, None]) * dst_row + rr[None, :], col * scale[None, :], mask=m)


@triton.jit
def weights_fwd_kernel(w, gain, gate, out, I, R, G, gate_row, BI: tl.constexpr, BR: tl.constexpr, BG: tl.constexpr,
                       HAS_GATE: tl.constexpr, PDL: tl.constexpr = False):
    """Program (head, part): part 0 writes ``out[h, :, :R] = gain[h] · w[h] / ‖w[h]‖`` (column
    norms), part 1 ``out[h, i, R + g] = gate[g, h·I + i]`` (``gate_row`` = H·I)."""
    await_predecessor(PDL)
    h, part = tl.program_id(0), tl.program_id(1)
    width = R + G
    if part == 0:
        rr = tl.arange(0, BR)
        mr = rr < R
        squares, _ = _column_sums(w, w, h, I, R, width, rr, mr, BI, BR, False)
        scale = tl.load(gain + h) / tl.sqrt_rn(squares)
        _scaled_columns(w, w, out, h, I, R, width, width, rr, mr, scale, scale, BI, False)
    elif HAS_GATE:
        _gate_shares(gate, out, h, I, R, G, width, gate_row, BI, BG, True)


@triton.jit
def weights_bwd_kernel(dout, w, gain, dw, dgain, dgate, I, R, G, gate_row, BI: tl.constexpr, BR: tl.constexpr,
                       BG: tl.constexpr, HAS_GATE: tl.constexpr, PDL: tl.constexpr = False):
    """Program (head, part): part 0 writes dw[h] and dgain[h] (module docstring), part 1 the
    gate's share ``dgate[g, h·I + i] = dout[h, i, R + g]``."""
    await_predecessor(PDL)
    h, part = tl.program_id(0), tl.program_id(1)
    width = R + G
    if part == 0:
        rr = tl.arange(0, BR)
        mr = rr < R
        squares, dots = _column_sums(w, dout, h, I, R, width, rr, mr, BI, BR, True)
        norm = tl.sqrt_rn(squares)
        tl.store(dgain + h, tl.sum(dots / norm, axis=0))
        scale = tl.load(gain + h) / norm
        coef = dots / squares
        _scaled_columns(w, dout, dw, h, I, R, width, R, rr, mr, scale, coef, BI, True)
    elif HAS_GATE:
        _gate_shares(dgate, dout, h, I, R, G, width, gate_row, BI, BG, False)


def _meta(pairs: int, gates: int) -> dict:
    block_r = next_power_of_2(pairs)
    tile = INTERPRET_TILE if interpreting() else TILE
    return dict(BI=max(1, tile // block_r), BR=block_r, BG=next_power_of_2(max(gates, 1)), HAS_GATE=gates > 0)


@kernel_op("srope::head_weights")
def _weights_op(w: torch.Tensor, gain: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    heads, inputs, pairs = w.shape
    gates = 0 if gate is None else gate.shape[0]
    w, gain = w.contiguous(), gain.contiguous()
    gate = None if gate is None else gate.contiguous()
    out = torch.empty(heads, inputs, pairs + gates, dtype=w.dtype, device=w.device)
    if out.numel():
        with on_device(w):
            weights_fwd_kernel[(heads, 2 if gates else 1)](w, gain, w if gate is None else gate, out, inputs, pairs, gates,
                                                           heads * inputs, **_meta(pairs, gates), **pdl(w))
    return out


@_weights_op.register_fake
def _(w, gain, gate):
    return w.new_empty((w.shape[0], w.shape[1], w.shape[2] + (0 if gate is None else gate.shape[0])))


@kernel_op("srope::head_weights_bwd")
def _weights_bwd_op(dout: torch.Tensor, w: torch.Tensor, gain: torch.Tensor, gates: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(dw, dgain, dgate [G, H·I])``, dgate empty without a gate."""
    heads, inputs, pairs = w.shape
    dout, w, gain = dout.contiguous(), w.contiguous(), gain.contiguous()
    dw, dgain = torch.empty_like(w), torch.empty_like(gain)
    dgate = torch.empty(gates, heads * inputs, dtype=w.dtype, device=w.device)
    if w.numel():
        with on_device(w):
            weights_bwd_kernel[(heads, 2 if gates else 1)](dout, w, gain, dw, dgain, dgate, inputs, pairs, gates, heads * inputs,
                                                           **_meta(pairs, gates), **pdl(w))
    return dw, dgain, dgate


@_weights_bwd_op.register_fake
def _(dout, w, gain, gates):
    return torch.empty_like(w), torch.empty_like(gain), w.new_empty((gates, w.shape[0] * w.shape[1]))


def _setup(ctx, inputs, output):
    w, gain, gate = inputs
    ctx.gates = 0 if gate is None else gate.shape[0]
    ctx.save_for_backward(w, gain)


def _backward(ctx, dout):
    w, gain = ctx.saved_tensors
    dw, dgain, dgate = _weights_bwd_op(dout, w, gain, ctx.gates)
    return dw, dgain, dgate if ctx.gates else None


_weights_op.register_autograd(_backward, setup_context=_setup)


def head_weights(w: torch.Tensor, gain: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    """``[H, I, R + G]``: ``gain[h] · w[h, :, r] / ‖w[h, :, r]‖`` in the first R columns, then
    head h's share of ``gate`` (``out[h, i, R + g] = gate[g, h·I + i]``).

    Args:
        w: ``[H, I, R]`` float32, the ω map's per-head weight (``SelectiveRoPE.proj_weight``).
        gain: ``[H]`` float32, each head's column norm (``SelectiveRoPE.proj_gain``).
        gate: ``[G, H·I]`` float32, the weight of the gate's first Linear, or None.

    Differentiable in every tensor. A zero column gives non-finite values, as ``w / ‖w‖``
    does with torch.
    """
    for name, tensor in (("w", w), ("gain", gain), ("gate", gate)):
        if tensor is not None and tensor.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {tensor.dtype}")
        if tensor is not None and tensor.device != w.device:
            raise ValueError(f"{name} is on {tensor.device}, expected {w.device} like w")
    if w.dim() != 3 or w.shape[2] < 1:
        raise ValueError(f"w must be [H, I, R] with R >= 1, got {list(w.shape)}")
    heads, inputs = w.shape[:2]
    if tuple(gain.shape) != (heads,):
        raise ValueError(f"gain must be [H] = [{heads}], got {list(gain.shape)}")
    if gate is not None and (gate.dim() != 2 or gate.shape[1] != heads * inputs or gate.shape[0] < 1):
        raise ValueError(f"gate must be [G, H·I] = [G, {heads * inputs}] with G >= 1, got {list(gate.shape)}")
    if w.device.type != "cuda" and not interpreting():
        raise ValueError(f"the fused head weights need CUDA tensors, or TRITON_INTERPRET=1; got {w.device}")
    return _weights_op(w, gain, gate)
