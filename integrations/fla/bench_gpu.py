"""GPU timings for the precision question (CUDA only; not run in CI): the patched fla's Selective RoPE against
fla's fixed RotaryEmbedding and a plain float32 PyTorch Selective RoPE.

Variants, forward and forward+backward of q and k (medians of ``triton.testing.do_bench`` after a warm-up):
- ``fla chunk_selective_rope bf16``: srope's kernels for 16-bit q/k (float32 scan inside a chunk, float64 chunk sums
  and carry, one float64 reduction per channel and chunk);
- ``fla chunk_selective_rope fp32``: float32 q/k, every angle formed and reduced in float64;
- ``torch float32 cumsum``: ``torch.cumsum`` of φ in float32, angles in float32 (the accuracy in the precision table's
  ``float32`` row), eager;
- ``fla RotaryEmbedding``: fixed RoPE, the floor of any rotation.

Run with the patched fla importable (``pip install --no-deps dist/fla/*.whl`` from build_wheel.sh, or
``PYTHONPATH=<patched tree>``):

    python integrations/fla/bench_gpu.py --out out/fla-bench-gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path

import torch

SHAPES = ((8, 4096, 4, 128), (1, 65536, 4, 128), (16, 4096, 16, 64), (1, 4096, 4, 128))


def torch_float32(q, k, phi, temperature):
    angle = torch.cumsum(phi.float(), dim=1) * temperature.float()
    cos, sin = torch.cos(angle), torch.sin(angle)
    r = phi.shape[-1]

    def rot(x):
        x1, x2 = x[..., :r].float(), x[..., r:2 * r].float()
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, x[..., 2 * r:].float()], -1).to(x.dtype)

    return rot(q), rot(k), None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/fla-bench-gpu.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    import fla
    import triton
    from fla.modules import RotaryEmbedding
    from fla.ops.selective_rope import chunk_selective_rope

    rows = []
    for b, t, h, d in SHAPES:
        r = d // 2
        rotary = RotaryEmbedding(d).cuda()
        temperature = 500000.0 ** -(torch.arange(r, device="cuda", dtype=torch.float32) / r)
        for name, dtype in (("fla chunk_selective_rope bf16", torch.bfloat16), ("fla chunk_selective_rope fp32", torch.float32),
                            ("torch float32 cumsum", torch.bfloat16), ("fla RotaryEmbedding", torch.bfloat16)):
            q = torch.randn(b, t, h, d, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(b, t, h, d, device="cuda", dtype=dtype, requires_grad=True)
            phi = (0.5 + 0.5 * torch.randn(b, t, h, r, device="cuda")).requires_grad_(True)
            if name.startswith("fla chunk"):
                def call():
                    return chunk_selective_rope(q, k, phi, temperature)[:2]
            elif name.startswith("torch"):
                def call():
                    return torch_float32(q, k, phi, temperature)[:2]
            else:
                def call():
                    return rotary(q, k)
            dq, dk = torch.randn_like(q), torch.randn_like(k)

            def step():
                a, c = call()
                torch.autograd.backward((a, c), (dq, dk))

            for _ in range(3):
                step()
            forward = triton.testing.do_bench(call, return_mode="median")
            both = triton.testing.do_bench(step, return_mode="median", grad_to_none=[q, k, phi])
            rows.append(dict(shape=[b, t, h, d], variant=name, fwd_ms=forward, fwd_bwd_ms=both))
            print(f"{b}x{t}x{h}x{d} {name:<32} fwd {forward:.3f} ms  fwd+bwd {both:.3f} ms", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = dict(rows=rows, gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  fla=fla.__version__, commit=commit, python=platform.python_version())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
