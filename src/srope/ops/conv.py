"""Depthwise causal short convolution with a carried state.

Two paths compute the same thing: :func:`causal_conv` in plain PyTorch (any device), and
on CUDA flash-linear-attention's Triton ``causal_conv1d`` (fused activation, packed
sequences, deterministic weight gradients; several times faster than the ``conv1d`` route
on the H200, as benchmarks/profile_layer.py measures). :func:`short_conv` picks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from srope import backend as srope_backend
from srope.ops.layout import RowLayout

ACTIVATIONS = {None: None, "silu": F.silu, "swish": F.silu}
# Below this many tokens per call (decoding, short chunks) "auto" keeps the PyTorch route:
# there fla's launch and chunk bookkeeping cost more than the conv itself.
FLA_MIN_TOKENS = 64
CONV_BACKENDS = ("auto", "torch", "fla")


def causal_conv(
    rows: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution over time.

    ``y_t = Σ_w weight[:, w] · x_{t - (W-1) + w}`` with the ``W-1`` inputs before the first
    token taken from ``state [N, C, W-1]`` (zeros when None).

    Args:
        rows: ``[N, L, C]`` inputs, each row's real tokens first (see ``RowLayout``).
        weight: ``[C, W]``.
        lengths: ``[N]`` real tokens per row (None: all L); the final state holds the
            last ``W-1`` real inputs of each row (reaching into ``state`` when shorter).

    Returns ``(y [N, L, C], final_state [N, C, W-1])``.
    """
    count, length, channels = rows.shape
    width = weight.shape[-1]
    taps = weight.to(device=rows.device, dtype=rows.dtype)
    # Time-major shifted sums rather than conv1d on [N, C, L]: the same numbers, and inductor
    # (torch 2.11-2.13, CPU) compiled the transposed conv1d route's gradients wrong in packed
    # two-layer models (tests/models/test_compile.py runs them under inductor).
    if state is None:
        history = F.pad(rows, (0, 0, width - 1, 0))  # [N, W-1+L, C]
    else:
        history = torch.cat([state.to(rows.dtype).transpose(1, 2), rows], dim=1)
    out = history[:, width - 1 :] * taps[:, width - 1]
    for j in range(width - 1):
        out = out + history[:, j : j + length] * taps[:, j]
    if bias is not None:
        out = out + bias.to(rows.dtype)
    if lengths is None:
        final = history[:, history.shape[1] - (width - 1) :]
    else:
        take = lengths.view(count, 1, 1).to(torch.long) + torch.arange(width - 1, device=rows.device).view(1, -1, 1)
        final = history.gather(1, take.expand(count, width - 1, channels))
    return out, final.transpose(1, 2)


def last_inputs(x: torch.Tensor, layout: RowLayout, width: int, state: torch.Tensor | None) -> torch.Tensor:
    """The last ``width - 1`` real inputs of every row, ``[N, C, W-1]``, reaching into
    ``state`` (zeros when None) for rows shorter than that: the conv's final state."""
    count, channels = len(layout.lengths), x.shape[-1]
    if width == 1:
        return x.new_zeros(count, channels, 0)
    lengths = layout.lengths.to(x.device)
    steps = lengths[:, None] - (width - 1) + torch.arange(width - 1, device=x.device)  # [N, W-1]
    from_rows = layout.take(x, steps.clamp(min=0)).transpose(1, 2)  # [N, C, W-1]
    if state is None:
        return torch.where(steps[:, None, :] >= 0, from_rows, 0)
    prior = state.to(x.dtype).gather(2, (steps + width - 1).clamp(0, width - 2)[:, None, :].expand(count, channels, width - 1))
    return torch.where(steps[:, None, :] >= 0, from_rows, prior)


def fla_conv_problem(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> str | None:
    """Why fla's Triton conv cannot take this call (None: it can)."""
    if not x.is_cuda:
        return f"fla's conv needs CUDA tensors, got {x.device}"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"fla's conv takes float16/bfloat16/float32, got {x.dtype}"
    if x.shape[1] == 0:
        return "no tokens"
    if state is not None and state.requires_grad:
        return "a state that needs its gradient"
    return None


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    layout: RowLayout,
    state: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    backend: str = "auto",
    want_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The short conv of ``x [B, T, C]`` laid out by ``layout`` (padding invisible, packed
    sequences restarting), then ``activation``; returns ``(y [B, T, C], final_state [N, C, W-1])``,
    the state None without ``want_state`` (a training step: its gather is a handful of small
    launches per conv that nothing reads).

    ``backend``: ``"torch"`` (:func:`causal_conv`), ``"fla"`` (fla's Triton kernel; CUDA
    only) or ``"auto"`` (fla where it can run and is installed, for calls of at least
    :data:`FLA_MIN_TOKENS` tokens; PyTorch under ``srope.backend.use("torch")``)."""
    from srope.ops.mixers._common import fla_ops

    if backend not in CONV_BACKENDS:
        raise ValueError(f"backend must be one of {CONV_BACKENDS}, got {backend!r}")
    backend = srope_backend.fla_backend(backend)
    width = weight.shape[-1]
    problem = fla_conv_problem(x, weight, state)
    wanted = backend == "fla" or backend == "auto" and x.shape[1] >= FLA_MIN_TOKENS
    ops = fla_ops() if wanted and problem is None else None
    if backend == "fla" and ops is None:
        raise ValueError(f"backend='fla' cannot run this conv: {problem or 'flash-linear-attention is not importable'}")
    if ops is None:
        rows = layout.to_rows(x)
        out, final = causal_conv(rows, weight, state, None if layout.identity else layout.lengths, bias)
        act = ACTIVATIONS[activation]
        return layout.from_rows(out if act is None else act(out)), final if want_state else None
    # fla's state is [N, C, W]: the last W-1 inputs in slots 1..W-1 (slot 0 is not read).
    initial = None if state is None else F.pad(state.to(x.dtype), (1, 0)).contiguous()
    kernel = weight.to(device=x.device).contiguous()
    fla_bias = None if bias is None else bias.contiguous()
    if layout.index is not None:  # packed: fla restarts at every cu_seqlens boundary itself
        out = ops.causal_conv1d(x.contiguous(), kernel, fla_bias, initial_state=initial, activation=activation,
                                cu_seqlens=layout.cu_seqlens)[0]
    else:
        rows = layout.to_rows(x)  # padded rows: real tokens first, the rest after them (never read)
        out = layout.from_rows(ops.causal_conv1d(rows.contiguous(), kernel, fla_bias, initial_state=initial, activation=activation)[0])
    return out, last_inputs(x, layout, width, state) if want_state else None
