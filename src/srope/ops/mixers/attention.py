"""Causal softmax attention, with or without forget gates (the Forgetting Transformer).

Query ``i`` of ``Tq`` sits at position ``p(i) = Tk − Tq + i`` among the ``Tk`` keys (so
decoding with a KV cache is ``Tq = 1``) and sees keys ``j <= p(i)``::

    logit(i, j) = scale · q_i·k_j + Σ_{κ=j+1}^{p(i)} log_forget_κ,       o_i = softmax_j(logit) · v

``key_mask`` (False = the token is absent, e.g. padding) removes tokens exactly: an absent
key is invisible, its forget gate counts as 0 (as if the token were not in the sequence),
and the output of a query at an absent position is 0. So a masked call equals running
every row without its absent tokens. ``cu_seqlens`` packs sequences (B == 1, Tq == Tk):
nothing is seen across sequence boundaries.

Backends: the explicit masked softmax below (any device, float64-capable; memory
O(Tq·Tk), computed in query blocks), fla's ``parallel_forgetting_attn`` / ``parallel_attn``
(Tq == Tk; a key_mask is handled by packing the present tokens into ``cu_seqlens``), and
for plain softmax attention on CUDA PyTorch's ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from srope.ops.checks import compute_dtype
from srope.ops.layout import sequence_ids
from srope.ops.mixers import _common as common

BLOCK_ELEMENTS = 2**24  # scores per query block of the explicit path (B·H·block·Tk); 128 MB of float64 gate sums
# fla 0.6.0's parallel attention holds whole head rows of q, k and v in shared memory (tiles of
# 128 queries and 64 keys, head size padded to a power of two, no autotuning): at 512 bytes
# per row (float32 at head size 128, 16-bit at 256) it asks for 263,168 B on Hopper, more than
# an H200 has (232,448), and fails at launch.
FLA_MAX_ROW_BYTES = 256


def _visible(positions, key_len, seq, key_mask):
    """``[B or 1, 1, len(positions), Tk]`` bool: causal, same sequence, key present."""
    keys = torch.arange(key_len, device=positions.device)
    visible = keys[None, :] <= positions[:, None]
    if seq is not None:
        visible = visible & (seq[positions][:, None] == seq[None, :])
    visible = visible[None, None]
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]
    return visible


def attention_torch(q, k, v, log_forget, scale, cu_seqlens=None, key_mask=None, block_elements=BLOCK_ELEMENTS):
    """The explicit masked softmax (no validation). ``log_forget`` None: plain attention.

    Computes in max(float32, input dtype); the forget-gate sums are formed in float64 from
    a float64 running sum, so long sequences lose no precision. Returns q's dtype.
    """
    with common.no_autocast(q.device):
        return _attention_torch(q, k, v, log_forget, scale, cu_seqlens, key_mask, block_elements)


def _attention_torch(q, k, v, log_forget, scale, cu_seqlens, key_mask, block_elements):
    batch, q_len, heads, _ = q.shape
    key_len, kv_heads = k.shape[1], k.shape[2]
    dtype = compute_dtype(q.dtype, k.dtype, v.dtype, *([] if log_forget is None else [log_forget.dtype]))
    q_heads = q.to(dtype).transpose(1, 2)  # [B, H, Tq, D]
    k_heads = k.to(dtype).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)  # [B, H, Tk, D]
    v_heads = v.to(dtype).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
    positions = torch.arange(key_len - q_len, key_len, device=q.device)
    seq = None if cu_seqlens is None else sequence_ids(cu_seqlens.long(), key_len)
    present = None if key_mask is None else key_mask != 0
    cum = None
    if log_forget is not None:
        gates = log_forget.to(torch.float64)
        if present is not None:
            gates = gates.masked_fill(~present[..., None], 0.0)
        cum = gates.cumsum(dim=1).transpose(1, 2)  # [B, H, Tk]: Σ_{κ<=j} log_forget_κ
    block = max(1, block_elements // max(1, batch * heads * key_len))
    outputs = []
    for start in range(0, q_len, block):
        rows = positions[start : start + block]
        logits = scale * (q_heads[:, :, start : start + block] @ k_heads.transpose(-1, -2))
        if cum is not None:
            logits = logits + (cum[:, :, rows, None] - cum[:, :, None, :]).to(dtype)
        logits = logits.masked_fill(~_visible(rows, key_len, seq, present), float("-inf"))
        top = logits.amax(dim=-1, keepdim=True).detach()
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = (logits - top).exp()  # rows that see no key are all zero
        total = weights.sum(dim=-1, keepdim=True)
        outputs.append((weights @ v_heads) / torch.where(total > 0, total, torch.ones_like(total)))
    out = torch.cat(outputs, dim=2).transpose(1, 2)  # [B, Tq, H, Dv]
    if present is not None:
        out = out * present[:, positions, None, None]
    return out.to(q.dtype)


def sdpa_attention(q, k, v, scale, cu_seqlens=None, key_mask=None):
    """Plain softmax attention through ``F.scaled_dot_product_attention`` (no validation)."""
    q_len, key_len, heads, kv_heads = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    mask, causal, present = None, False, None
    if cu_seqlens is None and key_mask is None:
        if q_len == key_len:
            causal = True  # SDPA's own causal mask is top-left aligned: only right for Tq == Tk
        elif q_len > 1:
            mask = _visible(torch.arange(key_len - q_len, key_len, device=q.device), key_len, None, None)
    else:
        positions = torch.arange(key_len - q_len, key_len, device=q.device)
        seq = None if cu_seqlens is None else sequence_ids(cu_seqlens.long(), key_len)
        present = None if key_mask is None else key_mask != 0
        mask = _visible(positions, key_len, seq, present)
        if present is not None:  # a query at an absent position sees nothing: let it see all, zero it below
            mask = mask | ~present[:, positions][:, None, :, None]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=heads != kv_heads,
    ).transpose(1, 2)  # fmt: skip
    if present is not None:
        out = out * present[:, positions, None, None].to(out.dtype)
    return out


def _fla_attention(kernel, q, k, v, g, scale, cu_seqlens, key_mask):
    """Run an fla parallel attention kernel (Tq == Tk); a key_mask packs the present tokens
    of every row (or packed sequence) into one varlen batch and scatters the output back."""
    if key_mask is None:  # (empty packed sequences dropped: their kernels are not specified for them)
        return kernel(q, k, v, g, scale, None if cu_seqlens is None else cu_seqlens.unique_consecutive())
    batch, length = key_mask.shape
    present = (key_mask != 0).reshape(-1)
    index = present.nonzero().squeeze(1)
    bounds = torch.arange(0, batch * length + 1, length, device=q.device) if cu_seqlens is None else cu_seqlens.long()
    counts = torch.cat([present.new_zeros(1, dtype=torch.long), present.long().cumsum(0)])
    packed_cu = counts[bounds].unique_consecutive()  # empty rows/sequences dropped

    def pack(x):
        return None if x is None else x.reshape(batch * length, *x.shape[2:])[index][None]

    out = q.new_zeros(batch * length, q.shape[2], v.shape[-1])
    if index.numel() > 0:
        out = out.index_copy(0, index, kernel(pack(q), pack(k), pack(v), pack(g), scale, packed_cu)[0].to(out.dtype))
    return out.view(batch, length, q.shape[2], v.shape[-1])


def _check_attention(q, k, v, log_forget, cu_seqlens, key_mask, scale, backend, gated):
    batch, q_len, heads, head_dim = common.check_rank4("q", q)
    _, key_len, kv_heads, _ = common.check_rank4("k", k)
    common.check_tensor("k", k, (batch, None, None, head_dim))
    common.check_tensor("v", v, (batch, key_len, kv_heads, None))
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"the number of query heads ({heads}) must be a multiple of the key/value heads ({kv_heads})")
    if q_len > key_len:
        raise ValueError(f"q may not have more time steps than k (Tq <= Tk), got Tq={q_len}, Tk={key_len}")
    if gated:
        common.check_tensor("log_forget", log_forget, (batch, key_len, heads))
    common.check_same_device(q.device, k=k, v=v, log_forget=log_forget, cu_seqlens=cu_seqlens, key_mask=key_mask)
    backend = common.check_backend(backend)
    scale = common.check_scale(scale, head_dim**-0.5)
    if cu_seqlens is not None:
        if q_len != key_len:
            raise ValueError(f"packed batches (cu_seqlens) need Tq == Tk, got Tq={q_len}, Tk={key_len}")
        common.sequence_count(cu_seqlens, batch, key_len)
    if key_mask is not None:
        common.check_tensor("key_mask", key_mask, (batch, key_len), floating=False)
        if key_mask.is_complex():
            raise TypeError("key_mask must be bool or 0/1 numbers, got a complex tensor")
    return scale, backend


def _fla_problem(q, k, v) -> str | None:
    if q.shape[1] != k.shape[1]:
        return f"fla's parallel attention needs Tq == Tk (no KV cache), got Tq={q.shape[1]}, Tk={k.shape[1]}"
    if max(q.shape[-1], v.shape[-1]) > common.FLA_MAX_HEAD_DIM:
        return f"fla's parallel attention takes head dims <= {common.FLA_MAX_HEAD_DIM}"
    row = q.element_size() << (max(q.shape[-1], v.shape[-1]) - 1).bit_length()  # bytes per padded head row
    if row > FLA_MAX_ROW_BYTES:
        return (f"fla's parallel attention runs out of shared memory at {row} bytes per head row "
                f"({q.dtype}, head dims {q.shape[-1]}/{v.shape[-1]}); it fits up to {FLA_MAX_ROW_BYTES}")
    return common.fla_dtype_problem(q)


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_forget: torch.Tensor,
    *,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Forgetting attention: causal softmax attention with a data-dependent decay bias.

    Args:
        q: ``[B, Tq, H, D]``; k: ``[B, Tk, Hk, D]``; v: ``[B, Tk, Hk, Dv]``; ``H % Hk == 0``
            (query head h uses key/value head ``h // (H // Hk)``), ``Tq <= Tk``: query i sits
            at position ``Tk − Tq + i``.
        log_forget: ``[B, Tk, H]`` log forget gate (<= 0) of each position, per query head;
            ``logit(i, j) = scale · q_i·k_j + Σ_{κ=j+1}^{p(i)} log_forget_κ``.
        scale: defaults to ``D ** -0.5``.
        cu_seqlens: ``[N+1]`` packed sequences (B == 1, Tq == Tk).
        key_mask: ``[B, Tk]`` bool or 0/1; False = the token is absent (see the module doc).
        backend: ``"auto"`` (fla's ``parallel_forgetting_attn`` on CUDA when Tq == Tk, else
            the explicit path), ``"torch"`` or ``"fla"``, as for :func:`srope.ops.gla`.

    Returns ``o [B, Tq, H, Dv]`` in q's dtype.
    """
    scale, backend = _check_attention(q, k, v, log_forget, cu_seqlens, key_mask, scale, backend, gated=True)
    problem = _fla_problem(q, k, v) or common.fla_dtype_problem(log_forget)
    if common.resolve_backend(backend, q.device, problem) == "fla":
        kernel = common.fla_ops().parallel_forgetting_attn

        def call(q, k, v, g, scale, cu):
            return kernel(q, k, v, g.float(), scale=scale, cu_seqlens=cu)

        return _fla_attention(call, q, k, v, log_forget, scale, cu_seqlens, key_mask)
    return attention_torch(q, k, v, log_forget, scale, cu_seqlens, key_mask)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal softmax attention; arguments as :func:`forgetting_attention` without gates.

    ``backend="auto"`` on CUDA: fla's ``parallel_attn`` for packed or masked calls with
    Tq == Tk when fla is importable, otherwise ``F.scaled_dot_product_attention``; on
    other devices, and with ``"torch"``, the explicit masked softmax.
    """
    scale, backend = _check_attention(q, k, v, None, cu_seqlens, key_mask, scale, backend, gated=False)
    problem = _fla_problem(q, k, v)
    if backend == "auto" and q.is_cuda:
        varlen = cu_seqlens is not None or key_mask is not None
        if not (varlen and problem is None and common.fla_available()):
            return sdpa_attention(q, k, v, scale, cu_seqlens, key_mask)
    if common.resolve_backend(backend, q.device, problem) == "fla":
        kernel = common.fla_ops().parallel_attn

        def call(q, k, v, g, scale, cu):
            return kernel(q, k, v, scale=scale, cu_seqlens=cu)

        return _fla_attention(call, q, k, v, None, scale, cu_seqlens, key_mask)
    return attention_torch(q, k, v, None, scale, cu_seqlens, key_mask)
