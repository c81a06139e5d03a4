"""Variants of the Selective RoPE rotation kernels, each timed alone (stop 19's measurement).

At 8x4096x4x128 bf16 (dense, G = 1, the 16-bit fast path): the kernels as they shipped at
stop 18 (with and without ``maxnreg``), and stand-alone copies that load q/k (and the
output gradients) before or after forming the angles, with one or two dL/dangle
accumulators, with or without the scratch store and the chunk totals, 4 or 8 warps; the
light dphi kernel against an elementwise variant; a torch copy for the bandwidth
reference. ``triton.testing.do_bench`` medians (L2 flushed), registers and spills; JSON
lines on stdout. The H200 run is ``benchmarks/results/rotation_variants_h200.jsonl``
(torch 2.11.0+cu130, Triton 3.6.0). The variant kernels are copies for measurement only;
what won (loads first, no ``maxnreg``) is in ``srope.ops.triton.kernels``.

    python benchmarks/rotation_variants.py [B T H D]
"""
import json
import sys

import torch
import triton
import triton.language as tl

from srope.ops import reference
from srope.ops.triton import kernels as K
from srope.ops.triton import ops


@triton.jit
def _load_pair(ptr, row, h, h_stride, rr, m, R: tl.constexpr):
    p = ptr + row + h * h_stride
    return tl.load(p + rr[None, :], mask=m, other=0.0).to(tl.float32), tl.load(p + R + rr[None, :], mask=m, other=0.0).to(tl.float32)


@triton.jit
def _tile(pid_c, T, NT, s_b, s_t, R: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr):
    """Batch row, tokens, masks and row offsets of chunk ``pid_c`` (dense batches)."""
    b = (pid_c // NT).to(tl.int64)
    t = (pid_c % NT).to(tl.int64) * BT + tl.arange(0, BT)
    mt = t < T
    rr = tl.arange(0, BR)
    mr = rr < R
    return b, t, mt, rr, mr, mt[:, None] & mr[None, :], b * s_b + t[:, None] * s_t


@triton.jit
def _angles(phi, temp, base, p_b, p_t, p_h, b, t, mt, pid_c, hk, rr, mr,
            Hk: tl.constexpr, R: tl.constexpr, BR: tl.constexpr, PRECISE: tl.constexpr):
    """cos and sin of the chunk's angles, as the shipped kernels form them (fast path)."""
    theta = tl.load(temp + rr, mask=mr, other=0.0).to(tl.float64)
    start = tl.load(base + (pid_c * Hk + hk) * R + rr, mask=mr, other=0.0)
    carry = tl.zeros([BR], dtype=tl.float64)
    angle, _local, _carry = K._selective_angles(phi, p_b, p_t, p_h, b, t, mt, hk, rr, mr, theta, start, carry, tl.float32, True)
    return K._sincos(angle, PRECISE)


@triton.jit
def bwd_x(
    q, k, dq_out, dk_out, phi, temp, base, dq, dk, dangle, dtotal,
    T, NT, s_b, s_t, s_h, p_b, p_t, p_h,
    Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr,
    ONE_ACC: tl.constexpr, STORE: tl.constexpr, TOTAL: tl.constexpr, PRELOAD: tl.constexpr, PRECISE: tl.constexpr,
):
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b, t, mt, rr, mr, m, row = _tile(pid_c, T, NT, s_b, s_t, R, BT, BR)
    if PRELOAD:
        qx1, qx2 = _load_pair(q, row, hk, s_h, rr, m, R)
        qg1, qg2 = _load_pair(dq_out, row, hk, s_h, rr, m, R)
        kx1, kx2 = _load_pair(k, row, hk, s_h, rr, m, R)
        kg1, kg2 = _load_pair(dk_out, row, hk, s_h, rr, m, R)
    cos, sin = _angles(phi, temp, base, p_b, p_t, p_h, b, t, mt, pid_c, hk, rr, mr, Hk, R, BR, PRECISE)
    if not PRELOAD:
        qx1, qx2 = _load_pair(q, row, hk, s_h, rr, m, R)
        qg1, qg2 = _load_pair(dq_out, row, hk, s_h, rr, m, R)
    pd = dq + row + hk * s_h
    tl.store(pd + rr[None, :], (qg1 * cos + qg2 * sin).to(dq.dtype.element_ty), mask=m)
    tl.store(pd + R + rr[None, :], (qg2 * cos - qg1 * sin).to(dq.dtype.element_ty), mask=m)
    if not PRELOAD:
        kx1, kx2 = _load_pair(k, row, hk, s_h, rr, m, R)
        kg1, kg2 = _load_pair(dk_out, row, hk, s_h, rr, m, R)
    pd = dk + row + hk * s_h
    tl.store(pd + rr[None, :], (kg1 * cos + kg2 * sin).to(dk.dtype.element_ty), mask=m)
    tl.store(pd + R + rr[None, :], (kg2 * cos - kg1 * sin).to(dk.dtype.element_ty), mask=m)
    if STORE > 0 or TOTAL:
        if ONE_ACC:
            d = cos * (qg2 * qx1 - qg1 * qx2 + kg2 * kx1 - kg1 * kx2) - sin * (qg1 * qx1 + qg2 * qx2 + kg1 * kx1 + kg2 * kx2)
        else:
            a = qg2 * qx1 - qg1 * qx2
            bb = qg1 * qx1 + qg2 * qx2
            a += kg2 * kx1 - kg1 * kx2
            bb += kg1 * kx1 + kg2 * kx2
            d = cos * a - sin * bb
        token = b * T + t
        if STORE == 1:
            tl.store(dangle + (token[:, None] * Hk + hk) * R + rr[None, :], d, mask=m)
        if STORE == 2:
            tl.store(dangle + (token[:, None] * Hk + hk) * R + rr[None, :], tl.cumsum(d, 0, reverse=True), mask=m)
        if TOTAL:
            tl.store(dtotal + (pid_c * Hk + hk) * R + rr, tl.sum(d, 0).to(tl.float64), mask=mr)


@triton.jit
def fwd_x(
    q, k, phi, temp, base, q_out, k_out, T, NT, s_b, s_t, s_h, p_b, p_t, p_h,
    Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr, PRELOAD: tl.constexpr, PRECISE: tl.constexpr,
):
    pid_c, hk = tl.program_id(0), tl.program_id(1)
    b, t, mt, rr, mr, m, row = _tile(pid_c, T, NT, s_b, s_t, R, BT, BR)
    if PRELOAD:
        qx1, qx2 = _load_pair(q, row, hk, s_h, rr, m, R)
        kx1, kx2 = _load_pair(k, row, hk, s_h, rr, m, R)
    cos, sin = _angles(phi, temp, base, p_b, p_t, p_h, b, t, mt, pid_c, hk, rr, mr, Hk, R, BR, PRECISE)
    if not PRELOAD:
        qx1, qx2 = _load_pair(q, row, hk, s_h, rr, m, R)
        kx1, kx2 = _load_pair(k, row, hk, s_h, rr, m, R)
    pd = q_out + row + hk * s_h
    tl.store(pd + rr[None, :], (qx1 * cos - qx2 * sin).to(q_out.dtype.element_ty), mask=m)
    tl.store(pd + R + rr[None, :], (qx1 * sin + qx2 * cos).to(q_out.dtype.element_ty), mask=m)
    pd = k_out + row + hk * s_h
    tl.store(pd + rr[None, :], (kx1 * cos - kx2 * sin).to(k_out.dtype.element_ty), mask=m)
    tl.store(pd + R + rr[None, :], (kx1 * sin + kx2 * cos).to(k_out.dtype.element_ty), mask=m)


@triton.jit
def dphi_add(local, carry, temp, dphi, N_EL, Hk: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, BLOCK: tl.constexpr):
    """dphi = Θ (local suffix + carry of the chunk), elementwise over [B*T, Hk, R]."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N_EL
    ch = i % (Hk * R)
    token = i // (Hk * R)
    slot = token // BT
    x = tl.load(local + i, mask=m, other=0.0)
    c = tl.load(carry + slot * (Hk * R) + ch, mask=m, other=0.0)
    th = tl.load(temp + ch % R, mask=m, other=0.0)
    tl.store(dphi + i, (th * (x + c.to(tl.float32))).to(dphi.dtype.element_ty), mask=m)


def main():
    out = []
    B, T, H, D = (int(v) for v in (sys.argv[1:] or ["8", "4096", "4", "128"]))
    R = D // 2
    BT = 16
    NT = triton.cdiv(T, BT)
    g = torch.Generator().manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, gq, gk = (torch.randn(B, T, H, D, generator=g).to(dev).bfloat16() for _ in range(4))
    phi = (torch.rand(B, T, H, R, generator=g) * 2).to(dev).bfloat16()
    temp = reference.rope_inverse_frequencies(D, 500000.0).to(dev).float()
    _qo, _ko, _final, base = ops.selective_rope_fwd(q, k, phi, temp, None, None, None, None, BT)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dangle = torch.empty(B * T, H, R, device=dev)
    dtotal = torch.empty(B * NT, H, R, device=dev, dtype=torch.float64)
    grid = (B * NT, H)
    floor_bytes = {"bwd": 6 * q.numel() * 2 + phi.numel() * 2, "fwd": 4 * q.numel() * 2 + phi.numel() * 2}

    def record(name, fn, nbytes, compiled=None):
        ms = triton.testing.do_bench(fn, warmup=20, rep=200) if q.is_cuda else 1.0
        row = {"name": name, "ms": round(ms, 5), "tb_s": round(nbytes / ms / 1e9, 3)}
        if compiled is not None:
            row |= {"regs": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None)}
        out.append(row)
        print(json.dumps(row), flush=True)

    # shipped kernels
    meta = ops._selective_meta(q, k, R, BT, phi, temp)
    common = dict(Hk=H, VARLEN=False, **meta)
    tbl = (base, base, base)

    def ship_bwd(store):
        return K.srope_bwd_kernel[grid](
            _qo, _ko, gq, gk, phi, temp, base, dq, dk, dangle, dtotal, dtotal,  # the shipped backward reads the outputs
            *ops._bth(_qo), *ops._bth(_ko), *ops._bth(gq), *ops._bth(gk), *ops._bth(dq), *ops._bth(dk), *ops._bth(phi), 0,
            T, NT, B, *tbl, STORE_DANGLE=store, STORE_TOTAL=store, TEMP_GRAD=False, **common)

    for store in (True, False):
        c = ship_bwd(store)
        record(f"ship_bwd store={store}", lambda store=store: ship_bwd(store), floor_bytes["bwd"] + (dangle.numel() * 4 if store else 0) - phi.numel() * 2, c)
    for nreg in (None, 128, 168, 255):
        extra = {} if nreg is None else {"maxnreg": nreg}
        fn = lambda extra=extra: K.srope_fwd_kernel[grid](  # noqa: E731
            q, k, phi, temp, base, _qo, _ko, *ops._bth(q), *ops._bth(k), *ops._bth(_qo), *ops._bth(_ko), *ops._bth(phi), 0,
            T, NT, B, *tbl, **common, **extra)
        record(f"ship_fwd maxnreg={nreg}", fn, floor_bytes["fwd"], fn())
        fnb = lambda extra=extra: K.srope_bwd_kernel[grid](  # noqa: E731
            _qo, _ko, gq, gk, phi, temp, base, dq, dk, dangle, dtotal, dtotal,  # the shipped backward reads the outputs
            *ops._bth(_qo), *ops._bth(_ko), *ops._bth(gq), *ops._bth(gk), *ops._bth(dq), *ops._bth(dk), *ops._bth(phi), 0,
            T, NT, B, *tbl, STORE_DANGLE=True, STORE_TOTAL=True, TEMP_GRAD=False, **common, **extra)
        record(f"ship_bwd maxnreg={nreg}", fnb, floor_bytes["bwd"] + dangle.numel() * 4 - phi.numel() * 2, fnb())

    strides = (*ops._bth(q), *ops._bth(phi))
    reference_dq = None
    for one_acc in (False, True):
        for store, total in ((1, True), (0, False), (1, False), (0, True), (2, True)):
            for preload in (False, True):
                for warps in (4, 8):
                    for nreg in (None, 255):
                        extra = {} if nreg is None else {"maxnreg": nreg}
                        fn = lambda a=one_acc, s=store, tt=total, p=preload, w=warps, e=extra: bwd_x[grid](  # noqa: E731
                            q, k, gq, gk, phi, temp, base, dq, dk, dangle, dtotal, T, NT, *strides,
                            Hk=H, R=R, BT=BT, BR=R, ONE_ACC=a, STORE=s, TOTAL=tt, PRELOAD=p, PRECISE=q.is_cuda, num_warps=w, **e)
                        c = fn()
                        if store == 1 and total and reference_dq is None:
                            ship_bwd(True)
                            want = (dq.clone(), dangle.clone(), dtotal.clone())
                            fn()
                            err = [float((a - b).abs().max()) for a, b in zip((dq, dangle, dtotal), want)]
                            # (the shipped kernel forms dangle from the outputs, these variants from the
                            # inputs: their dangle agrees to the 16-bit rounding of the outputs only)
                            print("check vs shipped (max abs diff dq, dangle, dtotal):", err, flush=True)
                            reference_dq = True
                        nbytes = floor_bytes["bwd"] - phi.numel() * 2 + (dangle.numel() * 4 if store else 0)
                        record(f"bwd_x one_acc={one_acc} store={store} total={total} preload={preload} warps={warps} maxnreg={nreg}", fn, nbytes, c)
    for preload in (False, True):
        for warps in (4, 8):
            for nreg in (None, 255):
                extra = {} if nreg is None else {"maxnreg": nreg}
                fn = lambda p=preload, w=warps, e=extra: fwd_x[grid](  # noqa: E731
                    q, k, phi, temp, base, _qo, _ko, T, NT, *strides, Hk=H, R=R, BT=BT, BR=R, PRELOAD=p, PRECISE=q.is_cuda, num_warps=w, **e)
                record(f"fwd_x preload={preload} warps={warps} maxnreg={nreg}", fn, floor_bytes["fwd"], fn())

    # dphi: shipped (reverse cumsum of the raw scratch) against an elementwise add of a stored suffix
    carry = torch.zeros(B * NT, H, R, device=dev, dtype=torch.float64)
    dphi = torch.empty_like(phi)
    light = ops._light_tile(BT, R, H)
    fn = lambda: K.dphi_kernel[(triton.cdiv(B * NT, light["CPP"]), triton.cdiv(H, light["HPP"]))](  # noqa: E731
        dangle, carry, temp, dphi, *ops._bth(dphi), 0, T, NT, B, B * NT, *tbl, Hk=H, R=R, BT=BT, BR=R, VARLEN=False, **light)
    record("ship_dphi", fn, dangle.numel() * 4 + dphi.numel() * 2, fn())
    for block, warps in ((1024, 4), (2048, 4), (4096, 8), (8192, 8)):
        fn = lambda b_=block, w=warps: dphi_add[(triton.cdiv(dangle.numel(), b_),)](  # noqa: E731
            dangle, carry, temp, dphi, dangle.numel(), Hk=H, R=R, BT=BT, BLOCK=b_, num_warps=w)
        record(f"dphi_add block={block} warps={warps}", fn, dangle.numel() * 4 + dphi.numel() * 2, fn())
    # bandwidth references: a bf16 copy of q (read + write) and our RoPE forward
    dst = torch.empty_like(q)
    record("copy q (torch)", lambda: dst.copy_(q), 2 * q.numel() * 2)
    print("SUMMARY", json.dumps(out))


if __name__ == "__main__":
    main()
