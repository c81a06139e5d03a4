"""Triton kernels of the Selective RoPE rotation (prefill/training) and of fixed RoPE.

Design (see ``chunk.py`` for the launches):

- Time is cut into chunks of ``BT`` tokens that never straddle a sequence: dense batches
  have ``cdiv(T, BT)`` chunks per row; packed batches (``cu_seqlens``) number the chunks
  of each sequence in turn (``cu_chunks``) and map every chunk slot to its sequence
  (``chunk_seq``; slots past the last chunk hold ``N`` and exit at once). A rotation
  program walks its chunk in sub-tiles of ``ST`` tokens carrying the chunk-local phase in
  float64; on the GPU the chunk is one sub-tile (``chunk.py`` says why). The light kernels
  (chunk sums, dphi) take ``CPP`` chunks × ``HPP`` key heads per program.
- Forward: (1) ``chunk_sum``: Σφ of every chunk in float64; (2) ``chunk_scan_fwd``: one
  program per (sequence, key head, channel block) scans the chunk totals in float64 from
  the offset, giving the phase before every chunk (``base``) and the final phase; (3)
  ``srope_fwd``: per (chunk, key head), the local cumsum of φ, the phase ``base + local``
  and the angle ``Θ · phase`` reduced modulo 2π with a float64 carry (``_selective_angles``:
  exact in float64 for float32/64 q and k, a float32 in-tile scan for 16-bit ones);
  accurate sin/cos; the rotation of the key head
  and its group of query heads. q and k are read once and the outputs written once; φ is
  read twice (chunk sums, rotation).
- Backward: (1) ``srope_bwd``: recompute the angles from φ and ``base``, inverse-rotate
  the output gradients into dq, dk and form ``dL/dangle`` per token, summed over the group;
  store it (a scratch in φ's dtype for bf16 φ, else float32 or float64), its chunk totals
  (tile sums of the unrounded values, kept in float64), and the chunk's temperature partial
  ``Σ_t dL/dangle_t · Φ_t`` (float64); (2) ``chunk_scan_bwd``: reverse exclusive scan of
  the chunk totals per sequence (the suffix carried into each chunk; the chunks are
  loaded one step ahead of the scan), the offset gradient
  ``Θ · Σ_t dL/dangle_t`` and the fixed-order sum of the temperature partials; (3)
  ``dphi``: ``Θ · (local reverse cumsum + carry)``. No atomics: bitwise deterministic.
- Programmatic dependent launch (``PDL``, sm_90+, :func:`srope.ops._triton.pdl`): every
  kernel first waits until the kernel before it in the stream has finished
  (``griddepcontrol.wait``, before any load) and then lets the next one's programs start,
  so that they are resident and waiting when it ends instead of being launched then.
- sin/cos (and exp in the decode step): libdevice ``__nv_sinf``/``__nv_cosf`` (accurate,
  full range reduction) on the GPU, numpy's under ``TRITON_INTERPRET=1``; never the
  approximate PTX instructions.
"""

from __future__ import annotations

import math
import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from srope.ops._triton import await_predecessor

TWO_PI = tl.constexpr(2.0 * math.pi)
INV_TWO_PI = tl.constexpr(1.0 / (2.0 * math.pi))
# Read when the kernels are decorated, like Triton's own interpreter switch.
INTERPRETER = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
# Tokens per unrolled step of the light kernels: that many loads in flight per thread (an
# unroll of 32 spilled registers at 32-token chunks, sm_90)
LIGHT_UNROLL = tl.constexpr(8)


@triton.jit
def _sincos(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.cos(x), libdevice.sin(x)
    else:
        return tl.cos(x), tl.sin(x)


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _out(x, ptr):
    """Cast ``x`` to the element type of ``ptr``, rounding to nearest even.

    On the GPU this is the plain conversion. Triton's interpreter converts float64 to
    bfloat16 wrongly and float32 to bfloat16 by truncation, so there the bfloat16 rounding
    is done on the bits (same result as the GPU's ``cvt.rn.bf16.f32`` for finite values).
    """
    ty: tl.constexpr = ptr.dtype.element_ty
    if ty == tl.float64:
        return x.to(tl.float64)
    elif INTERPRETER and ty == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.float32).to(ty)


@triton.jit
def _wrap(angle):
    """``angle mod 2π`` in float64, like ``torch.remainder`` but with a multiplication by
    1/(2π) instead of a division (the result may leave [0, 2π) by an ulp; sin/cos do not care)."""
    two_pi = tl.full((1,), TWO_PI, tl.float64)
    inv_two_pi = tl.full((1,), INV_TWO_PI, tl.float64)
    return angle - two_pi * tl.floor(angle * inv_two_pi)


@triton.jit
def _chunk_span(pid_c, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT: tl.constexpr, VARLEN: tl.constexpr):
    """(batch row, sequence, first token, end token, valid) of chunk slot ``pid_c``."""
    if VARLEN:
        n = tl.load(chunk_seq + pid_c).to(tl.int32)
        valid = n < N
        n = tl.minimum(n, N - 1)
        index = pid_c - tl.load(cu_chunks + n)
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
        return 0, n, bos + index * BT, eos, valid
    else:
        n = pid_c // NT
        return n.to(tl.int64), n, (pid_c % NT).to(tl.int64) * BT, T, pid_c >= 0


@triton.jit
def _chunk_spans(slots, S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT: tl.constexpr, VARLEN: tl.constexpr):
    """``_chunk_span`` for a block of chunk slots (``[CPP]`` vectors): (batch row, first
    token, end token, valid); slots ``>= S`` are invalid."""
    inside = slots < S
    if VARLEN:
        n = tl.load(chunk_seq + slots, mask=inside, other=N).to(tl.int32)
        valid = inside & (n < N)
        n = tl.minimum(n, N - 1)
        index = slots - tl.load(cu_chunks + n)
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
        return tl.zeros_like(bos), bos + index * BT, eos, valid
    else:
        b = (slots // NT).to(tl.int64)
        return b, (slots % NT).to(tl.int64) * BT, tl.full(slots.shape, T, tl.int64), inside


@triton.jit
def _chunk_range(n, NT, cu_chunks, VARLEN: tl.constexpr):
    """Chunk slots ``[c0, c1)`` of sequence ``n``."""
    if VARLEN:
        return tl.load(cu_chunks + n), tl.load(cu_chunks + n + 1)
    else:
        return n * NT, n * NT + NT


@triton.jit
def _load_halves(ptr, s_b, s_t, s_h, b, t, h, rr, m, R: tl.constexpr, CD: tl.constexpr):
    """The two rotated halves ``[ST, BR]`` of head ``h`` of ``ptr`` over tokens ``t``, in ``CD``."""
    p = ptr + b * s_b + t[:, None] * s_t + h * s_h
    return tl.load(p + rr[None, :], mask=m, other=0.0).to(CD), tl.load(p + R + rr[None, :], mask=m, other=0.0).to(CD)


@triton.jit
def _copy_rest(src, dst, mt, R: tl.constexpr, P: tl.constexpr, BP: tl.constexpr):
    """Copy the ``P`` unrotated channels after the ``2R`` rotated ones (``src``/``dst``: ``[ST, 1]`` row pointers)."""
    if P > 0:
        rp = tl.arange(0, BP)
        mp = mt[:, None] & (rp < P)[None, :]
        tl.store(dst + 2 * R + rp[None, :], _out(tl.load(src + 2 * R + rp[None, :], mask=mp, other=0.0), dst), mask=mp)


@triton.jit
def _rotate_heads_fwd(
    src, dst, s_b, s_t, s_h, d_b, d_t, d_h, b, t, mt, h0, NH, cos, sin, rr, mr, x1, x2,
    R: tl.constexpr, P: tl.constexpr, BP: tl.constexpr, CD: tl.constexpr,
):
    """Rotate heads ``h0 .. h0+NH-1`` of ``src`` by (cos, sin) ``[ST, BR]`` into ``dst``.

    ``x1, x2``: head ``h0``'s halves (:func:`_load_halves`), which the caller loads before
    it forms the angles, so that those loads are in flight while sin/cos are computed
    (docs/kernels.md, "Tuning")."""
    m = mt[:, None] & mr[None, :]
    row_s = b * s_b + t[:, None] * s_t
    row_d = b * d_b + t[:, None] * d_t
    for g in range(NH):
        h = h0 + g
        if g > 0:
            x1, x2 = _load_halves(src, s_b, s_t, s_h, b, t, h, rr, m, R, CD)
        pd = dst + row_d + h * d_h
        tl.store(pd + rr[None, :], _out(x1 * cos - x2 * sin, dst), mask=m)
        tl.store(pd + R + rr[None, :], _out(x1 * sin + x2 * cos, dst), mask=m)
        _copy_rest(src + row_s + h * s_h, pd, mt, R, P, BP)


@triton.jit
def _rotate_heads_bwd(
    y_ptr, g_ptr, dx_ptr, y_b, y_t, y_h, g_b, g_t, g_h, d_b, d_t, d_h, b, t, mt, h0, NH, cos, sin, rr, mr,
    y1, y2, g1, g2, acc, R: tl.constexpr, P: tl.constexpr, BP: tl.constexpr, CD: tl.constexpr,
):
    """Inverse-rotate the gradients of heads ``h0 ..``; accumulate dL/dangle per pair,
    ``acc += g2·y1 - g1·y2``, from the forward's rotated outputs ``y`` (∂y/∂angle = (-y2, y1)):
    the backward reads the outputs, which the host usually keeps for its own backward,
    instead of keeping the inputs as well. ``y1, y2, g1, g2``: head ``h0``'s halves, loaded by the caller
    before the angles."""
    m = mt[:, None] & mr[None, :]
    row_g = b * g_b + t[:, None] * g_t
    row_d = b * d_b + t[:, None] * d_t
    for j in range(NH):
        h = h0 + j
        if j > 0:
            y1, y2 = _load_halves(y_ptr, y_b, y_t, y_h, b, t, h, rr, m, R, CD)
            g1, g2 = _load_halves(g_ptr, g_b, g_t, g_h, b, t, h, rr, m, R, CD)
        pd = dx_ptr + row_d + h * d_h
        tl.store(pd + rr[None, :], _out(g1 * cos + g2 * sin, dx_ptr), mask=m)
        tl.store(pd + R + rr[None, :], _out(g2 * cos - g1 * sin, dx_ptr), mask=m)
        acc += g2 * y1 - g1 * y2
        _copy_rest(g_ptr + row_g + h * g_h, pd, mt, R, P, BP)
    return acc


@triton.jit
def _selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, CD: tl.constexpr, FAST: tl.constexpr):
    """Angles ``[ST, BR]`` of one sub-tile of a chunk, for key head ``hk``.

    ``carry`` is the chunk-local phase before the sub-tile, ``start`` the phase before the
    chunk (both float64, carried across sub-tiles and chunks, so the phase never loses
    precision with T). Exact path: the phase ``start + local`` and the angle ``Θ · phase``
    are formed and reduced modulo 2π in float64 and rounded to the compute dtype once
    (~2e-7 rad in float32 whatever T). ``FAST`` (16-bit q/k, float32 compute): the angle at
    the sub-tile's start is reduced in float64 per channel and ``Θ ·`` the sub-tile's
    float32 cumsum of φ added to it, nothing per element in float64; the error is a few
    float32 roundings of numbers below 2π + Θ·ST·|φ| (~3e-5 rad for ST = 64, |φ| = 2, Θ = 1),
    far below the 16-bit outputs' own rounding (~4e-3).
    Returns (angle, chunk-local phase [ST, BR] f64, carry after the sub-tile).
    """
    m = mt[:, None] & mr[None, :]
    x = tl.load(phi + b * p_b + t[:, None] * p_t + hk * p_h + rr[None, :], mask=m, other=0.0)
    if FAST and CD == tl.float32:
        x = x.to(tl.float32)
        scan = tl.cumsum(x, 0)
        first = _wrap(theta * (start + carry)).to(tl.float32)
        angle = first[None, :] + theta.to(tl.float32)[None, :] * scan
        local = carry[None, :] + scan.to(tl.float64)  # used only by the temperature gradient
    else:
        x = x.to(tl.float64)
        local = carry[None, :] + tl.cumsum(x, 0)
        angle = _wrap(theta[None, :] * (start[None, :] + local)).to(CD)
    return angle, local, carry + tl.sum(x.to(tl.float64), 0)


@triton.jit
def _light_block(pid, hb, S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, Hk: tl.constexpr, R: tl.constexpr,
                BT: tl.constexpr, CPP: tl.constexpr, HPP: tl.constexpr, BR: tl.constexpr, VARLEN: tl.constexpr):
    """Chunk slots ``[CPP]``, their batch rows, first and end tokens and validity, and the
    channels ``[HPP·BR]`` (heads, pairs, mask) of one light-kernel program: ``CPP`` chunks ×
    ``HPP`` key heads, walked one token of every chunk at a time, so that each load is
    ``CPP`` whole contiguous rows of a ``[.., Hk, R]`` tensor and every sum over tokens stays
    in the thread that holds the channel (no reduction across threads)."""
    slots = pid * CPP + tl.arange(0, CPP)
    b, t0, t_end, valid = _chunk_spans(slots, S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT, VARLEN)
    c = tl.arange(0, HPP * BR)
    h, r = hb * HPP + c // BR, c % BR
    mc = (h < Hk) & (r < R)
    slot_ch = (slots[:, None] * Hk + h[None, :]) * R + r[None, :]  # [CPP, HPP·BR] offsets in per-chunk tensors
    ms = (slots < S)[:, None] & mc[None, :]
    return slots, b, t0, t_end, valid, h, r, mc, slot_ch, ms


@triton.jit
def chunk_sum_kernel(
    phi, sums, base, p_b, p_t, p_h, T, NT, N, S, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, CPP: tl.constexpr, HPP: tl.constexpr, BR: tl.constexpr,
    VARLEN: tl.constexpr, PDL: tl.constexpr = False,
):
    """``sums[c, hk, :] = Σ_{t in chunk c} φ_t`` in float64 (tokens in order) for ``CPP``
    chunks and ``HPP`` key heads at once; unused slots of a packed batch get ``base = 0``
    (so that every element of the saved ``base`` is defined)."""
    await_predecessor(PDL)
    slots, b, t0, t_end, valid, h, r, mc, slot_ch, ms = _light_block(
        tl.program_id(0), tl.program_id(1), S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, Hk, R, BT, CPP, HPP, BR, VARLEN)
    rows = phi + b[:, None] * p_b + (h * p_h + r)[None, :]
    acc = tl.zeros(slot_ch.shape, dtype=tl.float64)
    for step in range(0, BT, LIGHT_UNROLL):
        for i in tl.static_range(min(BT, LIGHT_UNROLL)):
            t = t0 + step + i
            m = (valid & (t < t_end))[:, None] & mc[None, :]
            acc += tl.load(rows + t[:, None] * p_t, mask=m, other=0.0).to(tl.float64)
    tl.store(sums + slot_ch, acc, mask=ms & valid[:, None])
    tl.store(base + slot_ch, tl.zeros(slot_ch.shape, dtype=tl.float64), mask=ms & ~valid[:, None])


@triton.jit
def chunk_scan_fwd_kernel(
    sums, base, offset, final, NT, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BRS: tl.constexpr, BC: tl.constexpr,
    HAS_OFFSET: tl.constexpr, VARLEN: tl.constexpr, PDL: tl.constexpr = False,
):
    """Per (sequence, key head, channel block): exclusive float64 scan of the chunk sums
    from the offset (``base``), and the final phase. The exclusive scan is the inclusive scan
    of the sums shifted by one chunk, not ``inclusive - x``: a non-finite sum would otherwise
    reach its own chunk's starting phase and with it the chunk's earlier tokens."""
    await_predecessor(PDL)
    n, hk, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rr = rb * BRS + tl.arange(0, BRS)
    mr = rr < R
    c0, c1 = _chunk_range(n, NT, cu_chunks, VARLEN)
    if HAS_OFFSET:
        carry = tl.load(offset + (n * Hk + hk) * R + rr, mask=mr, other=0.0).to(tl.float64)
    else:
        carry = tl.zeros([BRS], dtype=tl.float64)
    i = tl.arange(0, BC)
    idx = c0 + i
    x = tl.load(sums + (idx[:, None] * Hk + hk) * R + rr[None, :], mask=(idx < c1)[:, None] & mr[None, :], other=0.0)
    # each step's chunk before it (none for the step's first: that one is in carry)
    prev = tl.load(sums + ((idx - 1)[:, None] * Hk + hk) * R + rr[None, :], mask=((i > 0) & (idx <= c1))[:, None] & mr[None, :], other=0.0)
    for _ in range(tl.cdiv(c1 - c0, BC)):
        # the next step's chunks are loaded before this step's scan: one memory latency per
        # sequence instead of one per step (the last step's load is masked out)
        after = idx + BC
        x_next = tl.load(sums + (after[:, None] * Hk + hk) * R + rr[None, :], mask=(after < c1)[:, None] & mr[None, :], other=0.0)
        prev_next = tl.load(sums + ((after - 1)[:, None] * Hk + hk) * R + rr[None, :], mask=((i > 0) & (after <= c1))[:, None] & mr[None, :], other=0.0)
        m = (idx < c1)[:, None] & mr[None, :]
        tl.store(base + (idx[:, None] * Hk + hk) * R + rr[None, :], carry[None, :] + tl.cumsum(prev, 0), mask=m)
        carry += tl.sum(x, 0)
        x, prev, idx = x_next, prev_next, after
    tl.store(final + (n * Hk + hk) * R + rr, carry, mask=mr)


@triton.jit
def srope_fwd_kernel(
    q, k, phi, temp, base, q_out, k_out,
    q_b, q_t, q_h, k_b, k_t, k_h, qo_b, qo_t, qo_h, ko_b, ko_t, ko_h, p_b, p_t, p_h, temp_h,
    T, NT, N, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    VARLEN: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr, FAST: tl.constexpr, PDL: tl.constexpr = False,
):
    """Rotate key head ``hk`` and query heads ``hk·G .. hk·G+G-1`` over one chunk."""
    await_predecessor(PDL)
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    SUB: tl.constexpr = min(ST, BT)
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b, _n, t0, t_end, valid = _chunk_span(pid_c, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT, VARLEN)
    if valid:
        rr = tl.arange(0, BR)
        mr = rr < R
        theta = tl.load(temp + hk * temp_h + rr, mask=mr, other=0.0).to(tl.float64)
        start = tl.load(base + (pid_c * Hk + hk) * R + rr, mask=mr, other=0.0)
        carry = tl.zeros([BR], dtype=tl.float64)
        for s in range(0, BT, SUB):
            t = t0 + s + tl.arange(0, SUB)
            mt = t < t_end
            m = mt[:, None] & mr[None, :]
            q1, q2 = _load_halves(q, q_b, q_t, q_h, b, t, hk * G, rr, m, R, CD)
            k1, k2 = _load_halves(k, k_b, k_t, k_h, b, t, hk, rr, m, R, CD)
            angle, _local, carry = _selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, CD, FAST)
            cos, sin = _sincos(angle, PRECISE)
            _rotate_heads_fwd(q, q_out, q_b, q_t, q_h, qo_b, qo_t, qo_h, b, t, mt, hk * G, G, cos, sin, rr, mr, q1, q2, R, P, BP, CD)
            _rotate_heads_fwd(k, k_out, k_b, k_t, k_h, ko_b, ko_t, ko_h, b, t, mt, hk, 1, cos, sin, rr, mr, k1, k2, R, P, BP, CD)


@triton.jit
def srope_bwd_kernel(
    q_rot, k_rot, dq_out, dk_out, phi, temp, base, dq, dk, dangle, dtotal, dtemp_part,
    q_b, q_t, q_h, k_b, k_t, k_h, gq_b, gq_t, gq_h, gk_b, gk_t, gk_h,
    dq_b, dq_t, dq_h, dk_b, dk_t, dk_h, p_b, p_t, p_h, temp_h,
    T, NT, N, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    VARLEN: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr, FAST: tl.constexpr,
    STORE_DANGLE: tl.constexpr, STORE_TOTAL: tl.constexpr, TEMP_GRAD: tl.constexpr, PDL: tl.constexpr = False,
):
    """dq, dk of one chunk and key-head group from the forward's outputs ``q_rot``, ``k_rot``
    (strides ``q_*``, ``k_*``); dL/dangle (the scratch, for dphi), its chunk total (for dphi
    and the offset's gradient) and the chunk's temperature partial ``Σ_t dL/dangle_t · Φ_t``."""
    await_predecessor(PDL)
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    SUB: tl.constexpr = min(ST, BT)
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b, _n, t0, t_end, valid = _chunk_span(pid_c, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT, VARLEN)
    if valid:
        rr = tl.arange(0, BR)
        mr = rr < R
        theta = tl.load(temp + hk * temp_h + rr, mask=mr, other=0.0).to(tl.float64)
        start = tl.load(base + (pid_c * Hk + hk) * R + rr, mask=mr, other=0.0)
        carry = tl.zeros([BR], dtype=tl.float64)
        total = tl.zeros([BR], dtype=tl.float64)
        part = tl.zeros([BR], dtype=tl.float64)
        for s in range(0, BT, SUB):
            t = t0 + s + tl.arange(0, SUB)
            mt = t < t_end
            m = mt[:, None] & mr[None, :]
            q1, q2 = _load_halves(q_rot, q_b, q_t, q_h, b, t, hk * G, rr, m, R, CD)
            gq1, gq2 = _load_halves(dq_out, gq_b, gq_t, gq_h, b, t, hk * G, rr, m, R, CD)
            k1, k2 = _load_halves(k_rot, k_b, k_t, k_h, b, t, hk, rr, m, R, CD)
            gk1, gk2 = _load_halves(dk_out, gk_b, gk_t, gk_h, b, t, hk, rr, m, R, CD)
            angle, local, carry = _selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, CD, FAST)
            cos, sin = _sincos(angle, PRECISE)
            d_angle = tl.zeros([SUB, BR], dtype=CD)  # stays zero on masked tokens and channels
            d_angle = _rotate_heads_bwd(
                q_rot, dq_out, dq, q_b, q_t, q_h, gq_b, gq_t, gq_h, dq_b, dq_t, dq_h, b, t, mt, hk * G, G,
                cos, sin, rr, mr, q1, q2, gq1, gq2, d_angle, R, P, BP, CD,
            )
            d_angle = _rotate_heads_bwd(
                k_rot, dk_out, dk, k_b, k_t, k_h, gk_b, gk_t, gk_h, dk_b, dk_t, dk_h, b, t, mt, hk, 1,
                cos, sin, rr, mr, k1, k2, gk1, gk2, d_angle, R, P, BP, CD,
            )
            if STORE_DANGLE:
                token = b * T + t
                m = mt[:, None] & mr[None, :]
                tl.store(dangle + (token[:, None] * Hk + hk) * R + rr[None, :], _out(d_angle, dangle), mask=m)
            if STORE_TOTAL:
                total += tl.sum(d_angle, 0).to(tl.float64)  # a float32 tile sum (float64 when F64)
            if TEMP_GRAD:
                part += tl.sum(d_angle.to(tl.float64) * (start[None, :] + local), 0)
        slot = (pid_c * Hk + hk) * R + rr
        if STORE_TOTAL:
            tl.store(dtotal + slot, total, mask=mr)
        if TEMP_GRAD:
            tl.store(dtemp_part + slot, part, mask=mr)


@triton.jit
def chunk_scan_bwd_kernel(
    dtotal, dtemp_part, carry_out, temp, doffset, dtemp_seq, temp_h, NT, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BRS: tl.constexpr, BC: tl.constexpr,
    CARRY: tl.constexpr, OFFSET_GRAD: tl.constexpr, TEMP_GRAD: tl.constexpr, VARLEN: tl.constexpr, PDL: tl.constexpr = False,
):
    """Per (sequence, key head, channel block), walking the chunks last to first: the
    suffix of dL/dangle after each chunk (``carry_out``, with ``CARRY``), ``doffset = Θ ·
    Σ dL/dangle`` and the fixed-order sum of the temperature partials (``dtemp_seq``)."""
    await_predecessor(PDL)
    TOTAL: tl.constexpr = CARRY or OFFSET_GRAD
    n, hk, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rr = rb * BRS + tl.arange(0, BRS)
    mr = rr < R
    c0, c1 = _chunk_range(n, NT, cu_chunks, VARLEN)
    carry = tl.zeros([BRS], dtype=tl.float64)
    acc = tl.zeros([BRS], dtype=tl.float64)
    i = tl.arange(0, BC)
    idx = c1 - BC + i
    ptr = (idx[:, None] * Hk + hk) * R + rr[None, :]
    m = (idx >= c0)[:, None] & mr[None, :]
    x = tl.load(dtotal + ptr, mask=m & TOTAL, other=0.0)
    # each step's chunk after it (none for the step's last: that one is in carry), so that the
    # exclusive suffix is a scan of its own and not ``inclusive - x`` (see chunk_scan_fwd_kernel)
    nxt = tl.load(dtotal + ptr + Hk * R, mask=((i < BC - 1) & (idx + 1 >= c0))[:, None] & mr[None, :] & CARRY, other=0.0)
    part = tl.load(dtemp_part + ptr, mask=m & TEMP_GRAD, other=0.0)
    for _ in range(tl.cdiv(c1 - c0, BC)):
        # loads one step ahead, as in chunk_scan_fwd_kernel
        before = idx - BC
        ptr_next = (before[:, None] * Hk + hk) * R + rr[None, :]
        m_next = (before >= c0)[:, None] & mr[None, :]
        x_next = tl.load(dtotal + ptr_next, mask=m_next & TOTAL, other=0.0)
        nxt_next = tl.load(dtotal + ptr_next + Hk * R, mask=((i < BC - 1) & (before + 1 >= c0))[:, None] & mr[None, :] & CARRY, other=0.0)
        part_next = tl.load(dtemp_part + ptr_next, mask=m_next & TEMP_GRAD, other=0.0)
        if CARRY:
            tl.store(carry_out + ptr, carry[None, :] + tl.cumsum(nxt, 0, reverse=True), mask=m)
        if TOTAL:
            carry += tl.sum(x, 0)
        if TEMP_GRAD:
            acc += tl.sum(part, 0)
        x, nxt, part, idx, ptr, m = x_next, nxt_next, part_next, before, ptr_next, m_next
    out = (n * Hk + hk) * R + rr
    if OFFSET_GRAD:
        theta = tl.load(temp + hk * temp_h + rr, mask=mr, other=0.0).to(tl.float64)
        tl.store(doffset + out, theta * carry, mask=mr)
    if TEMP_GRAD:
        tl.store(dtemp_seq + out, acc, mask=mr)


@triton.jit
def dphi_kernel(
    dangle, carry, temp, dphi, d_b, d_t, d_h, temp_h, T, NT, N, S, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, CPP: tl.constexpr, HPP: tl.constexpr, BR: tl.constexpr,
    VARLEN: tl.constexpr, PDL: tl.constexpr = False,
):
    """``dφ_t = Θ · Σ_{s ≥ t, same sequence} dL/dangle_s`` for ``CPP`` chunks and ``HPP`` key
    heads at once: each chunk's tokens last to first, a running suffix (float32 unless
    float64) plus the float64 carry from later chunks rounded to float32 once. (One load of
    a 16-token tile with the suffix summed within each thread was slower: it needs 141-215
    registers against 38.)"""
    await_predecessor(PDL)
    slots, b, t0, t_end, valid, h, r, mc, slot_ch, ms = _light_block(
        tl.program_id(0), tl.program_id(1), S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, Hk, R, BT, CPP, HPP, BR, VARLEN)
    after = tl.load(carry + slot_ch, mask=ms & valid[:, None], other=0.0)
    theta = tl.load(temp + h * temp_h + r, mask=mc, other=0.0)
    CD: tl.constexpr = tl.float64 if dangle.dtype.element_ty == tl.float64 else tl.float32
    after, theta = after.to(CD), theta.to(CD)[None, :]
    rows = dangle + (b[:, None] * T * Hk + h[None, :]) * R + r[None, :]
    out = dphi + b[:, None] * d_b + (h * d_h + r)[None, :]
    suffix = tl.zeros(slot_ch.shape, dtype=CD)
    for step in range(0, BT, LIGHT_UNROLL):
        for i in tl.static_range(min(BT, LIGHT_UNROLL)):
            t = t0 + (BT - 1 - step - i)
            m = (valid & (t < t_end))[:, None] & mc[None, :]
            suffix += tl.load(rows + t[:, None] * (Hk * R), mask=m, other=0.0).to(CD)
            tl.store(out + t[:, None] * d_t, _out(theta * (suffix + after), dphi), mask=m)


@triton.jit
def _rope_angles(pos, inv_freq, s_b, s_t, b, t, mt, rr, mr, CD: tl.constexpr):
    """Fixed-RoPE angles ``wrap(position · inv_freq)`` formed in float64, and the positions."""
    p = tl.load(pos + b * s_b + t * s_t, mask=mt, other=0).to(tl.float64)
    f = tl.load(inv_freq + rr, mask=mr, other=0.0).to(tl.float64)
    return _wrap(p[:, None] * f[None, :]).to(CD), p


@triton.jit
def rope_fwd_kernel(
    q, k, pos, inv_freq, q_out, k_out,
    q_b, q_t, q_h, k_b, k_t, k_h, qo_b, qo_t, qo_h, ko_b, ko_t, ko_h, s_b, s_t, T, NT,
    G: tl.constexpr, R: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, ST: tl.constexpr,
    BR: tl.constexpr, BP: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr, PDL: tl.constexpr = False,
):
    """Fixed RoPE over one chunk: key head ``hk`` and its query-head group."""
    await_predecessor(PDL)
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    SUB: tl.constexpr = min(ST, BT)
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b = (pid_c // NT).to(tl.int64)
    rr = tl.arange(0, BR)
    mr = rr < R
    for s in range(0, BT, SUB):
        t = (pid_c % NT).to(tl.int64) * BT + s + tl.arange(0, SUB)
        mt = t < T
        m = mt[:, None] & mr[None, :]
        q1, q2 = _load_halves(q, q_b, q_t, q_h, b, t, hk * G, rr, m, R, CD)
        k1, k2 = _load_halves(k, k_b, k_t, k_h, b, t, hk, rr, m, R, CD)
        angle, _positions = _rope_angles(pos, inv_freq, s_b, s_t, b, t, mt, rr, mr, CD)
        cos, sin = _sincos(angle, PRECISE)
        _rotate_heads_fwd(q, q_out, q_b, q_t, q_h, qo_b, qo_t, qo_h, b, t, mt, hk * G, G, cos, sin, rr, mr, q1, q2, R, P, BP, CD)
        _rotate_heads_fwd(k, k_out, k_b, k_t, k_h, ko_b, ko_t, ko_h, b, t, mt, hk, 1, cos, sin, rr, mr, k1, k2, R, P, BP, CD)


@triton.jit
def rope_bwd_kernel(
    q_rot, k_rot, dq_out, dk_out, pos, inv_freq, dq, dk, dfreq_part,
    q_b, q_t, q_h, k_b, k_t, k_h, gq_b, gq_t, gq_h, gk_b, gk_t, gk_h,
    dq_b, dq_t, dq_h, dk_b, dk_t, dk_h, s_b, s_t, T, NT,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    F64: tl.constexpr, PRECISE: tl.constexpr, FREQ_GRAD: tl.constexpr, PDL: tl.constexpr = False,
):
    """Fixed RoPE backward from the forward's outputs ``q_rot``, ``k_rot``: inverse rotation;
    with ``FREQ_GRAD`` also the chunk's ``Σ_t dL/dangle_t · position_t`` per frequency
    (float64 partials)."""
    await_predecessor(PDL)
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    SUB: tl.constexpr = min(ST, BT)
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b = (pid_c // NT).to(tl.int64)
    rr = tl.arange(0, BR)
    mr = rr < R
    part = tl.zeros([BR], dtype=tl.float64)
    for s in range(0, BT, SUB):
        t = (pid_c % NT).to(tl.int64) * BT + s + tl.arange(0, SUB)
        mt = t < T
        m = mt[:, None] & mr[None, :]
        q1, q2 = _load_halves(q_rot, q_b, q_t, q_h, b, t, hk * G, rr, m, R, CD)
        gq1, gq2 = _load_halves(dq_out, gq_b, gq_t, gq_h, b, t, hk * G, rr, m, R, CD)
        k1, k2 = _load_halves(k_rot, k_b, k_t, k_h, b, t, hk, rr, m, R, CD)
        gk1, gk2 = _load_halves(dk_out, gk_b, gk_t, gk_h, b, t, hk, rr, m, R, CD)
        angle, p = _rope_angles(pos, inv_freq, s_b, s_t, b, t, mt, rr, mr, CD)
        cos, sin = _sincos(angle, PRECISE)
        d_angle = tl.zeros([SUB, BR], dtype=CD)
        d_angle = _rotate_heads_bwd(
            q_rot, dq_out, dq, q_b, q_t, q_h, gq_b, gq_t, gq_h, dq_b, dq_t, dq_h, b, t, mt, hk * G, G,
            cos, sin, rr, mr, q1, q2, gq1, gq2, d_angle, R, P, BP, CD,
        )
        d_angle = _rotate_heads_bwd(
            k_rot, dk_out, dk, k_b, k_t, k_h, gk_b, gk_t, gk_h, dk_b, dk_t, dk_h, b, t, mt, hk, 1,
            cos, sin, rr, mr, k1, k2, gk1, gk2, d_angle, R, P, BP, CD,
        )
        if FREQ_GRAD:
            part += tl.sum(d_angle.to(tl.float64) * p[:, None], 0)
    if FREQ_GRAD:
        tl.store(dfreq_part + (pid_c * Hk + hk) * R + rr, part, mask=mr)
