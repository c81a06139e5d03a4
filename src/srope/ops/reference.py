"""Plain-PyTorch ground truth for every op in srope.

Everything here is written to be read, runs on any device and in any floating dtype,
including float64, and is what the tests hold the fast paths to. No validation happens
here: the public functions in :mod:`srope.ops.rotary` check their inputs and call these.

Conventions (see the guide): tensors are ``[B, T, H, D]``; rotation is GPT-NeoX
half-split, channel ``j`` pairs with ``j + R`` for ``j < R``; channels ``[2R, D)`` pass
through unchanged.
"""

from __future__ import annotations

import math

import torch

TWO_PI = 2.0 * math.pi


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """max(float32, inputs): bf16/fp16 compute in float32, float64 stays float64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def sequence_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """Index of the packed sequence each of ``length`` tokens belongs to."""
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:], positions, right=True)


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


def gated_linear_attention_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated linear attention (GLA's recurrence, fla's state layout).

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ``, ``o_t = scale · S_tᵀ q_t`` with ``q, k, g
    [B,T,H,K]``, ``v [B,T,H,V]`` and the state ``[B,H,K,V]``. ``log_decay=None`` is plain
    linear attention. Returns ``(o [B,T,H,V], final state)``.
    """
    batch, length, heads, key_dim = q.shape
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1]) if initial_state is None else initial_state
    outputs = []
    for t in range(length):
        if log_decay is not None:
            state = state * torch.exp(log_decay[:, t])[..., None]
        state = state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state


def complex_rotation_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    theta: torch.Tensor,
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """The complex diagonal recurrence that Selective RoPE realises with the RoPE trick.

    ``S_t = S_{t-1} · diag(λ_t e^{iθ_t}) + v_t k̃_tᴴ``, ``o_t = Re(S_t q̃_t)``, where
    ``q̃ = q[..., :R] + i·q[..., R:2R]`` (likewise k̃) with ``2R = D``, ``theta [B,T,H,R]``
    are the per-step angles (temperature · φ) and ``decay [B,T,H,R]`` the per-pair decay
    λ_t ∈ (0, 1] (None: no decay). Returns ``o [B,T,H,V]``.
    """
    rot = theta.shape[-1]
    q_c = torch.complex(q[..., :rot], q[..., rot : 2 * rot])
    k_c = torch.complex(k[..., :rot], k[..., rot : 2 * rot])
    transition = torch.polar(torch.ones_like(theta) if decay is None else decay, theta)
    batch, length, heads = q.shape[:3]
    state = torch.zeros(batch, heads, v.shape[-1], rot, dtype=q_c.dtype, device=q.device)
    outputs = []
    for t in range(length):
        state = state * transition[:, t, :, None, :]
        state = state + v[:, t, :, :, None].to(q_c.dtype) * k_c[:, t, :, None, :].conj()
        outputs.append(torch.einsum("bhvr,bhr->bhv", state, q_c[:, t]).real)
    return torch.stack(outputs, dim=1)


def gated_delta_rule_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule (Gated DeltaNet; DeltaNet when ``log_decay`` is None).

    ``S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ``, ``o_t = scale · S_tᵀ q_t``
    with ``q, k [B,T,H,K]``, ``v [B,T,H,V]``, ``beta, log_decay [B,T,H]`` and the state
    ``[B,H,K,V]``, written literally with the transition matrix. Returns ``(o, final state)``.
    """
    batch, length, heads, key_dim = q.shape
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1]) if initial_state is None else initial_state
    eye = torch.eye(key_dim, dtype=q.dtype, device=q.device)
    outputs = []
    for t in range(length):
        k_t, b_t = k[:, t], beta[:, t, :, None, None]
        transition = eye - b_t * k_t[..., :, None] * k_t[..., None, :]  # [B, H, K, K]
        if log_decay is not None:
            transition = torch.exp(log_decay[:, t])[..., None, None] * transition
        state = transition @ state + b_t * k_t[..., :, None] * v[:, t, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state


def causal_attention_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_forget: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Causal softmax attention, one query at a time (forgetting attention with gates).

    ``q [B,Tq,H,D]``, ``k [B,Tk,Hk,D]``, ``v [B,Tk,Hk,Dv]``, query head h reads key head
    ``h // (H // Hk)``; query i sits at position ``p = Tk − Tq + i`` and reads keys
    ``j <= p`` with ``logit_j = scale · q·k_j + Σ_{κ=j+1}^{p} log_forget[κ, h]``
    (``log_forget [B,Tk,H]``; each sum formed explicitly). Returns ``[B,Tq,H,Dv]``.
    """
    batch, q_len, heads, _ = q.shape
    key_len, group = k.shape[1], heads // k.shape[2]
    out = q.new_zeros(batch, q_len, heads, v.shape[-1])
    for i in range(q_len):
        p = key_len - q_len + i
        for h in range(heads):
            logits = scale * torch.einsum("bd,bjd->bj", q[:, i, h], k[:, : p + 1, h // group])
            if log_forget is not None:
                bias = torch.stack([log_forget[:, j + 1 : p + 1, h].sum(dim=1) for j in range(p + 1)], dim=1)
                logits = logits + bias
            weights = torch.softmax(logits, dim=-1)
            out[:, i, h] = torch.einsum("bj,bjv->bv", weights, v[:, : p + 1, h // group])
    return out
