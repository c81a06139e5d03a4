"""Plain-PyTorch recurrences of the token mixers, token by token: the ground truth the
chunked paths (srope.ops.mixers) and fla's kernels are held to, and the theory's checks.

Written to be read; any device and floating dtype, float64 included; no validation.
"""

from __future__ import annotations

import torch


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
