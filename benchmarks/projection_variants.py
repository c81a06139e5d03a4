"""Variants of the generator projection's kernels, each timed alone.

Prepared at stop 22 without a GPU and timed at stop 23 (results/projection_variants_h200.json,
projection_tiles_h200.json), when the winners moved into ``srope.ops.triton.projection``.

**Backward** (``backward_kernel``: dx and the weight gradient in one pass). Tiles of the
shipped kernel; ``dx alone``: the same kernel without the weight gradient, writing dz (1/15
of x's bytes), at 128 registers with two stages (two programs per SM); ``split``: that,
then ``weight_grad_kernel``, ``Σ x_lowᵀ dz`` from the forward's bf16 copy of x (what the
host's maps read) as a pipelined split-K product. At stop 23 the [inputs, tokens] tiles
(7 layout conversions per step against 11 on [tokens, inputs]) took 0.196-0.210 ms
against 0.249 for the kernel on [tokens, inputs] tiles, and the split 0.208.

**Forward.** The norm's pass over x in wider, software-pipelined steps (``NORM_PASS``),
with other product tiles beside.

``parts`` / ``forward split``: the shipped kernels on the generator's two output tensors
(the ω map's columns, then the gate's shares, whose gradient is one per token broadcast over
heads; the inputs' gate columns of dy are made equal across heads for it).

At 32768 tokens x 4 heads x 256 inputs -> 68 (the GLA-370M layer; ``--small``: a small
shape under ``TRITON_INTERPRET=1`` with exact 16-bit inputs, where every variant must match
float64 to 1e-6). ``triton.testing.do_bench`` medians (L2 flushed), with a torch
``x + host_grad`` of the same bytes as the bandwidth reference. JSON lines on stdout and a
list in ``--out``; exit status 1 if any variant is wrong.

    python benchmarks/projection_variants.py --out FILE [--small] [--only PREFIX,...]
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
SPLIT = {False: 64, True: 32}  # where the generator splits the outputs (ω map | gate), by --small
LAUNCHED = {}  # kernel name -> the compiled kernel of its last launch (registers and spills on the GPU)


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
    shipped._store_weight_grad(dw, grad1, ps, h, ii, mi, 0, BM1, H, I, M, BM1)
    if TWO:
        shipped._store_weight_grad(dw, grad2, ps, h, ii, mi, BM1, M, H, I, M, BM2)


def _launch(tile, count, heads, chunk, slab):
    """(launch options, tokens per program, grid) for a tile (BN, BI, warps, stages[, maxnreg])."""
    block_n, block_i, warps, stages = tile[:4]
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": tile[4]} if len(tile) > 4 else {})}
    tokens = shipped.slab_tokens(count, block_n, slab)
    return options, tokens, (triton.cdiv(count, tokens), heads, triton.cdiv(chunk, block_i))


def _blocks(width):
    columns = shipped._columns(width, None)
    return dict(BM1=columns["BM1"], BM2=columns["BM2"], TWO=columns["TWO"])


def run_split(dy, y, r, w, x, hg, x_low, dx_tile, dx_slab, dw_tile=None, dw_slab=None):
    """dx and dz, then (with a dw tile) the weight gradient from ``x_low``."""
    (count, heads, chunk), width = x.shape, w.shape[2]
    options, tokens, grid = _launch(dx_tile, count, heads, chunk, dx_slab)
    dx = torch.empty_like(x)
    z = torch.empty(count, heads, width, dtype=w.dtype, device=x.device)
    columns = shipped._columns(width, None)
    LAUNCHED["input_grad"] = shipped.backward_kernel[grid](
        dy, dy, y, y, r, w, x, dx if hg is None else hg, dx, dx, z, count, x.stride(0), tokens,
        STRIDES=shipped.part_strides(dy, dy, y, y), H=heads, I=chunk, C2=columns["W1"], BN=dx_tile[0], BI=dx_tile[1], **columns,
        HOST_GRAD=hg is not None, WEIGHT_GRAD=False, STORE_Z=True, UPCAST=interpreting(), **options)
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
    dy[:, :, SPLIT[small]:] = dy[:, :1, SPLIT[small]:]  # the gate's columns: one gradient for every head's share
    y = torch.randn(count, heads, width, device=device)
    r = 2.0 ** -torch.randint(3, 6, (count, heads), device=device).float()
    hg = torch.randn(count, heads, chunk, device=device).bfloat16()
    return dy, y, r, w, x, hg


def backward_cases(data, small: bool):
    """(name, function returning (dx, dw or None)) for every backward variant; one tile each under --small."""
    dy, y, r, w, x, hg = data
    split = SPLIT[small]
    dy_parts = (dy[..., :split].contiguous(), dy[:, :1, split:].expand(-1, dy.shape[1], -1))
    y_parts = (y[..., :split].contiguous(), y[..., split:].contiguous())
    x_low = x.bfloat16()
    tiny = (16, 16, 4, 1)
    pick = (lambda tile: tiny) if small else (lambda tile: tile)
    slab = (lambda tokens: 64) if small else (lambda tokens: tokens)
    out = [("shipped", lambda: shipped._backward_op(dy, None, y, None, r, w, x, hg, True)),
           ("parts: the shipped kernel on the generator's split (the ω map's columns, then the gate's, its gradient a broadcast)",
            lambda: shipped._backward_op(dy_parts[0], dy_parts[1], y_parts[0], y_parts[1], r, w, x, hg, True))]
    if not small:
        sum_out = torch.empty_like(x)
        out.append(("bandwidth reference: torch x + host_grad", lambda: (torch.add(x, hg, out=sum_out), None)))
    tiles = (((64, 128, 8, 1), 2048), ((64, 128, 8, 2), 2048), ((32, 128, 8, 2, 128), 1024), ((32, 128, 8, 2, 128), 2048),
             ((32, 128, 8, 2, 128), 512), ((32, 128, 8, 3, 128), 1024), ((32, 128, 4, 2, 128), 1024), ((16, 128, 4, 2, 128), 1024),
             ((64, 128, 8, 2, 128), 1024), ((64, 64, 8, 2, 128), 1024))
    for tile, tokens in () if small else tiles:  # (the interpreter runs the op's own tile: these would repeat "shipped")
        settings = {"BACKWARD_TILE": tile, "SLAB": tokens}
        out.append((f"tile {tile} slab {tokens}", with_settings(shipped, settings, lambda: shipped._backward_op(dy, None, y, None, r, w, x, hg, True))))
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
    forward = lambda: shipped._forward_op(x, weight, 1e-6, torch.bfloat16, None)[::2]  # (y, inv_norm)
    split = lambda: (lambda out: (torch.cat(out[:2], -1), out[2]))(shipped._forward_op(x, weight, 1e-6, torch.bfloat16, SPLIT[small]))
    if small:
        return [("forward shipped", forward), ("forward split", split),
                ("forward norm pass (32, 1)", with_settings(shipped, {"INTERPRETED_FORWARD": ((16, 16, 4, 1), (32, 1))}, forward))]
    out = [("forward shipped", forward), ("forward split (the generator's; the timing includes a cat)", split)]
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
    parser.add_argument("--only", default="", help="comma-separated name prefixes of the cases to run (default: all)")
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
        prefixes = tuple(filter(None, args.only.split(",")))
        for name, fn in cases:
            if prefixes and not name.startswith(prefixes):
                continue
            results.append(measure(name, fn, references, names, device, direction_bound))
            write_json(args.out, {**environment(), "results": results})  # after each case: a fault keeps the rest
        del data, references
    write_json(args.out, {**environment(), "results": results})
    return 1 if any(record.get("wrong") for record in results) else 0


if __name__ == "__main__":
    sys.exit(main())
