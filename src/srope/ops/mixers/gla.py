"""Gated linear attention (GLA): fla's ``chunk_gla`` / ``fused_recurrent_gla`` on CUDA, a
chunked PyTorch form everywhere else.

Recurrence (fla's state layout ``[K, V]``)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t

Chunked form, chunk of C steps starting from the state S_0, with ``G_t = Σ_{s<=t} g_s`` the
log-decay summed inside the chunk::

    o_t   = scale · [ (q_t ⊙ e^{G_t})ᵀ S_0 + Σ_{s<=t} (Σ_i q_ti k_si e^{G_ti − G_si}) v_s ]
    S_C   = diag(e^{G_C}) S_0 + Σ_s (k_s ⊙ e^{G_C − G_s}) v_sᵀ

The intra-chunk scores are formed as one matrix product of ``q_t ⊙ e^{G_t − G_1}`` and
``k_s ⊙ e^{G_1 − G_s}`` (fla's factorisation). Each product term is then exact to a few
roundings, but the two factors overflow / underflow when the log-decay falls by more than
:data:`MAX_FACTORED_SPREAD` inside one chunk; such inputs take the pairwise form
``Σ_i q_ti k_si e^{G_ti − G_si}`` (``[C, C, K]`` per chunk, every exponent <= 0), which is
exact whatever the gate but several times slower.
"""

from __future__ import annotations

import torch

from srope.ops.checks import compute_dtype
from srope.ops.layout import RowLayout
from srope.ops.mixers import _common as common

CHUNK_SIZE = 16
# Largest fall of the summed log-decay inside a chunk for the factored scores, per compute
# dtype: e^{±spread} must stay well inside the dtype's range (float32: e^±88).
MAX_FACTORED_SPREAD = {torch.float32: 60.0, torch.float64: 600.0}


def _gla_chunked(q, k, v, g, scale, state, chunk_size):
    """GLA on dense rows ``[B, T, H, *]`` in one dtype; returns ``(o, final_state)``."""
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    chunk_size = min(chunk_size, length)  # short inputs (decoding) need no padding
    q, k, v, g = (common.to_chunks(x, chunk_size) for x in (q, k, v, g))  # [B, H, NC, C, *]
    cum = g.cumsum(dim=3)
    out = _intra_chunk_scores(q, k, cum) @ v
    # What each chunk adds to the state, and how much of the state it keeps.
    last = cum[..., -1:, :]
    added = (k * (last - cum).exp()).transpose(-1, -2) @ v  # [B, H, NC, K, V]
    kept = last.squeeze(-2).exp()[..., None]  # [B, H, NC, K, 1]
    if state is None:
        state = q.new_zeros(batch, heads, key_dim, value_dim)
    starts = []
    for n in range(q.shape[2]):
        starts.append(state)
        state = kept[:, :, n] * state + added[:, :, n]
    out = out + (q * cum.exp()) @ torch.stack(starts, dim=2)
    return common.from_chunks(scale * out, length), state


def _intra_chunk_scores(q, k, cum):
    """``Σ_i q_ti k_si e^{G_ti − G_si}`` for s <= t, 0 above the diagonal: ``[B, H, NC, C, C]``."""
    causal = common.causal_mask(q.shape[3], q.device)
    if torch.compiler.is_compiling():
        # The choice below would break the graph (a host sync), and torch.cond of the two forms
        # fails in torch 2.13's backward (their gradients' strides differ): the exact form.
        return _pairwise_scores(q, k, cum, causal)
    # One host sync per call: this is the CPU / fallback path (fla's kernels serve CUDA).
    spread = (cum[..., :1, :] - cum[..., -1:, :]).abs().amax() if cum.numel() else cum.new_zeros(())
    factored = bool(spread <= MAX_FACTORED_SPREAD[cum.dtype])
    return (_factored_scores if factored else _pairwise_scores)(q, k, cum, causal)


def _factored_scores(q, k, cum, causal):
    first = cum[..., :1, :]
    scores = (q * (cum - first).exp()) @ (k * (first - cum).exp()).transpose(-1, -2)
    return scores.masked_fill(~causal, 0.0)


def _pairwise_scores(q, k, cum, causal):
    log_pair = (cum[..., :, None, :] - cum[..., None, :, :]).masked_fill(~causal[..., None], float("-inf"))
    return (q[..., :, None, :] * k[..., None, :, :] * log_pair.exp()).sum(-1)


def gla_torch(q, k, v, log_decay, scale, initial_state=None, cu_seqlens=None, chunk_size=CHUNK_SIZE):
    """The chunked PyTorch GLA (no validation; see :func:`gla`). Computes in
    max(float32, input dtype); returns ``(o in q.dtype, final state in the compute dtype)``."""
    dtype = compute_dtype(q.dtype, k.dtype, v.dtype, log_decay.dtype)
    inputs = [x.to(dtype) for x in (q, k, v, log_decay)]
    state = None if initial_state is None else initial_state.to(dtype)
    layout = None
    if cu_seqlens is not None:
        layout = RowLayout(1, q.shape[1], cu_seqlens=cu_seqlens)
        inputs = [layout.to_rows(x) for x in inputs]  # [N, L, H, *], zeros past each length
    with common.no_autocast(q.device):
        out, final = _gla_chunked(*inputs, scale, state, chunk_size)
    if layout is not None:
        out = layout.from_rows(out)
    return out.to(q.dtype), final


def gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated linear attention: ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ``, ``o_t = scale · S_tᵀ q_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (one dtype).
        log_decay: ``[B, T, H, K]`` log of the per-channel decay g_t (<= 0, e.g.
            ``logsigmoid(x) / 16``); any floating dtype.
        scale: defaults to ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` state before the first token (N = B, or the number of
            packed sequences).
        output_final_state: also return the state after the last token of each sequence.
        cu_seqlens: ``[N+1]`` int32/int64 boundaries of packed sequences (B == 1); the state
            restarts at every sequence start.
        backend: ``"auto"`` (fla on CUDA when importable, else torch; PyTorch under
            ``srope.backend.use("torch")``), ``"torch"`` or ``"fla"`` (explicit: wins over
            :mod:`srope.backend`).

    Returns:
        ``(o [B, T, H, V] in q's dtype, final_state [N, H, K, V] or None)``; the state is
        float32 (float64 for float64 inputs on the torch path).
    """
    batch, length, heads, key_dim = common.check_rank4("q", q)
    common.check_tensor("k", k, (batch, length, heads, key_dim))
    common.check_tensor("log_decay", log_decay, (batch, length, heads, key_dim))
    common.check_tensor("v", v, (batch, length, heads, None))
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    common.check_same_device(q.device, k=k, v=v, log_decay=log_decay, initial_state=initial_state, cu_seqlens=cu_seqlens)
    common.check_flag("output_final_state", output_final_state)
    backend = common.check_backend(backend)
    scale = common.check_scale(scale, key_dim**-0.5)
    count = common.sequence_count(cu_seqlens, batch, length)
    common.check_state(initial_state, count, heads, key_dim, v.shape[-1])

    if common.resolve_backend(backend, q.device, common.fla_dtype_problem(q, log_decay)) == "fla":
        ops = common.fla_ops()
        state = None if initial_state is None else initial_state.float()
        cu_seqlens, state, restore = common.without_empty_sequences(cu_seqlens, state)
        if length <= common.FUSED_RECURRENT_MAX_T:
            out, final = ops.fused_recurrent_gla(
                q, k, v, gk=log_decay, scale=scale, initial_state=state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
            )  # fmt: skip
        else:
            out, final = ops.chunk_gla(
                q, k, v, log_decay, scale=scale, initial_state=state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
            )  # fmt: skip
        return out, restore(final) if output_final_state else None

    out, final = gla_torch(q, k, v, log_decay, scale, initial_state, cu_seqlens)
    return out, final if output_final_state else None
