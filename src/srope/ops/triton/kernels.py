"""Triton kernels of the Selective RoPE rotation (prefill/training) and of fixed RoPE.

Design (see ``ops.py`` for the launches):

- Time is cut into chunks of ``BT`` tokens that never straddle a sequence: dense batches
  have ``cdiv(T, BT)`` chunks per row; packed batches (``cu_seqlens``) number the chunks
  of each sequence in turn (``cu_chunks``) and map every chunk slot to its sequence
  (``chunk_seq``; slots past the last chunk hold ``N`` and exit at once). A rotation
  program walks its chunk in sub-tiles of ``ST`` tokens carrying the chunk-local phase in
  float64; on the GPU the chunk is one sub-tile (``ops.py`` says why). The light kernels
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
  store it (float32 scratch), its chunk totals, and the chunk's temperature partial
  ``Σ_t dL/dangle_t · Φ_t`` (float64); (2) ``chunk_scan_bwd``: reverse exclusive scan of
  the chunk totals per sequence (the suffix carried into each chunk), the offset gradient
  ``Θ · Σ_t dL/dangle_t`` and the fixed-order sum of the temperature partials; (3)
  ``dphi``: ``Θ · (local reverse cumsum + carry)``. No atomics: bitwise deterministic.
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

TWO_PI = tl.constexpr(2.0 * math.pi)
INV_TWO_PI = tl.constexpr(1.0 / (2.0 * math.pi))
# Read when the kernels are decorated, like Triton's own interpreter switch.
INTERPRETER = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


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
def _rotate_heads_fwd(
    src, dst, s_b, s_t, s_h, d_b, d_t, d_h, b, t, mt, h0, NH, cos, sin, rr, mr,
    R: tl.constexpr, P: tl.constexpr, BP: tl.constexpr, CD: tl.constexpr,
):
    """Rotate heads ``h0 .. h0+NH-1`` of ``src`` by (cos, sin) ``[BT, BR]`` into ``dst``."""
    m = mt[:, None] & mr[None, :]
    row_s = b * s_b + t[:, None] * s_t
    row_d = b * d_b + t[:, None] * d_t
    for g in range(NH):
        h = h0 + g
        ps = src + row_s + h * s_h
        pd = dst + row_d + h * d_h
        x1 = tl.load(ps + rr[None, :], mask=m, other=0.0).to(CD)
        x2 = tl.load(ps + R + rr[None, :], mask=m, other=0.0).to(CD)
        tl.store(pd + rr[None, :], _out(x1 * cos - x2 * sin, dst), mask=m)
        tl.store(pd + R + rr[None, :], _out(x1 * sin + x2 * cos, dst), mask=m)
        if P > 0:
            rp = tl.arange(0, BP)
            mp = mt[:, None] & (rp < P)[None, :]
            rest = tl.load(ps + 2 * R + rp[None, :], mask=mp, other=0.0)
            tl.store(pd + 2 * R + rp[None, :], _out(rest, dst), mask=mp)


@triton.jit
def _rotate_heads_bwd(
    x_ptr, g_ptr, dx_ptr, x_b, x_t, x_h, g_b, g_t, g_h, d_b, d_t, d_h, b, t, mt, h0, NH, cos, sin, rr, mr,
    acc_a, acc_b, R: tl.constexpr, P: tl.constexpr, BP: tl.constexpr, CD: tl.constexpr,
):
    """Inverse-rotate the gradients of heads ``h0 ..``; accumulate, per pair,
    ``a += g2·x1 - g1·x2`` and ``b += g1·x1 + g2·x2`` (then dL/dangle = cos·a - sin·b)."""
    m = mt[:, None] & mr[None, :]
    row_x = b * x_b + t[:, None] * x_t
    row_g = b * g_b + t[:, None] * g_t
    row_d = b * d_b + t[:, None] * d_t
    for j in range(NH):
        h = h0 + j
        px = x_ptr + row_x + h * x_h
        pg = g_ptr + row_g + h * g_h
        pd = dx_ptr + row_d + h * d_h
        x1 = tl.load(px + rr[None, :], mask=m, other=0.0).to(CD)
        x2 = tl.load(px + R + rr[None, :], mask=m, other=0.0).to(CD)
        g1 = tl.load(pg + rr[None, :], mask=m, other=0.0).to(CD)
        g2 = tl.load(pg + R + rr[None, :], mask=m, other=0.0).to(CD)
        tl.store(pd + rr[None, :], _out(g1 * cos + g2 * sin, dx_ptr), mask=m)
        tl.store(pd + R + rr[None, :], _out(g2 * cos - g1 * sin, dx_ptr), mask=m)
        acc_a += g2 * x1 - g1 * x2
        acc_b += g1 * x1 + g2 * x2
        if P > 0:
            rp = tl.arange(0, BP)
            mp = mt[:, None] & (rp < P)[None, :]
            rest = tl.load(pg + 2 * R + rp[None, :], mask=mp, other=0.0)
            tl.store(pd + 2 * R + rp[None, :], _out(rest, dx_ptr), mask=mp)
    return acc_a, acc_b


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
    """Chunk slots ``[CPP]``, batch rows, tokens ``[CPP, BT]``, heads and pairs ``[HPP·BR]``
    and the masks of one light-kernel program: ``CPP`` chunks × ``HPP`` key heads, so that
    a program reads whole contiguous rows of ``[.., Hk, R]`` tensors."""
    slots = pid * CPP + tl.arange(0, CPP)
    b, t0, t_end, valid = _chunk_spans(slots, S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, BT, VARLEN)
    c = tl.arange(0, HPP * BR)
    h, r = hb * HPP + c // BR, c % BR
    mc = (h < Hk) & (r < R)
    t = t0[:, None] + tl.arange(0, BT)[None, :]
    m = (valid[:, None] & (t < t_end[:, None]))[:, :, None] & mc[None, None, :]
    slot_ch = (slots[:, None] * Hk + h[None, :]) * R + r[None, :]  # [CPP, HPP·BR] offsets in per-chunk tensors
    ms = (slots < S)[:, None] & mc[None, :]
    return slots, b, t, h, r, m, valid, slot_ch, ms


@triton.jit
def chunk_sum_kernel(
    phi, sums, base, p_b, p_t, p_h, T, NT, N, S, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, CPP: tl.constexpr, HPP: tl.constexpr, BR: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """``sums[c, hk, :] = Σ_{t in chunk c} φ_t`` in float64 for ``CPP`` chunks and ``HPP``
    key heads at once (a program per chunk and head would be too small to keep loads in
    flight); unused slots of a packed batch get ``base = 0`` (so that every element of the
    saved ``base`` is defined)."""
    slots, b, t, h, r, m, valid, slot_ch, ms = _light_block(
        tl.program_id(0), tl.program_id(1), S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, Hk, R, BT, CPP, HPP, BR, VARLEN)
    x = tl.load(phi + b[:, None, None] * p_b + t[:, :, None] * p_t + (h * p_h + r)[None, None, :], mask=m, other=0.0)
    tl.store(sums + slot_ch, tl.sum(x.to(tl.float64), 1), mask=ms & valid[:, None])
    tl.store(base + slot_ch, tl.zeros(slot_ch.shape, dtype=tl.float64), mask=ms & ~valid[:, None])


@triton.jit
def chunk_scan_fwd_kernel(
    sums, base, offset, final, NT, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BRS: tl.constexpr, BC: tl.constexpr,
    HAS_OFFSET: tl.constexpr, VARLEN: tl.constexpr,
):
    """Per (sequence, key head, channel block): exclusive float64 scan of the chunk sums
    from the offset (``base``), and the final phase."""
    n, hk, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rr = rb * BRS + tl.arange(0, BRS)
    mr = rr < R
    c0, c1 = _chunk_range(n, NT, cu_chunks, VARLEN)
    if HAS_OFFSET:
        carry = tl.load(offset + (n * Hk + hk) * R + rr, mask=mr, other=0.0).to(tl.float64)
    else:
        carry = tl.zeros([BRS], dtype=tl.float64)
    for j in range(tl.cdiv(c1 - c0, BC)):
        idx = c0 + j * BC + tl.arange(0, BC)
        m = (idx < c1)[:, None] & mr[None, :]
        ptr = (idx[:, None] * Hk + hk) * R + rr[None, :]
        x = tl.load(sums + ptr, mask=m, other=0.0)
        tl.store(base + ptr, carry[None, :] + (tl.cumsum(x, 0) - x), mask=m)
        carry += tl.sum(x, 0)
    tl.store(final + (n * Hk + hk) * R + rr, carry, mask=mr)


@triton.jit
def srope_fwd_kernel(
    q, k, phi, temp, base, q_out, k_out,
    q_b, q_t, q_h, k_b, k_t, k_h, qo_b, qo_t, qo_h, ko_b, ko_t, ko_h, p_b, p_t, p_h, temp_h,
    T, NT, N, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    VARLEN: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr, FAST: tl.constexpr,
):
    """Rotate key head ``hk`` and query heads ``hk·G .. hk·G+G-1`` over one chunk."""
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
            angle, _local, carry = _selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, CD, FAST)
            cos, sin = _sincos(angle, PRECISE)
            _rotate_heads_fwd(q, q_out, q_b, q_t, q_h, qo_b, qo_t, qo_h, b, t, mt, hk * G, G, cos, sin, rr, mr, R, P, BP, CD)
            _rotate_heads_fwd(k, k_out, k_b, k_t, k_h, ko_b, ko_t, ko_h, b, t, mt, hk, 1, cos, sin, rr, mr, R, P, BP, CD)


@triton.jit
def srope_bwd_kernel(
    q, k, dq_out, dk_out, phi, temp, base, dq, dk, dangle, dtotal, dtemp_part,
    q_b, q_t, q_h, k_b, k_t, k_h, gq_b, gq_t, gq_h, gk_b, gk_t, gk_h,
    dq_b, dq_t, dq_h, dk_b, dk_t, dk_h, p_b, p_t, p_h, temp_h,
    T, NT, N, cu_seqlens, chunk_seq, cu_chunks,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    VARLEN: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr, FAST: tl.constexpr,
    STORE_DANGLE: tl.constexpr, TEMP_GRAD: tl.constexpr,
):
    """dq, dk of one chunk and key-head group; dL/dangle (scratch + chunk total) and the
    chunk's temperature partial ``Σ_t dL/dangle_t · Φ_t``."""
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
            angle, local, carry = _selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, CD, FAST)
            cos, sin = _sincos(angle, PRECISE)
            acc_a = tl.zeros([SUB, BR], dtype=CD)
            acc_b = tl.zeros([SUB, BR], dtype=CD)
            acc_a, acc_b = _rotate_heads_bwd(
                q, dq_out, dq, q_b, q_t, q_h, gq_b, gq_t, gq_h, dq_b, dq_t, dq_h, b, t, mt, hk * G, G,
                cos, sin, rr, mr, acc_a, acc_b, R, P, BP, CD,
            )
            acc_a, acc_b = _rotate_heads_bwd(
                k, dk_out, dk, k_b, k_t, k_h, gk_b, gk_t, gk_h, dk_b, dk_t, dk_h, b, t, mt, hk, 1,
                cos, sin, rr, mr, acc_a, acc_b, R, P, BP, CD,
            )
            d_angle = cos * acc_a - sin * acc_b  # zero on masked tokens and channels
            if STORE_DANGLE:
                token = b * T + t
                m = mt[:, None] & mr[None, :]
                tl.store(dangle + (token[:, None] * Hk + hk) * R + rr[None, :], d_angle, mask=m)
                total += tl.sum(d_angle, 0).to(tl.float64)  # a float32 tile sum (float64 when F64)
            if TEMP_GRAD:
                part += tl.sum(d_angle.to(tl.float64) * (start[None, :] + local), 0)
        slot = (pid_c * Hk + hk) * R + rr
        if STORE_DANGLE:
            tl.store(dtotal + slot, total, mask=mr)
        if TEMP_GRAD:
            tl.store(dtemp_part + slot, part, mask=mr)


@triton.jit
def chunk_scan_bwd_kernel(
    dtotal, dtemp_part, carry_out, temp, doffset, dtemp_seq, temp_h, NT, cu_chunks,
    Hk: tl.constexpr, R: tl.constexpr, BRS: tl.constexpr, BC: tl.constexpr,
    CARRY: tl.constexpr, OFFSET_GRAD: tl.constexpr, TEMP_GRAD: tl.constexpr, VARLEN: tl.constexpr,
):
    """Per (sequence, key head, channel block), walking the chunks last to first: the
    suffix of dL/dangle after each chunk (``carry_out``), ``doffset = Θ · Σ dL/dangle``
    and the fixed-order sum of the temperature partials (``dtemp_seq``)."""
    n, hk, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rr = rb * BRS + tl.arange(0, BRS)
    mr = rr < R
    c0, c1 = _chunk_range(n, NT, cu_chunks, VARLEN)
    carry = tl.zeros([BRS], dtype=tl.float64)
    acc = tl.zeros([BRS], dtype=tl.float64)
    for j in range(tl.cdiv(c1 - c0, BC)):
        idx = c1 - (j + 1) * BC + tl.arange(0, BC)
        m = (idx >= c0)[:, None] & mr[None, :]
        ptr = (idx[:, None] * Hk + hk) * R + rr[None, :]
        if CARRY:
            x = tl.load(dtotal + ptr, mask=m, other=0.0)
            tl.store(carry_out + ptr, carry[None, :] + (tl.cumsum(x, 0, reverse=True) - x), mask=m)
            carry += tl.sum(x, 0)
        if TEMP_GRAD:
            acc += tl.sum(tl.load(dtemp_part + ptr, mask=m, other=0.0), 0)
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
    VARLEN: tl.constexpr,
):
    """``dφ_t = Θ · Σ_{s ≥ t, same sequence} dL/dangle_s`` for ``CPP`` chunks and ``HPP`` key
    heads at once: each chunk's reverse cumsum (float32 unless float64) plus the float64
    carry from later chunks, rounded to float32 once."""
    slots, b, t, h, r, m, valid, slot_ch, ms = _light_block(
        tl.program_id(0), tl.program_id(1), S, T, NT, N, cu_seqlens, chunk_seq, cu_chunks, Hk, R, BT, CPP, HPP, BR, VARLEN)
    token = b[:, None] * T + t
    x = tl.load(dangle + (token[:, :, None] * Hk + h[None, None, :]) * R + r[None, None, :], mask=m, other=0.0)
    after = tl.load(carry + slot_ch, mask=ms & valid[:, None], other=0.0)
    theta = tl.load(temp + h * temp_h + r, mask=(h < Hk) & (r < R), other=0.0)
    if x.dtype == tl.float64:
        suffix = tl.cumsum(x, 1, reverse=True) + after[:, None, :]
        theta = theta.to(tl.float64)
    else:
        suffix = tl.cumsum(x, 1, reverse=True) + after.to(tl.float32)[:, None, :]
        theta = theta.to(tl.float32)
    out = dphi + b[:, None, None] * d_b + t[:, :, None] * d_t + (h * d_h + r)[None, None, :]
    tl.store(out, _out(theta[None, None, :] * suffix, dphi), mask=m)


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
    BR: tl.constexpr, BP: tl.constexpr, F64: tl.constexpr, PRECISE: tl.constexpr,
):
    """Fixed RoPE over one chunk: key head ``hk`` and its query-head group."""
    CD: tl.constexpr = tl.float64 if F64 else tl.float32
    SUB: tl.constexpr = min(ST, BT)
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b = (pid_c // NT).to(tl.int64)
    rr = tl.arange(0, BR)
    mr = rr < R
    for s in range(0, BT, SUB):
        t = (pid_c % NT).to(tl.int64) * BT + s + tl.arange(0, SUB)
        mt = t < T
        angle, _positions = _rope_angles(pos, inv_freq, s_b, s_t, b, t, mt, rr, mr, CD)
        cos, sin = _sincos(angle, PRECISE)
        _rotate_heads_fwd(q, q_out, q_b, q_t, q_h, qo_b, qo_t, qo_h, b, t, mt, hk * G, G, cos, sin, rr, mr, R, P, BP, CD)
        _rotate_heads_fwd(k, k_out, k_b, k_t, k_h, ko_b, ko_t, ko_h, b, t, mt, hk, 1, cos, sin, rr, mr, R, P, BP, CD)


@triton.jit
def rope_bwd_kernel(
    q, k, dq_out, dk_out, pos, inv_freq, dq, dk, dfreq_part,
    q_b, q_t, q_h, k_b, k_t, k_h, gq_b, gq_t, gq_h, gk_b, gk_t, gk_h,
    dq_b, dq_t, dq_h, dk_b, dk_t, dk_h, s_b, s_t, T, NT,
    Hk: tl.constexpr, G: tl.constexpr, R: tl.constexpr, P: tl.constexpr,
    BT: tl.constexpr, ST: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
    F64: tl.constexpr, PRECISE: tl.constexpr, FREQ_GRAD: tl.constexpr,
):
    """Fixed RoPE backward: inverse rotation; with ``FREQ_GRAD`` also the chunk's
    ``Σ_t dL/dangle_t · position_t`` per frequency (float64 partials)."""
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
        angle, p = _rope_angles(pos, inv_freq, s_b, s_t, b, t, mt, rr, mr, CD)
        cos, sin = _sincos(angle, PRECISE)
        acc_a = tl.zeros([SUB, BR], dtype=CD)
        acc_b = tl.zeros([SUB, BR], dtype=CD)
        acc_a, acc_b = _rotate_heads_bwd(
            q, dq_out, dq, q_b, q_t, q_h, gq_b, gq_t, gq_h, dq_b, dq_t, dq_h, b, t, mt, hk * G, G,
            cos, sin, rr, mr, acc_a, acc_b, R, P, BP, CD,
        )
        acc_a, acc_b = _rotate_heads_bwd(
            k, dk_out, dk, k_b, k_t, k_h, gk_b, gk_t, gk_h, dk_b, dk_t, dk_h, b, t, mt, hk, 1,
            cos, sin, rr, mr, acc_a, acc_b, R, P, BP, CD,
        )
        if FREQ_GRAD:
            part += tl.sum((cos * acc_a - sin * acc_b).to(tl.float64) * p[:, None], 0)
    if FREQ_GRAD:
        tl.store(dfreq_part + (pid_c * Hk + hk) * R + rr, part, mask=mr)
