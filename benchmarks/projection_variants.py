"""Variants of the generator projection's kernels, each timed alone (prepared at stop 22).

**Backward.** The shipped kernel (``srope.ops.triton.projection.backward_kernel``: dx and
the weight gradient in one pass, 232-238 registers, one 8-warp program per SM) took
0.236 ms in the GLA-370M layer against a 0.085 ms HBM floor. The variants test two
explanations:

* **layout conversions**: the shipped kernel's tiles are [tokens, inputs]; its two products
  then use different wgmma layouts and the TTGIR has 11 layout conversions per step.
  ``transposed_kernel`` computes ``dxᵀ = W dzᵀ`` on [inputs, tokens] tiles, where both
  products share one layout (7 conversions);
* **one program per SM**: ``transposed_kernel`` without WEIGHT_GRAD computes dx alone (and
  writes dz, 1/15 of x's bytes) at 128 registers with two stages (two programs per SM), and
  ``weight_grad_kernel`` sums ``Σ x_lowᵀ dz`` from the forward's bf16 copy of x (what the
  host's maps read, saved anyway) as a pipelined split-K product.

**Forward.** The shipped kernel (0.147 ms with the cast, floor 0.05) reads x for the norm in
steps whose loads wait for each other (Triton pipelines only the products' loads): the
variants widen that pass and pipeline it (``NORM_PASS``), with other product tiles beside.

At 32768 tokens x 4 heads x 256 inputs -> 68 (the GLA-370M layer; ``--small``: a small
shape under ``TRITON_INTERPRET=1`` with exact 16-bit inputs, where every variant must match
float64 to 1e-6). ``triton.testing.do_bench`` medians (L2 flushed), with a torch
``x + host_grad`` of the same bytes as the bandwidth reference. JSON lines on stdout and a
list in ``--out``; exit status 1 if any variant is wrong. The kernels are copies for
measurement: what wins moves into ``srope.ops.triton.projection``.

    python benchmarks/projection_variants.py --out FILE [--small]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from common import environment, with_settings, write_json
from srope.ops.triton import projection as shipped
from srope.ops.triton.ops import interpreting

TOLERANCE = 1e-6  # the backward's, relative to float64, exact 16-bit inputs (--small)
LAUNCHED = {}  # kernel name -> the compiled kernel of its last launch (registers and spills on the GPU)


@triton.jit
def _dz_columns(dy, y, z_out, offsets_n, mn, r, start, dot_y, write, M: tl.constexpr, BM: tl.constexpr,
                dtype: tl.constexpr, STORE_Z: tl.constexpr, UPCAST: tl.constexpr):
    """Columns ``start + [0, BM)``: dz = r·dy rounded to ``dtype`` ([BN, BM]) and dot_y += Σ dy·y;
    STORE_Z: dz also written to ``z_out`` where ``write``."""
    mm = start + tl.arange(0, BM)
    tile = mn[:, None] & (mm < M)[None, :]
    g = tl.load(dy + offsets_n[:, None] + mm[None, :], mask=tile, other=0.0)
    dot_y += tl.sum(g * tl.load(y + offsets_n[:, None] + mm[None, :], mask=tile, other=0.0), axis=1)
    z = (g * r[:, None]).to(dtype, fp_downcast_rounding="rtne")
    if STORE_Z:
        tl.store(z_out + offsets_n[:, None] + mm[None, :], z, mask=tile & write)
    return z.to(tl.float32) if UPCAST else z, dot_y


@triton.jit
def _input_grad_step(dy, y, inv_norm, x, host_grad, dx, z_out, w1, w2, start, N, x_n, h, ii, mi, write, dtype: tl.constexpr,
                     H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, BN: tl.constexpr, BM1: tl.constexpr,
                     BM2: tl.constexpr, TWO: tl.constexpr, HOST_GRAD: tl.constexpr, STORE_Z: tl.constexpr,
                     UPCAST: tl.constexpr):
    """One step of BN tokens on [inputs, tokens] tiles: writes dxᵀ = W dzᵀ - r²(dy·y) xᵀ
    (+ host_grad); returns xᵀ and the dz column blocks."""
    nn = start + tl.arange(0, BN)
    mn = nn < N
    rows = nn.to(tl.int64)
    r = tl.load(inv_norm + rows * H + h, mask=mn, other=0.0)
    offsets_n = (rows * H + h) * M
    dot_y = tl.zeros([BN], dtype=tl.float32)
    z1, dot_y = _dz_columns(dy, y, z_out, offsets_n, mn, r, 0, dot_y, write, M, BM1, dtype, STORE_Z, UPCAST)
    acc = tl.dot(w1, tl.trans(z1))
    z2 = z1
    if TWO:
        z2, dot_y = _dz_columns(dy, y, z_out, offsets_n, mn, r, BM1, dot_y, write, M, BM2, dtype, STORE_Z, UPCAST)
        acc = tl.dot(w2, tl.trans(z2), acc)
    tile = mi[:, None] & mn[None, :]
    xt = tl.load(x + rows[None, :] * x_n + h * I + ii[:, None], mask=tile, other=0.0)
    out = acc - xt * (dot_y * r * r)[None, :]
    if HOST_GRAD:
        out += tl.load(host_grad + (rows[None, :] * H + h) * I + ii[:, None], mask=tile, other=0.0).to(tl.float32)
    tl.store(dx + (rows[None, :] * H + h) * I + ii[:, None], out, mask=tile)
    return xt, z1, z2


@triton.jit
def transposed_kernel(
    dy, y, inv_norm, weight, x, host_grad, dx, dw, z_out, N, x_n, tokens,
    H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, BN: tl.constexpr, BI: tl.constexpr, BM1: tl.constexpr,
    BM2: tl.constexpr, TWO: tl.constexpr, HOST_GRAD: tl.constexpr, WEIGHT_GRAD: tl.constexpr, UPCAST: tl.constexpr,
):
    """The shipped kernel's work on [inputs, tokens] tiles: dx and (WEIGHT_GRAD) the slab's
    weight-gradient partial, or else dx alone with dz written (by the first input slice's programs)."""
    ps, h, pi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ii = pi * BI + tl.arange(0, BI)
    mi = ii < I
    w1 = shipped._load_weight(weight, h, ii, mi, 0, I, M, BM1, UPCAST)
    w2 = shipped._load_weight(weight, h, ii, mi, BM1, I, M, BM2, UPCAST)
    grad1 = tl.zeros([BI, BM1], dtype=tl.float32)
    grad2 = tl.zeros([BI, BM2], dtype=tl.float32)
    first = ps * tokens
    for start in range(first, tl.minimum(first + tokens, N), BN):
        xt, z1, z2 = _input_grad_step(dy, y, inv_norm, x, host_grad, dx, z_out, w1, w2, start, N, x_n, h, ii, mi, pi == 0,
                                      weight.dtype.element_ty, H, I, M, BN, BM1, BM2, TWO, HOST_GRAD, not WEIGHT_GRAD, UPCAST)
        if WEIGHT_GRAD:
            x_low = xt.to(weight.dtype.element_ty, fp_downcast_rounding="rtne")
            grad1, grad2 = shipped._add_weight_grads(x_low, z1, z2, grad1, grad2, TWO, UPCAST)
    if WEIGHT_GRAD:
        shipped._store_weight_grad(dw, grad1, ps, h, ii, mi, 0, H, I, M, BM1)
        if TWO:
            shipped._store_weight_grad(dw, grad2, ps, h, ii, mi, BM1, H, I, M, BM2)


@triton.jit
def weight_grad_kernel(
    x_low, z, dw, N, x_n, tokens,
    H: tl.constexpr, I: tl.constexpr, M: tl.constexpr, BN: tl.constexpr, BI: tl.constexpr, BM1: tl.constexpr,
    BM2: tl.constexpr, TWO: tl.constexpr, UPCAST: tl.constexpr,
):
    """The slab's partial ``Σ_n x_low[n, h]ᵀ z[n, h]`` ([I, M] per head); x_low of any float
    dtype, rounded to z's (the forward's bf16 copy of x needs no rounding)."""
    ps, h, pi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ii = pi * BI + tl.arange(0, BI)
    mi = ii < I
    m1 = tl.arange(0, BM1)
    m2 = BM1 + tl.arange(0, BM2)
    grad1 = tl.zeros([BI, BM1], dtype=tl.float32)
    grad2 = tl.zeros([BI, BM2], dtype=tl.float32)
    first = ps * tokens
    for start in range(first, tl.minimum(first + tokens, N), BN):
        nn = start + tl.arange(0, BN)
        mn = nn < N
        rows = nn.to(tl.int64)
        xt = tl.load(x_low + rows[None, :] * x_n + h * I + ii[:, None], mask=mi[:, None] & mn[None, :], other=0.0)
        xt = xt.to(z.dtype.element_ty, fp_downcast_rounding="rtne")
        offsets_n = (rows * H + h) * M
        z1 = tl.load(z + offsets_n[:, None] + m1[None, :], mask=mn[:, None] & (m1 < M)[None, :], other=0.0)
        if UPCAST:
            xt, z1 = xt.to(tl.float32), z1.to(tl.float32)
        grad1 = tl.dot(xt, z1, grad1)
        if TWO:
            z2 = tl.load(z + offsets_n[:, None] + m2[None, :], mask=mn[:, None] & (m2 < M)[None, :], other=0.0)
            grad2 = tl.dot(xt, z2.to(tl.float32) if UPCAST else z2, grad2)
    shipped._store_weight_grad(dw, grad1, ps, h, ii, mi, 0, H, I, M, BM1)
    if TWO:
        shipped._store_weight_grad(dw, grad2, ps, h, ii, mi, BM1, H, I, M, BM2)


def _launch(tile, count, heads, chunk, slab):
    """(launch options, tokens per program, grid) for a tile (BN, BI, warps, stages[, maxnreg])."""
    block_n, block_i, warps, stages = tile[:4]
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": tile[4]} if len(tile) > 4 else {})}
    tokens = shipped.slab_tokens(count, block_n, slab)
    return options, tokens, (triton.cdiv(count, tokens), heads, triton.cdiv(chunk, block_i))


def _blocks(width):
    first, rest = shipped.column_blocks(width)
    return dict(BM1=first, BM2=max(rest, 16), TWO=rest > 0)


def run_transposed(dy, y, r, w, x, hg, tile, slab):
    (count, heads, chunk), width = x.shape, w.shape[2]
    options, tokens, grid = _launch(tile, count, heads, chunk, slab)
    dx = torch.empty_like(x)
    partial = torch.empty(grid[0], heads, chunk, width, dtype=torch.float32, device=x.device)
    LAUNCHED["transposed"] = transposed_kernel[grid](dy, y, r, w, x, dx if hg is None else hg, dx, partial, dx, count, x.stride(0),
                                                     tokens, H=heads, I=chunk, M=width, BN=tile[0], BI=tile[1], **_blocks(width),
                                                     HOST_GRAD=hg is not None, WEIGHT_GRAD=True, UPCAST=interpreting(), **options)
    return dx, partial.sum(0)


def run_split(dy, y, r, w, x, hg, x_low, dx_tile, dx_slab, dw_tile=None, dw_slab=None):
    """dx and dz, then (with a dw tile) the weight gradient from ``x_low``."""
    (count, heads, chunk), width = x.shape, w.shape[2]
    options, tokens, grid = _launch(dx_tile, count, heads, chunk, dx_slab)
    dx = torch.empty_like(x)
    z = torch.empty(count, heads, width, dtype=w.dtype, device=x.device)
    LAUNCHED["input_grad"] = transposed_kernel[grid](dy, y, r, w, x, dx if hg is None else hg, dx, dx, z, count, x.stride(0),
                                                     tokens, H=heads, I=chunk, M=width, BN=dx_tile[0], BI=dx_tile[1], **_blocks(width),
                                                     HOST_GRAD=hg is not None, WEIGHT_GRAD=False, UPCAST=interpreting(), **options)
    if dw_tile is None:
        return dx, None
    options, tokens, grid = _launch(dw_tile, count, heads, chunk, dw_slab)
    partial = torch.empty(grid[0], heads, chunk, width, dtype=torch.float32, device=x.device)
    LAUNCHED["weight_grad"] = weight_grad_kernel[grid](x_low, z, partial, count, x_low.stride(0), tokens, H=heads, I=chunk, M=width,
                             BN=dw_tile[0], BI=dw_tile[1], **_blocks(width), UPCAST=interpreting(), **options)
    return dx, partial.sum(0)


def reference(dy, y, r, w, x, hg):
    """dx and dw in float64 from the same rounded dz and x_low."""
    z = (dy * r[..., None]).to(w.dtype).double()
    dx = torch.einsum("nhm,him->nhi", z, w.double()) - x.double() * (r.double() ** 2 * (dy.double() * y.double()).sum(-1))[..., None]
    return dx + hg.double(), torch.einsum("nhi,nhm->him", x.to(w.dtype).double(), z)


def inputs(small: bool, device: str):
    """Random inputs at the GLA-370M shape (small: 200 x 2 x 40 -> 36), x and dy exact in bf16
    and r a power of two, so that dz and x_low are exact (the interpreter truncates)."""
    torch.manual_seed(0)
    count, heads, chunk, width = (200, 2, 40, 36) if small else (32768, 4, 256, 68)
    x = torch.randn(count, heads, chunk, device=device).bfloat16().float()
    w = (torch.randn(heads, chunk, width, device=device) / 16).bfloat16()
    dy = torch.randn(count, heads, width, device=device).bfloat16().float()
    y = torch.randn(count, heads, width, device=device)
    r = 2.0 ** -torch.randint(3, 6, (count, heads), device=device).float()
    hg = torch.randn(count, heads, chunk, device=device).bfloat16()
    return dy, y, r, w, x, hg


def backward_cases(data, small: bool):
    """(name, function returning (dx, dw or None)) for every backward variant; one tile each under --small."""
    dy, y, r, w, x, hg = data
    x_low = x.bfloat16()
    tiny = (16, 16, 4, 1)
    pick = (lambda tile: tiny) if small else (lambda tile: tile)
    slab = (lambda tokens: 64) if small else (lambda tokens: tokens)
    out = [("shipped", lambda: shipped._backward_op(dy, y, r, w, x, hg, True))]
    if not small:
        sum_out = torch.empty_like(x)
        out.append(("bandwidth reference: torch x + host_grad", lambda: (torch.add(x, hg, out=sum_out), None)))
    for tile, tokens in (((64, 128, 8, 1), 2048), ((64, 128, 8, 1), 1024), ((64, 128, 8, 2), 2048), ((32, 128, 8, 1), 2048),
                         ((32, 128, 8, 2, 128), 1024), ((64, 64, 8, 2), 2048), ((64, 64, 8, 2, 128), 1024)):
        out.append((f"transposed {tile} slab {tokens}", lambda t=tile, s=tokens: run_transposed(dy, y, r, w, x, hg, pick(t), slab(s))))
    for tile in ((64, 128, 8, 1), (64, 128, 8, 2, 128), (64, 128, 8, 1, 128), (32, 128, 4, 1), (32, 128, 8, 2), (32, 128, 8, 2, 128)):
        for tokens in (512, 256):
            out.append((f"dx alone {tile} slab {tokens}", lambda t=tile, s=tokens: run_split(dy, y, r, w, x, hg, x_low, pick(t), slab(s))))
    for tile in ((64, 128, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (64, 256, 8, 3), (128, 64, 4, 4)):
        for tokens in (1024, 2048, 4096):
            out.append((f"split: dx (64, 128, 8, 2, 128) slab 256, dw {tile} slab {tokens}",
                        lambda t=tile, s=tokens: run_split(dy, y, r, w, x, hg, x_low, pick((64, 128, 8, 2, 128)), slab(256),
                                                           pick(t), slab(s))))
    out.append(("split, dw from float32 x: dx (64, 128, 8, 2, 128) slab 256, dw (128, 128, 8, 3) slab 2048",
                lambda: run_split(dy, y, r, w, x, hg, x, pick((64, 128, 8, 2, 128)), slab(256), pick((128, 128, 8, 3)), slab(2048))))
    return _one_of_each(out) if small else out


def _one_of_each(cases):
    """The first case of each kind (the name's first word): what --small runs."""
    seen, chosen = set(), []
    for name, fn in cases:
        kind = name.split(" ")[0]
        if kind not in seen:
            seen.add(kind)
            chosen.append((name, fn))
    return chosen


def forward_inputs(small: bool, device: str):
    """x of scale 3 (r far from 1) and the float32 weight; one column 1e-6 times the rest."""
    torch.manual_seed(1)
    count, heads, chunk, width = (70, 2, 40, 68) if small else (32768, 4, 256, 68)
    x = torch.randn(count, heads, chunk, device=device) * 3
    weight = torch.randn(heads, chunk, width, device=device) / 16
    weight[:, :, 0] *= 1e-6
    return x, weight


def forward_reference(x, weight):
    x64 = x.double()
    r = torch.rsqrt(x64.square().sum(-1) + 1e-6)
    return torch.einsum("nhi,him->nhm", x64 * r[..., None], weight.double()), r


def forward_cases(data, small: bool):
    """(name, function returning (y, inv_norm)) for the shipped forward with the cast, and
    its norm pass and product tiles varied; under --small one wider norm pass."""
    x, weight = data
    forward = lambda: shipped._forward_op(x, weight, 1e-6, torch.bfloat16)[:2]
    if small:
        return [("forward shipped", forward),
                ("forward norm pass (32, 1)", with_settings(shipped, {"INTERPRETED_FORWARD": ((16, 16, 4, 1), (32, 1))}, forward))]
    out = [("forward shipped", forward)]
    # (no 64-input tiles: one faults on the H200 with a 40-input head chunk, and a fault would
    # end every case after it; results/projection_forward_tiles_fault_h200.json)
    for tile in ((64, 32, 4, 3), (128, 32, 8, 3), (64, 32, 8, 3)):
        for norm in ((32, 2), (32, 3), (64, 2), (64, 3), (128, 2)):
            out.append((f"forward tile {tile} norm pass {norm}", with_settings(shipped, {"FORWARD_TILE": tile, "NORM_PASS": norm}, forward)))
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def measure(name, fn, references, names, device, bound):
    """One case: errors of its outputs against the references, registers, time."""
    try:
        LAUNCHED.clear()
        outputs = fn()
        record = {"name": name}
        for kernel, compiled in LAUNCHED.items():
            if hasattr(compiled, "n_regs"):
                record[f"{kernel}_registers"], record[f"{kernel}_spills"] = compiled.n_regs, compiled.n_spills
        if not name.startswith("bandwidth"):
            record.update({f"{key}_error": None if out is None else relative(out, ref)
                           for key, out, ref in zip(names, outputs, references)})
        if device == "cuda":
            record["ms"] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    except Exception as error:  # a variant that does not compile is a result, not a stop
        record = {"name": name, "error": repr(error)[:400]}
    errors = [record.get(f"{key}_error") for key in names]
    if "error" in record or any(error is not None and not error <= bound for error in errors):  # NaN is wrong
        record["wrong"] = True
    print(json.dumps(record), flush=True)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="small shapes, for TRITON_INTERPRET=1 on the CPU")
    args = parser.parse_args()
    device = "cpu" if interpreting() else "cuda"
    # float32 sums over 32768 tokens on the GPU; the forward is float32-accurate (4.5e-7 shipped)
    bound = TOLERANCE if args.small else 1e-5
    results = []
    for direction, make, check, names, direction_bound in (
        ("backward", inputs, reference, ("dx", "dw"), bound),
        ("forward", forward_inputs, forward_reference, ("y", "inv_norm"), 2e-6),
    ):
        data = references = None
        try:
            data = make(args.small, device)
            references = check(*data)
            cases = backward_cases(data, args.small) if direction == "backward" else forward_cases(data, args.small)
        except Exception as error:  # (after a GPU fault, say): recorded, and what ran is kept
            results.append({"name": f"{direction} setup", "error": repr(error)[:400], "wrong": True})
            cases = []
        for name, fn in cases:
            results.append(measure(name, fn, references, names, device, direction_bound))
            write_json(args.out, {**environment(), "results": results})  # after each case: a fault keeps the rest
        del data, references
    write_json(args.out, {**environment(), "results": results})
    return 1 if any(record.get("wrong") for record in results) else 0


if __name__ == "__main__":
    sys.exit(main())
