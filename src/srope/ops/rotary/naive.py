"""Plain-PyTorch ground truth of the rotation: cumulative phase, Selective RoPE and RoPE.

Everything here is written to be read, runs on any device and in any floating dtype,
including float64, and is what the tests hold the fast paths to. No validation happens
here: the public functions in :mod:`srope.ops.rotary` check their inputs and call these.

Conventions: tensors are ``[B, T, H, D]``; rotation is GPT-NeoX
half-split, channel ``j`` pairs with ``j + R`` for ``j < R``; channels ``[2R, D)`` pass
through unchanged.
"""

from __future__ import annotations

import math

import torch

from srope.ops.checks import compute_dtype
from srope.ops.layout import sequence_ids

TWO_PI = 2.0 * math.pi


def cumulative_phase(
    phi: torch.Tensor,
    offset: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive cumulative phase ``Φ_t = offset + Σ_{s≤t} φ_s`` in float64.

    ``phi`` is ``[B, T, Hk, R]``; ``offset`` is ``[N, Hk, R]`` (N = B, or the number of
    packed sequences). With ``cu_seqlens`` (B == 1) the sum restarts at every sequence
    start. Accumulating in float64 keeps Φ exact to ~1e-16 relative even at millions of
    tokens, where a float32 running sum would have lost whole radians.

    Returns ``(Φ [B, T, Hk, R], final Φ [N, Hk, R])``, both float64.
    """
    batch, length = phi.shape[:2]
    running = torch.cumsum(phi.to(torch.float64), dim=1)
    if cu_seqlens is None:
        phase = running
        final = running[:, -1] if length > 0 else running.new_zeros(batch, *phi.shape[2:])
        if offset is not None:
            phase = phase + offset.to(torch.float64)[:, None]
            final = final + offset.to(torch.float64)
        return phase, final
    # Packed batch: subtract the running sum at each sequence's start.
    padded = torch.cat([running.new_zeros(1, 1, *phi.shape[2:]), running], dim=1)[0]
    seq = sequence_ids(cu_seqlens, length)
    starts = cu_seqlens.long()
    phase = running[0] - padded[starts[seq]]
    final = padded[starts[1:]] - padded[starts[:-1]]
    if offset is not None:
        phase = phase + offset.to(torch.float64)[seq]
        final = final + offset.to(torch.float64)
    return phase[None], final


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """Reduce an angle modulo 2π (the gradient passes through unchanged)."""
    return torch.remainder(angle, TWO_PI)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the half-split pairs ``(x_j, x_{j+R})`` of ``x [B,T,H,D]`` by the angle
    whose cosine and sine are ``cos, sin [B,T,Hc,R]``.

    ``H`` must be a multiple of ``Hc``; head ``h`` uses angle head ``h // (H // Hc)``.
    Computes in ``cos.dtype`` and returns ``x.dtype``.
    """
    heads, angle_heads, rot = x.shape[2], cos.shape[2], cos.shape[3]
    if heads != angle_heads:
        cos = cos.repeat_interleave(heads // angle_heads, dim=2)
        sin = sin.repeat_interleave(heads // angle_heads, dim=2)
    xc = x.to(cos.dtype)
    x1, x2, rest = xc[..., :rot], xc[..., rot : 2 * rot], xc[..., 2 * rot :]
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)
    return out.to(x.dtype)


def rotate_by_angle(x: torch.Tensor, angle: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rotate ``x`` by ``angle [B,T,Hc,R]`` (any magnitude): reduce modulo 2π in the
    angle's own precision, then take sin/cos in ``dtype``."""
    reduced = wrap_angle(angle).to(dtype)
    return rotate(x, torch.cos(reduced), torch.sin(reduced))


def selective_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    offset: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Selective RoPE: rotate q and k by ``temperature · Φ`` (see :func:`cumulative_phase`).

    ``temperature`` is ``[R]`` or ``[Hk, R]``. Returns ``(q_rot, k_rot, final Φ)``; the
    final phase is float64 and carries gradient like everything else here (the public op
    detaches it).
    """
    dtype = compute_dtype(q.dtype, k.dtype, phi.dtype, temperature.dtype)
    phase, final = cumulative_phase(phi, offset, cu_seqlens)
    angle = temperature.to(torch.float64) * phase
    return rotate_by_angle(q, angle, dtype), rotate_by_angle(k, angle, dtype), final


def rope_inverse_frequencies(rotary_dim: int, theta: float) -> torch.Tensor:
    """Standard RoPE frequencies ``θ^{-2j/rotary_dim}``, ``j < rotary_dim/2``, in float64."""
    return theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-frequency RoPE: rotate by ``positions [B,T] · inv_freq [R]``.

    Angles are formed in float64 (positions are exact integers there) and reduced modulo
    2π before the sin/cos, so large positions lose no accuracy.
    """
    dtype = compute_dtype(q.dtype, k.dtype)
    angle = positions.to(torch.float64)[:, :, None, None] * inv_freq.to(torch.float64)
    return rotate_by_angle(q, angle, dtype), rotate_by_angle(k, angle, dtype)
