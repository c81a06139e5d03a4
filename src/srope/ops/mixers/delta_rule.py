"""Gated delta rule (Gated DeltaNet; plain DeltaNet without a decay): fla on CUDA, a
chunked PyTorch form everywhere else and wherever fla's backward is broken (fla #640).

Recurrence (fla's state layout ``[K, V]``)::

    S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,       o_t = scale · S_tᵀ q_t

β_t ∈ (0, 2): β > 1 gives the transition a negative eigenvalue (DeltaNet with
``allow_neg_eigval``).

Chunked form (the WY/UT transform). In a chunk starting from S_0, with ``Γ_t = Σ_{s<=t} g_s``
the log-decay summed inside the chunk, write ``S_t = e^{Γ_t} S_0 + Σ_{s<=t} e^{Γ_t−Γ_s} k_s u_sᵀ``.
Then the pseudo-values ``u`` solve the unit lower-triangular system::

    u_t + β_t Σ_{s<t} e^{Γ_t−Γ_s} (k_t·k_s) u_s = β_t v_t − β_t e^{Γ_t} S_0ᵀ k_t
    ⇒  U = U0 − W S_0,   U0 = L⁻¹ diag(β) V,   W = L⁻¹ diag(β e^{Γ}) K

and ``o_t = scale · [e^{Γ_t} S_0ᵀ q_t + Σ_{s<=t} e^{Γ_t−Γ_s} (q_t·k_s) u_s]``,
``S_C = e^{Γ_C} S_0 + Σ_s e^{Γ_C−Γ_s} k_s u_sᵀ``. Everything but the chunk-to-chunk state
hand-over is computed for all chunks at once; the hand-over is a loop of two small matmuls
per chunk, so the path is usable for training on the GPU.
"""

from __future__ import annotations

import torch

from srope.ops.checks import compute_dtype
from srope.ops.layout import RowLayout
from srope.ops.mixers import _common as common

CHUNK_SIZE = 64
L2_EPS = 1e-6  # fla's l2norm: x / sqrt(Σx² + eps)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _delta_chunked(q, k, v, beta, g, scale, state, chunk_size):
    """The gated delta rule on dense rows ``[B, T, H, *]`` in one dtype (g may be None)."""
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    chunk_size = min(chunk_size, length)  # short inputs (decoding) need no padding
    q, k, v = (common.to_chunks(x, chunk_size) for x in (q, k, v))  # [B, H, NC, C, *]
    beta = common.to_chunks(beta, chunk_size)  # [B, H, NC, C]
    causal = common.causal_mask(chunk_size, q.device)
    strict = common.causal_mask(chunk_size, q.device, strict=True)
    if g is None:
        decay_in, decay_out = strict.to(q.dtype), causal.to(q.dtype)
        from_start = to_end = kept = None
    else:
        cum = common.to_chunks(g, chunk_size).cumsum(dim=-1)  # Γ [B, H, NC, C]
        log_pair = cum[..., :, None] - cum[..., None, :]  # Γ_t − Γ_s
        decay_in = log_pair.masked_fill(~strict, float("-inf")).exp()
        decay_out = log_pair.masked_fill(~causal, float("-inf")).exp()
        from_start = cum.exp()[..., None]  # e^{Γ_t}
        to_end = (cum[..., -1:] - cum).exp()[..., None]  # e^{Γ_C − Γ_s}
        kept = cum[..., -1].exp()[..., None, None]  # e^{Γ_C} [B, H, NC, 1, 1]
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    system = eye + beta[..., None] * decay_in * (k @ k.transpose(-1, -2))
    k_beta = k * beta[..., None] * (1.0 if from_start is None else from_start)
    solved = torch.linalg.solve_triangular(
        system, torch.cat([k_beta, v * beta[..., None]], dim=-1), upper=False, unitriangular=True
    )
    w, u0 = solved[..., :key_dim], solved[..., key_dim:]
    k_end = k if to_end is None else k * to_end
    scores = decay_out * (q @ k.transpose(-1, -2))  # [B, H, NC, C, C]
    if state is None:
        state = q.new_zeros(batch, heads, key_dim, value_dim)
    starts, pseudo = [], []
    for n in range(q.shape[2]):
        starts.append(state)
        u = u0[:, :, n] - w[:, :, n] @ state
        pseudo.append(u)
        carried = state if kept is None else kept[:, :, n] * state
        state = carried + k_end[:, :, n].transpose(-1, -2) @ u
    starts, pseudo = torch.stack(starts, dim=2), torch.stack(pseudo, dim=2)
    q_start = q if from_start is None else q * from_start
    out = q_start @ starts + scores @ pseudo
    return common.from_chunks(scale * out, length), state


def gated_delta_rule_torch(
    q, k, v, beta, log_decay, scale, initial_state=None, cu_seqlens=None, qk_l2norm=False, chunk_size=CHUNK_SIZE
):
    """The chunked PyTorch gated delta rule (no validation; see :func:`gated_delta_rule`).
    Computes in max(float32, input dtype); returns ``(o in q.dtype, final state)``."""
    dtypes = [x.dtype for x in (q, k, v, beta, log_decay) if x is not None]
    dtype = compute_dtype(*dtypes)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    g = None if log_decay is None else log_decay.to(dtype)
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    state = None if initial_state is None else initial_state.to(dtype)
    inputs = [q, k, v, beta[..., None]] + ([] if g is None else [g[..., None]])
    layout = None
    if cu_seqlens is not None:
        layout = RowLayout(1, q.shape[1], cu_seqlens=cu_seqlens)
        inputs = [layout.to_rows(x) for x in inputs]  # zeros past each length: identity steps
    q, k, v, beta = inputs[0], inputs[1], inputs[2], inputs[3][..., 0]
    g = None if g is None else inputs[4][..., 0]
    with common.no_autocast(q.device):
        out, final = _delta_chunked(q, k, v, beta, g, scale, state, chunk_size)
    if layout is not None:
        out = layout.from_rows(out)
    return out.to(dtypes[0]), final


def issue_640_problem(device: torch.device, *, gated: bool, grad: bool, backend: str) -> str | None:
    """Why fla must not run this call because of fla #640 (None: it may).

    Only gated calls that need gradients on an affected GPU are concerned. ``backend="fla"``
    raises then; ``"auto"`` warns once and takes the PyTorch path.
    """
    if not (gated and grad and device.type == "cuda" and common.fla_gated_backward_is_broken(device)):
        return None
    if backend == "fla":
        raise RuntimeError(
            "backend='fla' cannot train the gated delta rule here: fla's gated chunk backward "
            "computes wrong gradients on Hopper GPUs with 3.4.0 <= Triton < 3.7.1 (fla issue #640); "
            "use backend='auto' or 'torch', or run without gradients"
        )
    if backend == "auto":
        common.warn_once(
            "gdn-640",
            "fla's gated delta rule backward is broken on this GPU (Hopper, 3.4.0 <= Triton < 3.7.1, "
            "fla #640): srope trains Gated DeltaNet with its chunked PyTorch path here (slower); "
            "forward-only calls still use fla",
        )
    return "fla's gated chunk backward is broken on this GPU (fla #640)"


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    qk_l2norm: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule: ``S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ``,
    ``o_t = scale · S_tᵀ q_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (one dtype).
        beta: ``[B, T, H]`` write strength in (0, 2); beta > 1 gives negative eigenvalues.
            Values are not checked (that would cost a device sync).
        log_decay: ``[B, T, H]`` log of the scalar decay (<= 0), or None for plain DeltaNet.
        scale: defaults to ``K ** -0.5``.
        qk_l2norm: l2-normalise q and k first (fla's ``use_qk_l2norm_in_kernel``, eps 1e-6).
        initial_state: ``[N, H, K, V]``; output_final_state: also return the last state.
        cu_seqlens: ``[N+1]`` packed sequences (B == 1); the state restarts per sequence.
        backend: ``"auto"``, ``"torch"`` or ``"fla"``, as for :func:`srope.ops.gla`. On
            Hopper with 3.4 <= Triton < 3.7.1 fla's gated backward is wrong (fla #640,
            :func:`fla_gated_backward_is_broken`): there ``"auto"`` runs calls that need
            gradients on the chunked PyTorch path (on the GPU, with a one-time warning) and
            ``"fla"`` raises; forward-only calls still use fla.

    Returns:
        ``(o [B, T, H, V] in q's dtype, final_state [N, H, K, V] or None)``; the state is
        float32 (float64 for float64 inputs on the torch path).
    """
    batch, length, heads, key_dim = common.check_rank4("q", q)
    common.check_tensor("k", k, (batch, length, heads, key_dim))
    common.check_tensor("v", v, (batch, length, heads, None))
    common.check_tensor("beta", beta, (batch, length, heads))
    if log_decay is not None:
        common.check_tensor("log_decay", log_decay, (batch, length, heads))
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    common.check_same_device(
        q.device, k=k, v=v, beta=beta, log_decay=log_decay, initial_state=initial_state, cu_seqlens=cu_seqlens
    )
    common.check_flag("qk_l2norm", qk_l2norm)
    common.check_flag("output_final_state", output_final_state)
    backend = common.check_backend(backend)
    scale = common.check_scale(scale, key_dim**-0.5)
    count = common.sequence_count(cu_seqlens, batch, length)
    common.check_state(initial_state, count, heads, key_dim, v.shape[-1])

    problem = common.fla_dtype_problem(q, beta, log_decay)
    if problem is None and log_decay is None and q.dtype == torch.float32 and length > 64:
        problem = "fla's chunk_delta_rule (DeltaNet, no decay) does not support float32"
    if problem is None and max(key_dim, v.shape[-1]) > common.FLA_MAX_HEAD_DIM:
        problem = f"fla's delta-rule kernels take head dims <= {common.FLA_MAX_HEAD_DIM}, got K={key_dim}, V={v.shape[-1]}"
    grad = common.needs_grad(q, k, v, beta, log_decay, initial_state)
    if problem is None:
        problem = issue_640_problem(q.device, gated=log_decay is not None, grad=grad, backend=backend)

    if common.resolve_backend(backend, q.device, problem) == "fla":
        ops = common.fla_ops()
        state = None if initial_state is None else initial_state.float()
        cu_seqlens, state, restore = common.without_empty_sequences(cu_seqlens, state)
        kwargs = dict(
            scale=scale, initial_state=state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=qk_l2norm, cu_seqlens=cu_seqlens,
        )  # fmt: skip
        short = length <= common.FUSED_RECURRENT_MAX_T
        if log_decay is None:
            kernel = ops.fused_recurrent_delta_rule if short else ops.chunk_delta_rule
            out, final = kernel(q, k, v, beta, **kwargs)
        elif short and not grad:  # fla's fused recurrent gated kernel has no backward
            out, final = ops.fused_recurrent_gated_delta_rule(q, k, v, g=log_decay, beta=beta, **kwargs)
        else:
            out, final = ops.chunk_gated_delta_rule(q, k, v, log_decay, beta, **kwargs)
        return out, restore(final) if output_final_state else None

    out, final = gated_delta_rule_torch(q, k, v, beta, log_decay, scale, initial_state, cu_seqlens, qk_l2norm)
    return out, final if output_final_state else None
