"""Check the Selective RoPE / RoPE Triton kernels on CUDA at real sizes; write the errors as JSON.

Relative RMS errors ``‖a−b‖/‖b‖`` against the float64 reference (run on the GPU) of the
forward outputs and of all five gradients (q, k, phi, temperature, offset) at the benchmark
shapes, GQA with partial rotary and odd R, and a packed batch with empty and one-token
sequences, in float32 and bfloat16; bitwise determinism of the backward; the angle error at
T = 2^20; fixed RoPE; the fused decode step against the module; torch.compile (inductor,
fullgraph) and a CUDA-graph replay. The cases are ``tests/ops/rotary/cuda_checks.py`` (shared
with ``pytest -m gpu tests/ops/rotary``).

Usage (repository root, GPU machine, TRITON_INTERPRET unset):

    python benchmarks/check_cuda_rotary.py --out out/bench/rotary_checks_h200.json

Exit status 1 when a check fails its tolerance (float32 1e-4, bf16 1e-2, phase 1e-3 rad).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.ops.rotary.cuda_checks
sys.path.insert(1, str(ROOT / "src"))
sys.path.insert(2, str(ROOT / "benchmarks"))

from common import environment

from tests.ops.rotary import cuda_checks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    env = environment()
    report = {
        "gpu": env["gpu"],
        "torch": env["torch"],
        "triton": env["triton"],
        "env": env,
        "tolerance": {"fp32": 1e-4, "bf16": 1e-2, "phase_rad": cuda_checks.PHASE_TOLERANCE_RAD},
        "checks": [],
    }
    failed = False

    def record(name: str, fn, ok) -> None:
        nonlocal failed
        start = time.perf_counter()
        try:
            value = fn()
            passed = bool(ok(value))
        except Exception:  # noqa: BLE001 - a failed check is recorded, the others still run
            value, passed = {"error": traceback.format_exc(limit=4)}, False
        failed |= not passed
        entry = {"check": name, "passed": passed, "result": value, "seconds": round(time.perf_counter() - start, 2)}
        report["checks"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    for shape in cuda_checks.SHAPES:
        for label, dtype in DTYPES.items():
            tol = cuda_checks.TOLERANCE[dtype]
            record(
                f"rotation {shape} {label}",
                lambda s=shape, d=dtype: cuda_checks.rotation_errors(s, d),
                lambda e, t=tol: e["final_phase"] < 1e-12 and all(v < t for k, v in e.items() if k != "final_phase"),
            )
    record("backward bitwise deterministic (packed, bf16)", cuda_checks.backward_is_deterministic, lambda v: v)
    record("max angle error at T=2^20 (rad)", cuda_checks.phase_error_rad, lambda v: v < cuda_checks.PHASE_TOLERANCE_RAD)
    for label, dtype in DTYPES.items():
        tol = cuda_checks.TOLERANCE[dtype]
        record(f"rope 8x4096x4x128 {label}", lambda d=dtype: cuda_checks.rope_errors(d), lambda e, t=tol: all(v < t for v in e.values()))
        dec_tol = 1e-5 if dtype == torch.float32 else 1e-2
        record(
            f"decode step vs module {label}",
            lambda d=dtype: cuda_checks.decode_errors(d),
            lambda e, t=dec_tol: e["conv_state"] < 1e-6 and max(e["q"], e["k"], e["phase"]) < t,
        )
    record(
        "torch.compile + CUDA graph",
        cuda_checks.compile_and_graph_errors,
        lambda e: e["graph_breaks"] == 0 and e["compiled_max_err"] < 1e-2 and e["cuda_graph_max_err"] < 1e-6,
    )
    print(f"wrote {args.out}; {'SOME CHECKS FAILED' if failed else 'all checks passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
