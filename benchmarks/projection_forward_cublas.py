"""The float32 forward of the angle generator's per-head map at the GLA-370M shape (32768 tokens x 4 heads x 256 -> 68)
through cuBLAS in several layouts, against a float64 reference; TF32 for reference only. Writes $OUT/proj_fwd.json."""
import json
import os

import torch
from triton.testing import do_bench

N, H, I, M = 32768, 4, 256, 68
torch.manual_seed(0)
x = torch.randn(N, H, I, device="cuda")
w = torch.randn(H, I, M, device="cuda") / 16
ref = torch.einsum("nhi,him->nhm", x.double(), w.double())
out = {}
def run(name, fn):
    y = fn()
    err = ((y.double() - ref).norm() / ref.norm()).item()
    ms = do_bench(fn, warmup=25, rep=200)
    out[name] = {"ms": ms, "rel_err": err}
    print(f"{name:40s} {ms:.4f} ms  err {err:.2e}", flush=True)
def current():
    y = torch.empty(N, H, M, device="cuda")
    torch.bmm(x.transpose(0, 1), w, out=y.transpose(0, 1)); return y
def split64():
    y = torch.empty(N, H, M, device="cuda")
    yt = y.transpose(0, 1)
    yt[..., :64].copy_(torch.bmm(x.transpose(0, 1), w[..., :64]))
    yt[..., 64:].copy_(torch.bmm(x.transpose(0, 1), w[..., 64:])); return y
def headmajor():
    return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)
def perhead():
    y = torch.empty(N, H, M, device="cuda")
    for h in range(H):
        y[:, h].copy_(x[:, h] @ w[h])
    return y
def pad72():
    wp = torch.nn.functional.pad(w, (0, 4))
    return torch.bmm(x.transpose(0, 1), wp)[..., :M].transpose(0, 1)
def pad128():
    wp = torch.nn.functional.pad(w, (0, 60))
    return torch.bmm(x.transpose(0, 1), wp)[..., :M].transpose(0, 1)
def contig_in():
    xt = x.transpose(0, 1).contiguous()
    return torch.bmm(xt, w).transpose(0, 1)
for name, fn in [("current bmm out=token-major", current), ("bmm head-major result", headmajor), ("split 64 + 4", split64),
                 ("per head mm", perhead), ("pad N to 72", pad72), ("pad N to 128", pad128), ("contiguous x copy + bmm", contig_in)]:
    try:
        run(name, fn)
    except Exception as e:
        print(name, "failed", e)
torch.backends.cuda.matmul.allow_tf32 = True
run("current, TF32 allowed (reference only)", current)
torch.backends.cuda.matmul.allow_tf32 = False
# the copy alone
run_copy = do_bench(lambda: x.transpose(0, 1).contiguous(), warmup=25, rep=200)
print("copy of x to head-major", run_copy)
out["copy_ms"] = run_copy
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [N, H, I, M], "results": out},
          open(os.path.join(os.environ.get("OUT", "/tmp"), "proj_fwd.json"), "w"), indent=1)
