"""Launch wrappers of the rotation kernels, registered as ``torch.library`` ops.

``selective_rope_triton`` and ``rope_triton`` are what :mod:`srope.ops.rotary` calls for
``backend="triton"``; they take already-validated inputs. The forward and backward of
each are ``torch.library.custom_op`` s with fake (meta) implementations, and autograd is
registered on the forward op, so ``torch.compile`` keeps them in its graph without a
break; eager calls run the same launches without the dispatcher (:class:`srope.ops._triton.KernelOp`). (``triton_op`` would let inductor see inside, but under ``TRITON_INTERPRET=1``
its fake tensors reach the interpreted kernels, so nothing could be tested on the CPU;
the kernels are already fused, so there is nothing for inductor to gain.) Nothing here
waits for the GPU: packed-batch chunk tables are built on the device with a static upper
bound on the number of chunks, so the ops can be captured in CUDA graphs.
"""

from __future__ import annotations

import functools

import torch
import triton

from srope.ops._triton import cdiv, interpreting, kernel_op, next_power_of_2, on_device, pdl
from srope.ops.rotary import kernels

# Tile sizes (why each value, and what it was measured against: docs/kernels.md, "Tuning").
# The chunk scans walk a sequence's chunks in steps of BC chunks x BRS channels, about
# SCAN_ELEMENTS, 8 warps: long sequences take long steps, short ones more channels.
SCAN_ELEMENTS = 2048
# The rotation kernels take a whole chunk of about TILE_ELEMENTS (tokens x pairs) as one tile
# (a sub-tile loop carrying the phase leaves too few loads in flight); chunks longer than
# MAX_SUB_T tokens (a given block_t) go in sub-tiles of that many, and under
# TRITON_INTERPRET=1 in sub-tiles of INTERPRET_SUB_T tokens (the loop stays tested).
TILE_ELEMENTS = 1024
MAX_SUB_T = 64  # bounds the float32 in-tile phase scan (see kernels._selective_angles)
INTERPRET_SUB_T = 8
# The light kernels (chunk sums, dphi) walk several chunks and key heads per program one
# token at a time, LIGHT_ELEMENTS (chunks x heads x pairs) per step, 4 warps.
LIGHT_ELEMENTS = 512
# The chunk sums may use up to 255 registers (no spills at any tested shape either way); the
# rotation kernels keep ptxas's default, with which their forward is faster.
NO_SPILL = {"maxnreg": 255}
# q/k dtypes whose rotation forms angles with a float32 in-tile scan (kernels._selective_angles).
FAST_SCAN_DTYPES = (torch.bfloat16, torch.float16)
# RoPE's kernels carry nothing between sub-tiles: autotuned (sub-tile tokens ST, warps).
TUNE_CONFIGS = ((16, 4), (32, 8), (16, 8), (8, 4))


def _tuned(fn, key):
    if interpreting():
        return fn
    configs = [triton.Config({"ST": st}, num_warps=w) for st, w in TUNE_CONFIGS]
    return triton.autotune(configs=configs, key=key, cache_results=True)(fn)


_rope_fwd = _tuned(kernels.rope_fwd_kernel, ["G", "R", "P", "BT", "F64"])
_rope_bwd = _tuned(kernels.rope_bwd_kernel, ["Hk", "G", "R", "P", "BT", "F64", "FREQ_GRAD"])


def _interpreted_tile() -> dict:
    return {"ST": INTERPRET_SUB_T, "num_warps": 4}


def _rope_tile() -> dict:
    """Fixed under the interpreter; autotuned on the GPU."""
    return _interpreted_tile() if interpreting() else {}


def _tile(block_t: int, block_r: int) -> dict:
    """Sub-tile and warps of the Selective RoPE rotation kernels: the whole chunk on the GPU."""
    if interpreting():
        return _interpreted_tile()
    return {"ST": min(block_t, MAX_SUB_T), "num_warps": 8 if block_t * block_r >= 4 * TILE_ELEMENTS else 4}


def _scan_tile(chunks_per_sequence: int, block_r: int) -> dict:
    """Chunks per step (BC) and channels per program (BRS) of the chunk scans."""
    steps = min(1024, next_power_of_2(max(chunks_per_sequence, 1)))
    return {"BC": steps, "BRS": max(1, min(block_r, SCAN_ELEMENTS // steps)), "num_warps": 8}


def _light_tile(block_t: int, block_r: int, key_heads: int, elements: int = LIGHT_ELEMENTS) -> dict:
    """Key heads (HPP) and chunks (CPP) per program and warps of the chunk-sum and dphi
    kernels: about ``elements`` channels per token step, whole [Hk, R] rows where they fit."""
    heads = min(next_power_of_2(key_heads), max(1, elements // block_r))
    return {"HPP": heads, "CPP": max(1, elements // (heads * block_r)), "num_warps": 4}


def _no_spill() -> dict:
    return {} if interpreting() else dict(NO_SPILL)


def _guarded(fn):
    """Run an op's launches on the device of its first tensor argument."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with on_device(args[0]):
            return fn(*args, **kwargs)

    return wrapper


def default_block_t(batch: int, length: int, key_heads: int, pairs: int = 64) -> int:
    """Chunk length: about TILE_ELEMENTS / pairs tokens (16 to 128; 16 for R = 64), halved
    (down to 16) while fewer than 1024 programs would run, so that small batches still
    spread over every SM of the GPU."""
    block_t = min(128, max(16, TILE_ELEMENTS // next_power_of_2(max(pairs, 1))))
    while block_t > 16 and batch * key_heads * cdiv(max(length, 1), block_t) < 1024:
        block_t //= 2
    return block_t


def _check_block_t(block_t: int) -> int:
    if not isinstance(block_t, int) or block_t < 1 or block_t & (block_t - 1):
        raise ValueError(f"block_t must be a positive power of two, got {block_t!r}")
    return block_t


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _bth(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _meta(q: torch.Tensor, k: torch.Tensor, pairs: int, block_t: int, *others: torch.Tensor) -> dict:
    heads, head_dim, key_heads = q.shape[2], q.shape[3], k.shape[2]
    rest = head_dim - 2 * pairs
    return dict(
        G=heads // key_heads,
        R=pairs,
        P=rest,
        BT=block_t,
        BR=next_power_of_2(pairs),
        BP=next_power_of_2(max(rest, 1)),
        F64=any(x.dtype == torch.float64 for x in (q, k, *others)),
        PRECISE=not interpreting(),
    )


def _selective_meta(q: torch.Tensor, k: torch.Tensor, pairs: int, block_t: int, *others: torch.Tensor) -> dict:
    """``_meta`` plus the Selective RoPE kernels' angle path and tile."""
    meta = _meta(q, k, pairs, block_t, *others)
    meta["FAST"] = q.dtype in FAST_SCAN_DTYPES and k.dtype in FAST_SCAN_DTYPES
    return {**meta, **_tile(block_t, meta["BR"])}


def chunk_tables(cu_seqlens: torch.Tensor, length: int, block_t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks of ``block_t`` tokens that never straddle a packed sequence.

    Returns ``cu_chunks [N+1]`` (first chunk slot of every sequence) and ``chunk_seq
    [cdiv(T, block_t) + N]`` (the sequence of every slot, ``N`` past the last chunk), both
    int32 and built on the device: the slot count is a static upper bound, so nothing
    waits for the GPU and the shapes are known to ``torch.compile``.
    """
    count = cu_seqlens.numel() - 1
    bounds = cu_seqlens.to(torch.int64)
    chunks = torch.div(bounds[1:] - bounds[:-1] + block_t - 1, block_t, rounding_mode="floor")
    cu_chunks = torch.cat([bounds.new_zeros(1), torch.cumsum(chunks, 0)])
    slots = torch.arange(cdiv(length, block_t) + count, device=cu_seqlens.device, dtype=torch.int64)
    chunk_seq = torch.searchsorted(cu_chunks[1:].contiguous(), slots, right=True)
    return cu_chunks.to(torch.int32), chunk_seq.to(torch.int32)


# --------------------------------------------------------------------------- selective


@kernel_op("srope::selective_rope_fwd")
@_guarded
def selective_rope_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    offset: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    cu_chunks: torch.Tensor | None,
    chunk_seq: torch.Tensor | None,
    block_t: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(q_rot, k_rot, final phase [N,Hk,R] f64, phase before every chunk [slots,Hk,R] f64)``."""
    q, k, phi = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(phi)
    temperature = temperature.contiguous()
    batch, length, _, _ = q.shape
    key_heads, pairs = k.shape[2], phi.shape[3]
    varlen = cu_seqlens is not None
    count = cu_seqlens.shape[0] - 1 if varlen else batch
    per_row = cdiv(length, block_t)
    slots = chunk_seq.shape[0] if varlen else batch * per_row
    f64 = dict(dtype=torch.float64, device=q.device)
    sums = torch.empty(slots, key_heads, pairs, **f64)
    base = torch.empty(slots, key_heads, pairs, **f64)
    final = torch.empty(count, key_heads, pairs, **f64)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    meta = _selective_meta(q, k, pairs, block_t, phi, temperature)
    table = (cu_seqlens, chunk_seq, cu_chunks) if varlen else (sums, sums, sums)
    temp_h = pairs if temperature.dim() == 2 else 0
    light = _light_tile(block_t, meta["BR"], key_heads)
    if slots > 0:
        kernels.chunk_sum_kernel[(cdiv(slots, light["CPP"]), cdiv(key_heads, light["HPP"]))](
            phi, sums, base, *_bth(phi), length, per_row, count, slots, *table,
            Hk=key_heads, R=pairs, BT=block_t, BR=meta["BR"], VARLEN=varlen, **light, **_no_spill(), **pdl(q),
        )
    scan = _scan_tile(per_row, meta["BR"])
    kernels.chunk_scan_fwd_kernel[(count, key_heads, cdiv(pairs, scan["BRS"]))](
        sums, base, sums if offset is None else offset.contiguous(), final, per_row, table[2],
        Hk=key_heads, R=pairs, HAS_OFFSET=offset is not None, VARLEN=varlen, **scan, **pdl(q),
    )
    if slots > 0:
        kernels.srope_fwd_kernel[(slots, key_heads)](
            q, k, phi, temperature, base, q_out, k_out,
            *_bth(q), *_bth(k), *_bth(q_out), *_bth(k_out), *_bth(phi), temp_h,
            length, per_row, count, *table, Hk=key_heads, VARLEN=varlen, **meta, **pdl(q),
        )
    return q_out, k_out, final, base


@kernel_op("srope::selective_rope_bwd")
@_guarded
def selective_rope_bwd(
    dq_out: torch.Tensor,
    dk_out: torch.Tensor,
    q_rot: torch.Tensor,
    k_rot: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    base: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    cu_chunks: torch.Tensor | None,
    chunk_seq: torch.Tensor | None,
    block_t: int,
    phi_grad: bool,
    temperature_grad: bool,
    offset_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the forward's rotated outputs ``q_rot``, ``k_rot``: ``(dq, dk, dphi, dtemperature
    per sequence [N,Hk,R] f64, doffset [N,Hk,R] f64)``; the gradients not asked for are empty
    tensors."""
    q, k, phi = _last_dim_contiguous(q_rot), _last_dim_contiguous(k_rot), _last_dim_contiguous(phi)
    dq_out, dk_out = _last_dim_contiguous(dq_out), _last_dim_contiguous(dk_out)
    temperature = temperature.contiguous()
    batch, length, _, _ = q.shape
    key_heads, pairs = k.shape[2], phi.shape[3]
    varlen = cu_seqlens is not None
    count = cu_seqlens.shape[0] - 1 if varlen else batch
    per_row = cdiv(length, block_t)
    slots = base.shape[0]
    meta = _selective_meta(q, k, pairs, block_t, phi, temperature)
    table = (cu_seqlens, chunk_seq, cu_chunks) if varlen else (base, base, base)
    temp_h = pairs if temperature.dim() == 2 else 0
    need_total = phi_grad or offset_grad
    # dL/dangle per token, for dphi; for a bf16 phi in bf16: its gradient is rounded to bf16
    # anyway (relative error 1.6-1.7e-3 -> 1.7-1.8e-3 against float64) and the scratch's
    # round trip takes half the bytes. A
    # float32 phi keeps a float32 scratch (a bf16 one took its error from ~3e-7 to ~4e-4).
    # The chunk totals that carry it across chunks are summed from the unrounded values.
    scratch_dtype = torch.float64 if meta["F64"] else torch.bfloat16 if phi.dtype == torch.bfloat16 else torch.float32

    def buffer(shape, needed: bool, dtype=torch.float64) -> torch.Tensor:
        return torch.empty(shape if needed else (0,), dtype=dtype, device=q.device)  # never aliased

    dangle = buffer((batch * length, key_heads, pairs), phi_grad, scratch_dtype)
    dtotal = buffer((slots, key_heads, pairs), need_total)
    dtemp_part = buffer((slots, key_heads, pairs), temperature_grad)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if slots > 0:
        kernels.srope_bwd_kernel[(slots, key_heads)](
            q, k, dq_out, dk_out, phi, temperature, base, dq, dk, dangle, dtotal, dtemp_part,
            *_bth(q), *_bth(k), *_bth(dq_out), *_bth(dk_out), *_bth(dq), *_bth(dk), *_bth(phi), temp_h,
            length, per_row, count, *table, Hk=key_heads, VARLEN=varlen,
            STORE_DANGLE=phi_grad, STORE_TOTAL=need_total, TEMP_GRAD=temperature_grad, **meta, **pdl(q),
        )
    carry = buffer((slots, key_heads, pairs), phi_grad)
    doffset = buffer((count, key_heads, pairs), offset_grad)
    dtemp_seq = buffer((count, key_heads, pairs), temperature_grad)
    if need_total or temperature_grad:
        scan = _scan_tile(per_row, meta["BR"])
        kernels.chunk_scan_bwd_kernel[(count, key_heads, cdiv(pairs, scan["BRS"]))](
            dtotal, dtemp_part, carry, temperature, doffset, dtemp_seq, temp_h, per_row, table[2],
            Hk=key_heads, R=pairs, CARRY=phi_grad, OFFSET_GRAD=offset_grad, TEMP_GRAD=temperature_grad,
            VARLEN=varlen, **scan, **pdl(q),
        )
    dphi = buffer(phi.shape, phi_grad, phi.dtype)
    if phi_grad and slots > 0:
        light = _light_tile(block_t, meta["BR"], key_heads)
        kernels.dphi_kernel[(cdiv(slots, light["CPP"]), cdiv(key_heads, light["HPP"]))](
            dangle, carry, temperature, dphi, *_bth(dphi), temp_h, length, per_row, count, slots, *table,
            Hk=key_heads, R=pairs, BT=block_t, BR=meta["BR"], VARLEN=varlen, **light, **pdl(q),
        )
    return dq, dk, dphi, dtemp_seq, doffset


@selective_rope_fwd.register_fake
def _selective_rope_fwd_fake(q, k, phi, temperature, offset, cu_seqlens, cu_chunks, chunk_seq, block_t):
    batch, length = q.shape[0], q.shape[1]
    key_heads, pairs = k.shape[2], phi.shape[3]
    count = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    slots = batch * cdiv(length, block_t) if cu_seqlens is None else chunk_seq.shape[0]
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        q.new_empty((count, key_heads, pairs), dtype=torch.float64),
        q.new_empty((slots, key_heads, pairs), dtype=torch.float64),
    )


@selective_rope_bwd.register_fake
def _selective_rope_bwd_fake(
    dq_out, dk_out, q_rot, k_rot, phi, temperature, base, cu_seqlens, cu_chunks, chunk_seq, block_t, phi_grad, temperature_grad, offset_grad
):
    count = q_rot.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    per_sequence = (count, k_rot.shape[2], phi.shape[3])
    return (
        q_rot.new_empty(q_rot.shape),
        k_rot.new_empty(k_rot.shape),
        phi.new_empty(phi.shape if phi_grad else (0,)),
        q_rot.new_empty(per_sequence if temperature_grad else (0,), dtype=torch.float64),
        q_rot.new_empty(per_sequence if offset_grad else (0,), dtype=torch.float64),
    )


def _selective_setup(ctx, inputs, output) -> None:
    q, k, phi, temperature, offset, cu_seqlens, cu_chunks, chunk_seq, block_t = inputs
    # The rotated outputs, not q and k: the backward needs only those (see
    # kernels._rotate_heads_bwd), and the host's own op usually saves them too (not where it
    # passes on a changed copy: a masked k, heads expanded for GQA, a cast).
    ctx.save_for_backward(output[0], output[1], phi, temperature, output[3], cu_seqlens, cu_chunks, chunk_seq)
    ctx.block_t = block_t
    ctx.offset_dtype = None if offset is None else offset.dtype
    ctx.mark_non_differentiable(output[2], output[3])
    # No zero-filled gradients for the two float64 phase outputs (a fill kernel in every
    # backward); an unused q/k output's gradient arrives as None and is made below.
    ctx.set_materialize_grads(False)


def _selective_backward(ctx, dq_out, dk_out, _dfinal, _dbase):
    q_rot, k_rot, phi, temperature, base, cu_seqlens, cu_chunks, chunk_seq = ctx.saved_tensors
    need = ctx.needs_input_grad
    offset_grad = ctx.offset_dtype is not None and need[4]
    dq_out = torch.zeros_like(q_rot) if dq_out is None else dq_out
    dk_out = torch.zeros_like(k_rot) if dk_out is None else dk_out
    dq, dk, dphi, dtemp_seq, doffset = selective_rope_bwd(
        dq_out, dk_out, q_rot, k_rot, phi, temperature, base, cu_seqlens, cu_chunks, chunk_seq,
        ctx.block_t, need[2], need[3], offset_grad,
    )
    dtemp = None
    if need[3]:
        dtemp = dtemp_seq.sum(0)  # fixed-order reduction over sequences, then heads
        dtemp = (dtemp if temperature.dim() == 2 else dtemp.sum(0)).to(temperature.dtype)
    return (
        dq if need[0] else None,
        dk if need[1] else None,
        dphi if need[2] else None,
        dtemp,
        doffset.to(ctx.offset_dtype) if offset_grad else None,
        None, None, None, None,
    )


selective_rope_fwd.register_autograd(_selective_backward, setup_context=_selective_setup)


def selective_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    offset: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    *,
    block_t: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Selective RoPE with the Triton kernels: ``(q_rot, k_rot, final phase [N,Hk,R] f64)``.

    Inputs as in :func:`srope.ops.rotary.selective_rope` (validated there). ``block_t``:
    chunk length, a power of two (default :func:`default_block_t`).
    """
    if block_t is None:
        block_t = default_block_t(q.shape[0], q.shape[1], k.shape[2], phi.shape[3])
    block_t = _check_block_t(block_t)
    cu_chunks = chunk_seq = None
    if cu_seqlens is not None:
        cu_chunks, chunk_seq = chunk_tables(cu_seqlens, q.shape[1], block_t)
    q_rot, k_rot, final, _ = selective_rope_fwd(q, k, phi, temperature, offset, cu_seqlens, cu_chunks, chunk_seq, block_t)
    return q_rot, k_rot, final


# --------------------------------------------------------------------------- fixed RoPE


@kernel_op("srope::rope_fwd")
@_guarded
def rope_fwd(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, block_t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, inv_freq = _last_dim_contiguous(q), _last_dim_contiguous(k), inv_freq.contiguous()
    batch, length, _, _ = q.shape
    key_heads, pairs = k.shape[2], inv_freq.shape[0]
    per_row = cdiv(length, block_t)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    meta = _meta(q, k, pairs, block_t)  # compute dtype from q, k only, like the reference
    if batch * per_row > 0:
        _rope_fwd[(batch * per_row, key_heads)](
            q, k, positions, inv_freq, q_out, k_out, *_bth(q), *_bth(k), *_bth(q_out), *_bth(k_out),
            positions.stride(0), positions.stride(1), length, per_row, **meta, **_rope_tile(), **pdl(q),
        )
    return q_out, k_out


@kernel_op("srope::rope_bwd")
@_guarded
def rope_bwd(
    dq_out: torch.Tensor,
    dk_out: torch.Tensor,
    q_rot: torch.Tensor,
    k_rot: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    block_t: int,
    freq_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the forward's rotated outputs: ``(dq, dk, dinv_freq partials [chunks, Hk, R] f64 or empty)``."""
    q, k, inv_freq = _last_dim_contiguous(q_rot), _last_dim_contiguous(k_rot), inv_freq.contiguous()
    dq_out, dk_out = _last_dim_contiguous(dq_out), _last_dim_contiguous(dk_out)
    batch, length, _, _ = q.shape
    key_heads, pairs = k.shape[2], inv_freq.shape[0]
    per_row = cdiv(length, block_t)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    shape = (batch * per_row, key_heads, pairs) if freq_grad else (0,)
    partial = torch.empty(shape, dtype=torch.float64, device=q.device)
    meta = _meta(q, k, pairs, block_t)  # compute dtype from q, k only, like the reference
    if batch * per_row > 0:
        _rope_bwd[(batch * per_row, key_heads)](
            q, k, dq_out, dk_out, positions, inv_freq, dq, dk, partial,
            *_bth(q), *_bth(k), *_bth(dq_out), *_bth(dk_out), *_bth(dq), *_bth(dk),
            positions.stride(0), positions.stride(1), length, per_row,
            Hk=key_heads, FREQ_GRAD=freq_grad, **meta, **_rope_tile(), **pdl(q),
        )
    return dq, dk, partial


@rope_fwd.register_fake
def _rope_fwd_fake(q, k, positions, inv_freq, block_t):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@rope_bwd.register_fake
def _rope_bwd_fake(dq_out, dk_out, q_rot, k_rot, positions, inv_freq, block_t, freq_grad):
    chunks = q_rot.shape[0] * cdiv(q_rot.shape[1], block_t)
    shape = (chunks, k_rot.shape[2], inv_freq.shape[0]) if freq_grad else (0,)
    return q_rot.new_empty(q_rot.shape), k_rot.new_empty(k_rot.shape), q_rot.new_empty(shape, dtype=torch.float64)


def _rope_setup(ctx, inputs, output) -> None:
    q, k, positions, inv_freq, block_t = inputs
    ctx.save_for_backward(output[0], output[1], positions, inv_freq)  # the rotated outputs, as Selective RoPE
    ctx.block_t = block_t


def _rope_backward(ctx, dq_out, dk_out):
    q_rot, k_rot, positions, inv_freq = ctx.saved_tensors
    need = ctx.needs_input_grad
    dq_out = torch.zeros_like(q_rot) if dq_out is None else dq_out
    dk_out = torch.zeros_like(k_rot) if dk_out is None else dk_out
    dq, dk, partial = rope_bwd(dq_out, dk_out, q_rot, k_rot, positions, inv_freq, ctx.block_t, need[3])
    dfreq = partial.sum((0, 1)).to(inv_freq.dtype) if need[3] else None
    return dq if need[0] else None, dk if need[1] else None, None, dfreq, None


rope_fwd.register_autograd(_rope_backward, setup_context=_rope_setup)


def rope_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, *, block_t: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-frequency RoPE with the Triton kernel (inputs validated by :func:`srope.ops.rotary.rope`)."""
    if block_t is None:
        block_t = default_block_t(q.shape[0], q.shape[1], k.shape[2], inv_freq.shape[0])
    block_t = _check_block_t(block_t)
    return rope_fwd(q, k, positions, inv_freq, block_t)
