"""Public rotary ops: input validation, backend dispatch, dtype contract.

``selective_rope`` rotates q and k by input-dependent cumulative angles; ``rope`` by
fixed frequencies times integer positions. Both keep srope's dtype contract: the
outputs have the inputs' dtypes, phases and angles are computed in at least float32
(float64 inputs stay float64), and cumulative phases are accumulated in float64 and
reduced modulo 2π only as the angle ``temperature · Φ``.

Files: ``naive.py`` (float64-capable ground truth), ``kernels.py`` (the Triton kernels: design
and numerics), ``chunk.py`` (their launches, registered as ``torch.library`` ops: what
``backend="triton"`` calls), ``decode.py`` (the fused one-token step of the ``SelectiveRoPE``
module's cached decoding: generator conv, activation, bias, gate, phase and rotation,
optionally from the token x itself). The kernels run on CUDA, or on the CPU under
``TRITON_INTERPRET=1`` (read when ``chunk`` is first imported, as Triton reads it when
kernels are decorated).
"""

from __future__ import annotations

import os

import torch

from srope import backend as srope_backend
from srope.ops.checks import check_backend, check_cu_seqlens, check_device, check_tensor
from srope.ops.rotary import naive

BACKENDS = ("auto", "torch", "triton")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _triton_ops():
    """The Triton launch module (:mod:`srope.ops.rotary.chunk`), or None when triton cannot be imported (imported on first
    use, so that TRITON_INTERPRET set before then is honoured; later calls hit sys.modules)."""
    try:
        from srope.ops.rotary import chunk
    except ImportError:
        return None
    return chunk


def _use_triton(backend: str, q: torch.Tensor) -> bool:
    """Whether ``backend`` runs the Triton kernels for inputs on ``q``'s device and dtype.

    ``"auto"`` takes them for CUDA tensors when triton imports; ``"triton"`` forces them
    and also accepts CPU tensors under ``TRITON_INTERPRET=1`` (Triton's interpreter);
    ``"auto"`` defers to :mod:`srope.backend`'s setting.
    """
    backend = srope_backend.op_backend(backend)
    if backend == "torch":
        return False
    if backend == "auto":
        return q.device.type == "cuda" and q.dtype in TRITON_DTYPES and _triton_ops() is not None
    if _triton_ops() is None:
        raise ValueError("backend='triton' needs the triton package, which cannot be imported here")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 to interpret the kernels; got {q.device}")
    if q.dtype not in TRITON_DTYPES:
        raise TypeError(f"backend='triton' supports q/k dtypes {TRITON_DTYPES}, got {q.dtype}")
    return True


def _check_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[int, int, int, int, int]:
    check_tensor("q", q, rank=4)
    check_tensor("k", k, rank=4)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
    check_device(q.device, k=k)
    batch, length, heads, head_dim = q.shape
    if k.shape[0] != batch or k.shape[1] != length or k.shape[3] != head_dim:
        raise ValueError(f"k must be [B, T, Hk, D] = [{batch}, {length}, Hk, {head_dim}] like q, got {tuple(k.shape)}")
    key_heads = k.shape[2]
    if key_heads == 0 or heads % key_heads != 0:
        raise ValueError(f"the number of query heads ({heads}) must be a multiple of the key heads ({key_heads})")
    return batch, length, heads, key_heads, head_dim


def selective_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    output_final_phase: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rotate q and k by input-dependent cumulative angles (Selective RoPE).

    Args:
        q: ``[B, T, H, D]`` queries.
        k: ``[B, T, Hk, D]`` keys, ``H % Hk == 0``; query head ``h`` uses key head
            ``h // (H // Hk)`` and its phase.
        phi: ``[B, T, Hk, R]`` per-step phase increments before temperature, ``1 <= R``,
            ``2R <= D``. Channels ``j`` and ``j + R`` (``j < R``) rotate as a pair;
            channels ``[2R, D)`` pass through unchanged.
        temperature: ``[R]`` or ``[Hk, R]`` frequency of each pair.
        offset: ``[N, Hk, R]`` phase before the first token (a previous call's final phase).
        cu_seqlens: ``[N+1]`` int32/int64 boundaries of packed sequences (B == 1); the
            phase restarts at every sequence start.
        output_final_phase: also return ``Φ`` after the last token of each sequence,
            ``[N, Hk, R]`` float64, without gradient; pass it back as ``offset`` to continue.
        backend: ``"auto"`` (what :mod:`srope.backend` sets; by default the fastest
            available: the Triton kernels for CUDA tensors when triton imports, else the
            reference path), ``"torch"`` (the reference path) or ``"triton"`` (the kernels;
            CPU tensors only under ``TRITON_INTERPRET=1``). An explicit value wins over
            :mod:`srope.backend`.

    Returns:
        ``(q_rot, k_rot, final_phase or None)`` with the dtypes of q and k. The angle of
        token t is ``temperature · Φ_t`` with ``Φ_t = offset + Σ_{s≤t} phi_s``.
    """
    batch, length, _, key_heads, head_dim = _check_qk(q, k)
    check_tensor("phi", phi, rank=4)
    check_tensor("temperature", temperature)
    check_device(q.device, phi=phi, temperature=temperature, offset=offset, cu_seqlens=cu_seqlens)
    check_backend(backend, BACKENDS)
    rot = phi.shape[3]
    if tuple(phi.shape[:3]) != (batch, length, key_heads):
        raise ValueError(f"phi must be [B, T, Hk, R] = [{batch}, {length}, {key_heads}, R], got {tuple(phi.shape)}")
    if rot < 1 or 2 * rot > head_dim:
        raise ValueError(f"phi's last dimension R must satisfy 1 <= R and 2R <= head_dim={head_dim}, got R={rot}")
    if tuple(temperature.shape) not in ((rot,), (key_heads, rot)):
        raise ValueError(f"temperature must be [R] = [{rot}] or [Hk, R] = [{key_heads}, {rot}], got {tuple(temperature.shape)}")
    count = batch if cu_seqlens is None else check_cu_seqlens(cu_seqlens, batch, length)
    if offset is not None:
        check_tensor("offset", offset)
        if tuple(offset.shape) != (count, key_heads, rot):
            raise ValueError(f"offset must be [N, Hk, R] = [{count}, {key_heads}, {rot}], got {tuple(offset.shape)}")
    if q.numel() > 0 and k.numel() > 0 and _use_triton(backend, q):
        q_rot, k_rot, final = _triton_ops().selective_rope_triton(q, k, phi, temperature, offset, cu_seqlens)
    else:
        q_rot, k_rot, final = naive.selective_rope(q, k, phi, temperature, offset, cu_seqlens)
    return q_rot, k_rot, final.detach() if output_final_phase else None


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard (fixed-frequency) RoPE with per-token positions.

    Args:
        q: ``[B, T, H, D]``; k: ``[B, T, Hk, D]`` with ``H % Hk == 0``.
        positions: ``[B, T]`` position of every token (integer or float).
        inv_freq: ``[R]`` frequencies, ``2R <= D``; pairs ``(j, j + R)`` rotate by
            ``positions · inv_freq[j]``, channels ``[2R, D)`` pass through.
        backend: ``"auto"``, ``"torch"`` or ``"triton"``, as for :func:`selective_rope`.
    """
    batch, length, _, _, head_dim = _check_qk(q, k)
    check_tensor("positions", positions, rank=2, floating=False)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or real floating tensor, got {positions.dtype}")
    check_tensor("inv_freq", inv_freq, rank=1)
    check_device(q.device, positions=positions, inv_freq=inv_freq)
    check_backend(backend, BACKENDS)
    if tuple(positions.shape) != (batch, length):
        raise ValueError(f"positions must be [B, T] = [{batch}, {length}], got {tuple(positions.shape)}")
    if inv_freq.numel() < 1 or 2 * inv_freq.numel() > head_dim:
        raise ValueError(f"inv_freq must be [R] with 1 <= R and 2R <= head_dim={head_dim}, got {tuple(inv_freq.shape)}")
    if q.numel() > 0 and k.numel() > 0 and _use_triton(backend, q):
        return _triton_ops().rope_triton(q, k, positions, inv_freq)
    return naive.rope(q, k, positions, inv_freq)
