"""The projection forward kernel per tile (BN, BK, warps, stages) on the test shapes, one
process per tile (an illegal address ends the process), CUDA_LAUNCH_BLOCKING=1 so that a
fault names its launch. Behind results/projection_forward_tiles_fault_h200.json (there with
the tracebacks cut to their last line).

    python benchmarks/projection_forward_tiles.py      (writes $OUT/diag_forward.json)
"""
import json, os, subprocess, sys
TILES = [(64, 64, 4, 3), (64, 64, 4, 1), (64, 64, 4, 2), (64, 32, 4, 3), (128, 32, 8, 3), (64, 64, 8, 3)]
SHAPES = [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68), (5, 2, 16, 5), (33, 1, 48, 130), (17, 2, 7, 33), (9, 2, 16, 18), (64, 2, 64, 68), (300, 4, 256, 68), (32768, 4, 256, 68)]
CHILD = r'''
import sys, json, torch
from srope.ops.triton import projection as p
p.FORWARD_TILE = tuple(json.loads(sys.argv[1]))
for (n, h, i, m) in json.loads(sys.argv[2]):
    print("shape", (n, h, i, m), end=" ", flush=True)
    g = torch.Generator().manual_seed(n * 7 + m)
    x = (torch.randn(n, h, i, generator=g) * 3).cuda()
    w = (torch.randn(h, i, m, generator=g) / 16).cuda()
    w[:, :, 0] *= 1e-6
    if m > 2: w[:, :, 1] = 0
    y, r, _ = p.projection_forward(x, w, 1e-6)
    torch.cuda.synchronize()
    x64, w64 = x.double(), w.double()
    r64 = torch.rsqrt(x64.square().sum(-1) + 1e-6)
    xh = x64 * r64[..., None]
    ref = torch.einsum("nhi,him->nhm", xh, w64); bound = torch.einsum("nhi,him->nhm", xh.abs(), w64.abs())
    worst = ((y.double() - ref).abs() / bound.clamp_min(1e-300)).max().item()
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    print(json.dumps({"worst_over_bound": worst, "rel": rel, "nan": bool(torch.isnan(y).any())}), flush=True)
'''
out = {}
for tile in TILES:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(tile), json.dumps(SHAPES)], capture_output=True, text=True, env=env, timeout=120)
    print("TILE", tile, "rc", done.returncode, flush=True)
    print(done.stdout.strip()[-3000:], flush=True)
    if done.returncode:
        print(done.stderr.strip()[-600:], flush=True)
    out[str(tile)] = {"rc": done.returncode, "stdout": done.stdout[-4000:], "stderr": done.stderr[-1500:]}
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "diag_forward.json"), "w"), indent=1)
