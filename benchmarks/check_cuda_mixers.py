"""Check and time srope's mixer kernels on CUDA; write everything as JSON.

1. Checks: every CUDA path (fla, our PyTorch path on the GPU, SDPA) against the CPU float64
   reference, forward and backward, dense, packed (with an empty and a one-token sequence),
   left-padded and decode, in float32 and bfloat16, at B 2, T 1000 (the case table is
   ``tests/ops/mixers/cuda_checks.py``, shared with the GPU tests).
2. The fla #640 detection (Hopper, 3.4 <= Triton < 3.7.1) and that ``backend="fla"``
   refuses to train Gated DeltaNet there.
3. Timings (bf16, ``triton.testing.do_bench`` medians, forward+backward) of each mixer at
   the 370M layer shapes: GLA B8 T4096 H4 K128 V256; GDN/DeltaNet B8 T4096 H8 K=V=128;
   FoX/attention B8 T4096 H16 D64; plus our GDN training fallback's tokens/s against fla's
   forward-only tokens/s.

Usage (repository root, GPU machine; fla's first calls autotune, see the guide §6):

    python benchmarks/check_cuda_mixers.py --out out/bench/mixers-h200.json

``--dry-run`` runs the same plumbing on the CPU (tiny sizes, torch backend only). The JSON
is rewritten after every check and timing, so a run cut short keeps what it finished; split
a long run with ``--only TEXT`` / ``--skip-checks`` / ``--skip-timings``. Exit status 1 when
any check failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.ops.mixers.cuda_checks
if not (ROOT / "src" / "srope").is_dir():
    raise SystemExit("run from a srope checkout")
sys.path.insert(1, str(ROOT / "src"))  # srope itself, installed or not
sys.path.insert(2, str(ROOT / "benchmarks"))

from common import write_json  # noqa: E402

from srope.ops.mixers import (  # noqa: E402
    fla_available,
    fla_gated_backward_is_broken,
    forgetting_attention,
    gated_delta_rule,
    gla,
    softmax_attention,
)
from srope.ops.mixers import _common as mixer_common  # noqa: E402
from tests.ops.mixers import cuda_checks  # noqa: E402

# The 370M layer shapes (B, T, heads, key dim, value dim).
TIMING_SHAPES = {
    "gla": dict(batch=8, length=4096, heads=4, key_dim=128, value_dim=256),
    "gdn": dict(batch=8, length=4096, heads=8, key_dim=128, value_dim=128),
    "deltanet": dict(batch=8, length=4096, heads=8, key_dim=128, value_dim=128),
    "fox": dict(batch=8, length=4096, heads=16, key_dim=64, value_dim=64),
    "attention": dict(batch=8, length=4096, heads=16, key_dim=64, value_dim=64),
}
DRY_SHAPE = dict(batch=1, length=64, heads=2, key_dim=16, value_dim=16)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: str) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "fla_core": version("fla-core"),
        "flash_linear_attention": version("flash-linear-attention"),
        "fla_importable": fla_available() if device == "cuda" else None,
        "device": device,
    }
    if device == "cuda":
        env |= {
            "gpu": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "cuda": torch.version.cuda,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    return env


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def run_checks(device: str, batch: int, length: int, dry_run: bool, only: str | None, results: list, save) -> None:
    for case in cuda_checks.cases():
        if dry_run and case.backend != "torch":
            continue  # on the CPU only the torch backend is meaningful
        if only is not None and only not in case.name:
            continue
        start = time.perf_counter()
        try:
            result = cuda_checks.run_case(case, batch=batch, length=length, device=device)
        except Exception as error:  # keep going: record the failure
            result = {"case": case.name, "passed": False, "error": _short_trace(error)}
        result["seconds"] = round(time.perf_counter() - start, 2)
        status = {True: "ok", False: "FAIL", None: "skip"}[result["passed"]]
        print(f"  {status:4s} {case.name:48s} max error {result.get('max_error', float('nan')):.2e}"
              f"  (tol {result.get('tolerance', float('nan')):.0e}, {result['seconds']} s)", flush=True)  # fmt: skip
        results.append(result)
        save()


def _short_trace(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)[-3:])[-1500:]


# ----------------------------------------------------------------------------------------
# Timings
# ----------------------------------------------------------------------------------------


def timing_inputs(mixer: str, shape: dict, device: str, dtype: torch.dtype, seed: int = 0) -> dict:
    """Random inputs like the layers' (never zeros), as leaves that require grad."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, t, h, k, v = (shape[n] for n in ("batch", "length", "heads", "key_dim", "value_dim"))

    def rnd(*s, scale=1.0):
        return (scale * torch.randn(*s, generator=g, device=device, dtype=torch.float32)).to(dtype)

    x = {"q": rnd(b, t, h, k), "k": rnd(b, t, h, k), "v": rnd(b, t, h, v)}
    if mixer == "gla":
        x["log_decay"] = (F.logsigmoid(rnd(b, t, h, k).float()) / 16).to(dtype)
    if mixer in ("gdn", "deltanet"):
        x["beta"] = torch.sigmoid(rnd(b, t, h).float()).to(dtype)
    if mixer == "gdn":
        x["log_decay"] = F.logsigmoid(rnd(b, t, h).float() + 2.0)
    if mixer == "fox":
        x["log_forget"] = F.logsigmoid(rnd(b, t, h).float() + 3.0)
    return {n: t.requires_grad_() for n, t in x.items()}


def mixer_call(mixer: str, x: dict, backend: str):
    if mixer == "gla":
        return gla(x["q"], x["k"], x["v"], x["log_decay"], backend=backend)[0]
    if mixer in ("gdn", "deltanet"):
        return gated_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("log_decay"), qk_l2norm=True, backend=backend)[0]
    if mixer == "fox":
        return forgetting_attention(x["q"], x["k"], x["v"], x["log_forget"], backend=backend)
    return softmax_attention(x["q"], x["k"], x["v"], backend=backend)


def median_ms(fn, device: str, grad_to_none=None) -> float:
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median"))
    fn()  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def time_one(mixer: str, backend: str, shape: dict, device: str, dtype: torch.dtype, backward: bool) -> dict:
    x = timing_inputs(mixer, shape, device, dtype)
    leaves = list(x.values())
    grad_out = torch.randn_like(mixer_call(mixer, {n: t.detach() for n, t in x.items()}, backend))

    def forward_only():
        with torch.no_grad():
            mixer_call(mixer, x, backend)

    def forward_backward():
        mixer_call(mixer, x, backend).backward(grad_out)

    step = forward_backward if backward else forward_only
    step()  # first call: compile / autotune
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
    else:
        peak_gib = None
    ms = median_ms(step, device, grad_to_none=leaves if backward else None)
    tokens = shape["batch"] * shape["length"]
    return {
        "mixer": mixer, "backend": backend, "pass": "fwd+bwd" if backward else "fwd",
        "dtype": str(dtype).replace("torch.", ""), "shape": shape, "median_ms": round(ms, 4),
        "tokens_per_s": round(tokens / (ms / 1e3)), "peak_extra_gib": None if peak_gib is None else round(peak_gib, 3),
    }  # fmt: skip


def timing_plan(device: str, dry_run: bool, broken: bool) -> list[tuple[str, str, bool]]:
    """(mixer, backend, backward) to time."""
    if dry_run:
        return [(m, "torch", True) for m in cuda_checks.MIXERS] + [("gdn", "torch", False)]
    plan = [  # most important first: a run cut short keeps these
        ("gla", "fla", True),
        ("gdn", "fla", False),  # forward-only: what fla can do on Hopper + Triton 3.6
        ("gdn", "torch", True),  # our training fallback
        ("fox", "fla", True),
        ("attention", "auto", True),  # SDPA
        ("attention", "fla", True),
        ("deltanet", "fla", True),
        ("gdn", "torch", False),
        ("deltanet", "torch", True),
        ("gla", "torch", True),
    ]
    if not broken:
        plan.insert(2, ("gdn", "fla", True))
    return plan


def run_timings(device: str, dry_run: bool, broken: bool, results: list, save) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for mixer, backend, backward in timing_plan(device, dry_run, broken):
        shape = DRY_SHAPE if dry_run else TIMING_SHAPES[mixer]
        if backend == "fla" and not fla_available():
            results.append({"mixer": mixer, "backend": backend, "skipped": "fla not importable"})
            continue
        try:
            result = time_one(mixer, backend, shape, device, dtype, backward)
            print(f"  {mixer:9s} {backend:5s} {result['pass']:7s} {result['median_ms']:9.3f} ms"
                  f"  {result['tokens_per_s']:>12,d} tok/s  peak +{result['peak_extra_gib']} GiB", flush=True)  # fmt: skip
        except Exception as error:
            result = {"mixer": mixer, "backend": backend, "backward": backward, "error": _short_trace(error)}
            print(f"  {mixer:9s} {backend:5s} ERROR {str(error)[:120]}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        results.append(result)
        save()


def gdn_summary(timings: list[dict]) -> dict:
    """Our GDN training fallback (fwd+bwd, torch) against fla's forward-only speed."""
    def find(backend, pass_):
        return next((t for t in timings if t.get("mixer") == "gdn" and t.get("backend") == backend and t.get("pass") == pass_), None)

    ours, fla_fwd = find("torch", "fwd+bwd"), find("fla", "fwd")
    if ours is None or fla_fwd is None:
        return {}
    return {
        "torch_fallback_train_tokens_per_s": ours["tokens_per_s"],
        "fla_forward_only_tokens_per_s": fla_fwd["tokens_per_s"],
        "fallback_train_over_fla_forward_time": round(ours["median_ms"] / fla_fwd["median_ms"], 2),
    }


# ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, torch backend: test the plumbing")
    parser.add_argument("--batch", type=int, default=2, help="batch of the checks (default 2)")
    parser.add_argument("--length", type=int, default=1000, help="T of the checks (default 1000)")
    parser.add_argument("--only", help="run only the checks whose name contains this text (e.g. gdn-fla)")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-timings", action="store_true")
    args = parser.parse_args(argv)

    if args.dry_run:
        device, batch, length = "cpu", 2, 40
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA GPU here; use --dry-run to test the plumbing on the CPU")
        device, batch, length = "cuda", args.batch, args.length
    broken = device == "cuda" and fla_gated_backward_is_broken()
    report = {"environment": environment(device), "dry_run": args.dry_run,
              "fla_gated_backward_is_broken": broken, "checks": [], "timings": []}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        write_json(args.out, report, indent=1)

    print(f"environment: {report['environment']}\nfla #640 condition (gated backward broken): {broken}", flush=True)
    if device == "cuda" and fla_available():
        report["gdn_fla_training_refused"] = cuda_checks.gdn_fla_training_refused()
        mixer_common._warned.discard("gdn-640")
    save()
    if not args.skip_checks:
        print(f"checks (B {batch}, T {length}):", flush=True)
        report["check_size"] = {"batch": batch, "length": length}
        run_checks(device, batch, length, args.dry_run, args.only, report["checks"], save)
        failed = [c["case"] for c in report["checks"] if c.get("passed") is False]
        report["checks_summary"] = {
            "passed": sum(c.get("passed") is True for c in report["checks"]),
            "failed": failed,
            "skipped": sum(c.get("passed") is None for c in report["checks"]),
        }
        save()
    if not args.skip_timings:
        print("timings:", flush=True)
        run_timings(device, args.dry_run, broken, report["timings"], save)
        report["gdn_fallback_vs_fla_forward"] = gdn_summary(report["timings"])
        save()
    print(f"wrote {args.out}", flush=True)
    return 1 if report.get("checks_summary", {}).get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
