"""How precisely can the cumulative phase be kept without float64? Errors at 2^20 tokens, on the CPU.

The increments φ are those of srope's ``SelectiveRoPE`` generator at initialisation (the paper's LM
setting: full-rank weight-normed projection, conv 4 + SiLU, per-head gate, rope spectrum θ = 500000,
largest temperature 1) on random hidden states, rounded to float32 as a model makes them. Every
variant below is emulated with numpy in the arithmetic a GPU kernel would use; the reference is the
same sum in long double (x87 80-bit) and the angle Θ·Φ reduced modulo 2π there, Θ being the float32
temperatures the op is given (their own rounding is the model's definition, not an error of the op):

- ``float32``: one running float32 sum per channel; angle = Θ·Φ in float32, reduced in float32.
- ``kahan32``: Kahan-compensated float32 sum; the phase is then one float32 (its compensation lost
  when it is stored), angle as ``float32``.
- ``chunk32+f64``: float32 scan inside chunks of 64 tokens, chunk sums in float64 and carried in
  float64; angle = wrap(Θ·carry) in float64 plus Θ·local in float32 (srope's kernels for 16-bit q/k).
- ``chunk32+2f32``: the same with the chunk sums and the carry as float32 pairs (TwoSum, no float64
  anywhere); angle =
  Θ·carry as an exact float32 pair (FMA two-product), reduced by a three-part Cody–Waite 2π with FMAs,
  plus Θ·local.
- ``float64``: a running float64 sum, angle reduced in float64 (srope's kernels for float32 q/k).

Reported per variant: the largest |Φ − Φ_ref| (rad before the temperature), the largest angle error
(rad, modulo 2π) and the largest |q_rot − q_ref| for q ~ N(0, 1) rotated in float32 (float64 for the
float64 variant), over all tokens and the 32 pairs of one head.

    python integrations/fla/precision.py --out out/fla-precision.json [--tokens 1048576]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

from srope.modules import SelectiveRoPE
from srope.ops.layout import RowLayout

F32, F64, LD = np.float32, np.float64, np.longdouble
CHUNK = 64
TWO_PI_LD = LD(2) * LD(np.pi) if np.finfo(LD).eps >= np.finfo(F64).eps else LD(2) * np.arccos(LD(-1))
# 2π as three float32 parts for Cody–Waite reduction
_C1 = F32(2 * math.pi)
_C2 = F32(LD(2) * np.arccos(LD(-1)) - LD(_C1))
_C3 = F32(LD(2) * np.arccos(LD(-1)) - LD(_C1) - LD(_C2))


def increments(tokens: int, seed: int, bias: bool) -> tuple[np.ndarray, np.ndarray]:
    """φ ``[T, R]`` (float32) of head 0 of an initialised SelectiveRoPE on random x, and Θ ``[R]``."""
    torch.manual_seed(seed)
    hidden, heads, head_dim = 512, 4, 64
    pe = SelectiveRoPE(hidden, heads, head_dim, bias=bias).eval()
    chunks = []
    with torch.no_grad():
        state = None
        for start in range(0, tokens, 1 << 16):  # in pieces, carrying the conv state: bounded memory
            x = torch.randn(1, min(1 << 16, tokens - start), hidden)
            phi, state = pe.phase_increments(x, RowLayout.of(*x.shape[:2]), state)
            chunks.append(phi[0, :, 0].float().numpy())
    return np.concatenate(chunks), pe.spectrum().numpy()


def fma(a, b, c):
    """float32 fused multiply-add: the exact product (24 + 24 bits fit in float64) plus c, rounded once."""
    return (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(F32)


def two_sum(a, b):
    s = (a + b).astype(F32)
    bb = (s - a).astype(F32)
    return s, ((a - (s - bb)) + (b - bb)).astype(F32)


def wrap32(angle):
    return np.mod(angle, F32(2 * math.pi)).astype(F32)


def phase_float32(phi):
    return np.cumsum(phi, axis=0, dtype=F32)


def phase_kahan32(phi):
    out = np.empty_like(phi)
    total = np.zeros(phi.shape[1], F32)
    comp = np.zeros(phi.shape[1], F32)
    for t in range(phi.shape[0]):
        y = phi[t] - comp
        s = total + y
        comp = (s - total) - y
        total = s
        out[t] = total
    return out


def local_scan(phi):
    """float32 inclusive scans inside every chunk, ``[T, R]`` (what one program's registers hold)."""
    return np.cumsum(phi.reshape(-1, CHUNK, phi.shape[1]), axis=1, dtype=F32).reshape(phi.shape)


def chunk_sums_pair(phi):
    """Every chunk's sum as a float32 pair (hi, lo), compensated token by token (TwoSum)."""
    blocks = phi.reshape(-1, CHUNK, phi.shape[1])
    hi = np.zeros((blocks.shape[0], phi.shape[1]), F32)
    lo = np.zeros_like(hi)
    for i in range(CHUNK):
        hi, err = two_sum(hi, blocks[:, i])
        lo = (lo + err).astype(F32)
    return hi, lo


def angle_chunk_f64(phi, theta):
    local = local_scan(phi)
    sums = phi.reshape(-1, CHUNK, phi.shape[1]).sum(axis=1, dtype=F64)  # float64 chunk sums, as srope's kernel
    carry = np.concatenate([np.zeros((1, phi.shape[1])), np.cumsum(sums, axis=0)[:-1]])
    carry = np.repeat(carry, CHUNK, axis=0)
    start = np.mod(theta * carry, 2 * math.pi).astype(F32)
    return carry + local.astype(F64), start + theta.astype(F32) * local


def angle_chunk_2f32(phi, theta):
    local = local_scan(phi)
    sums, sums_lo = chunk_sums_pair(phi)
    hi = np.zeros_like(sums)
    lo = np.zeros_like(sums)
    h, lo_acc = np.zeros(phi.shape[1], F32), np.zeros(phi.shape[1], F32)
    for c in range(sums.shape[0]):  # exclusive scan of the chunk sums as a float32 pair
        hi[c], lo[c] = h, lo_acc
        h, err = two_sum(h, sums[c])
        lo_acc = (lo_acc + err + sums_lo[c]).astype(F32)
        h, lo_acc = two_sum(h, lo_acc)
    hi, lo = np.repeat(hi, CHUNK, axis=0), np.repeat(lo, CHUNK, axis=0)
    t32 = theta.astype(F32)
    p_hi = (t32 * hi).astype(F32)
    p_lo = fma(t32 + 0 * hi, hi, -p_hi)  # exact: Θ·hi = p_hi + p_lo
    n = np.rint(p_hi * F32(1 / (2 * math.pi))).astype(F32)
    r = fma(-n, _C1 + 0 * n, p_hi)
    r = fma(-n, _C2 + 0 * n, r)
    r = fma(-n, _C3 + 0 * n, r)
    angle = (r + (p_lo + (t32 * lo).astype(F32) + (t32 * local).astype(F32))).astype(F32)
    return hi.astype(F64) + lo + local, angle


def rotate(q, angle, dtype):
    c, s = np.cos(angle.astype(dtype)), np.sin(angle.astype(dtype))
    x1, x2 = q[0].astype(dtype), q[1].astype(dtype)
    return np.stack([x1 * c - x2 * s, x1 * s + x2 * c])


def errors(name, phase, angle, ref_phase, ref_angle, q, ref_q, dtype):
    d = np.abs(np.mod(angle.astype(LD) - ref_angle + TWO_PI_LD / 2, TWO_PI_LD) - TWO_PI_LD / 2)
    q_err = np.abs(rotate(q, angle, dtype).astype(LD) - ref_q).max()
    return dict(variant=name, phase_max_abs=float(np.abs(phase.astype(LD) - ref_phase).max()),
                angle_max_abs=float(d.max()), q_rot_max_abs=float(q_err))


def measure(phi: np.ndarray, theta: np.ndarray, seed: int) -> dict:
    """The errors of every variant for increments ``phi [T, R]`` and temperatures ``theta [R]``."""
    ref_phase = np.cumsum(phi.astype(LD), axis=0)
    ref_angle = np.mod(theta.astype(LD) * ref_phase, TWO_PI_LD)
    q = np.random.default_rng(seed).standard_normal((2, *phi.shape))
    ref_q = rotate(q, ref_angle, LD)
    t32 = theta.astype(F32)
    rows = []
    for name, phase in (("float32", phase_float32(phi)), ("kahan32", phase_kahan32(phi))):
        rows.append(errors(name, phase, wrap32(t32 * phase), ref_phase, ref_angle, q, ref_q, F32))
    rows.append(errors("chunk32+f64", *angle_chunk_f64(phi, theta), ref_phase, ref_angle, q, ref_q, F32))
    rows.append(errors("chunk32+2f32", *angle_chunk_2f32(phi, theta), ref_phase, ref_angle, q, ref_q, F32))
    phase64 = np.cumsum(phi.astype(F64), axis=0)
    rows.append(errors("float64", phase64, np.mod(theta * phase64, 2 * math.pi), ref_phase, ref_angle, q, ref_q, F64))
    stats = dict(mean=float(phi.mean()), std=float(phi.std()), min=float(phi.min()), max=float(phi.max()),
                 final_phase_max=float(ref_phase[-1].max()), temperature_max=float(theta.max()))
    return dict(pairs=int(phi.shape[1]), increments=stats, rows=rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/fla-precision.json"))
    args = parser.parse_args(argv)
    if args.tokens < CHUNK or args.tokens % CHUNK:
        parser.error(f"--tokens must be a positive multiple of {CHUNK}")
    started = time.time()
    settings = []
    for name, bias in (("init", False), ("init+bias", True)):
        phi, theta = increments(args.tokens, args.seed, bias)
        theta = theta.astype(F32).astype(F64)  # the op is given Θ in float32: the reference uses that very value
        settings.append(dict(setting=name, bias=bias, **measure(phi, theta, args.seed)))
    result = dict(tokens=args.tokens, seed=args.seed, chunk=CHUNK, settings=settings, torch=torch.__version__,
                  numpy=np.__version__, machine=platform.machine(), long_double_eps=float(np.finfo(LD).eps),
                  seconds=round(time.time() - started, 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for setting in settings:
        print(f"{setting['setting']}: increments {setting['increments']}")
        print(f"  {'variant':<14} {'max |dPhi|':>11} {'max |dangle|':>13} {'max |dq_rot|':>13}")
        for row in setting["rows"]:
            print(f"  {row['variant']:<14} {row['phase_max_abs']:11.2e} {row['angle_max_abs']:13.2e} {row['q_rot_max_abs']:13.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
