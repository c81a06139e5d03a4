"""``torchrun --nproc-per-node N -m srope train`` on 1..N GPUs of one machine, DDP and FSDP2.

Every run is the CLI as a user starts it, at the same global batch for every N (each rank
trains ``batch / N`` rows, in micro-batches of at most ``--micro``), on the default path
(DDP: the step captured as a CUDA graph with the gradients' all-reduce inside it; FSDP2:
eager, parameters gathered in bf16). Reported per run: tokens/s of the whole job and per GPU
(median after the first ``--skip`` steps of its own metrics), rank 0's peak memory, and the
losses, which must agree with one GPU's at every step up to bf16 noise (the same global
batch). Scaling efficiency = tokens/s on N GPUs / (N x tokens/s on one GPU), same preset,
position and mode, measured in the same run.

    python benchmarks/bench_scaling.py --data STORE --out out/bench/scaling.json \\
        --jobs gla-370m:selective_rope:1:ddp,gla-370m:selective_rope:2:ddp,gla-370m:selective_rope:2:fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from common import environment, train_cli, write_json

# NVLink multicast stays off on the lent machines (it can take a shared host's GPUs down).
SAFE_NCCL = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

def default_jobs(gpus: list[int]) -> str:
    """Selective RoPE then NoPE at gla-370m: one GPU, then DDP and FSDP2 on each larger count;
    the eager path (one GPU and DDP's module) for Selective RoPE, FSDP2's own path; then
    gla-1.3b with FSDP2 on the most GPUs and on one."""
    many = [n for n in gpus if n > 1]
    jobs = []
    for position in ("selective_rope", "nope"):
        jobs += [f"gla-370m:{position}:1:ddp"]
        jobs += [f"gla-370m:{position}:{n}:{parallel}" for n in many for parallel in ("ddp", "fsdp")]
        if position == "selective_rope":
            jobs += ["gla-370m:selective_rope:1:ddp:eager"] + [f"gla-370m:selective_rope:{n}:ddp:eager" for n in many]
    if many:
        jobs += [f"gla-1.3b:selective_rope:{max(many)}:fsdp", "gla-1.3b:selective_rope:1:ddp"]
    return ",".join(jobs)


def parse_job(spec: str) -> dict:
    """``PRESET:POSITION:N:PARALLEL[:MODE]``, MODE ``default`` (the CLI's defaults) or ``eager``
    (``cuda_graph=off``) or ``compile``."""
    parts = spec.split(":")
    if len(parts) not in (4, 5) or not parts[2].isdigit() or parts[3] not in ("ddp", "fsdp"):
        raise argparse.ArgumentTypeError(f"a job is PRESET:POSITION:N:ddp|fsdp[:default|eager|compile], got {spec!r}")
    mode = parts[4] if len(parts) == 5 else "default"
    if mode not in ("default", "eager", "compile"):
        raise argparse.ArgumentTypeError(f"mode must be default, eager or compile, got {mode!r} in {spec!r}")
    return {"preset": parts[0], "position": parts[1], "gpus": int(parts[2]), "parallel": parts[3], "mode": mode}


def run_job(job: dict, args) -> dict:
    n = job["gpus"]
    if args.batch % n:
        raise ValueError(f"--batch {args.batch} must be a multiple of {n} GPUs")
    micro = min(args.micro, args.batch // n)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m", "srope", "train",
               "--preset", job["preset"], "--position", job["position"], "--data", args.data, "--max-steps", str(args.steps),
               "--set", f"device={args.device}", "--set", f"global_batch_size={args.batch}", "--set", f"micro_batch_size={micro}",
               "--set", f"seq_len={args.length}", "--set", f"parallel={job['parallel']}", "--set", f"checkpoint_every={10 * args.steps}",
               "--set", "eval_rows=8", "--set", "tensorboard=false"]  # fmt: skip
    command += {"default": [], "eager": ["--set", "cuda_graph=off"], "compile": ["--set", "compile=true"]}[job["mode"]]
    record = job | train_cli(command, timeout=args.timeout, skip=args.skip)
    if "tokens_per_s" in record:
        record["tokens_per_s_per_gpu"] = record["tokens_per_s"] / n
        said = " ".join(record["report"])
        record["cuda_graph"] = "the step as a CUDA graph" in said and "without a CUDA graph" not in said
    return record


def summarise(runs: list[dict]) -> list[dict]:
    """Efficiency and loss agreement of every run against one GPU of its preset, position and
    mode (what a user compares), and, where the path differs (FSDP2 runs eagerly where one
    GPU's default is a CUDA graph), against one GPU on the same path (what the parallelism
    costs)."""
    done = [r for r in runs if "tokens_per_s" in r]
    ones = {(r["preset"], r["position"], r["mode"]): r for r in done if r["gpus"] == 1}
    same_path = {(r["preset"], r["position"], r["cuda_graph"]): r for r in done if r["gpus"] == 1}
    for r in done:
        one = ones.get((r["preset"], r["position"], r["mode"]))
        if one is not None:
            r["speedup"] = r["tokens_per_s"] / one["tokens_per_s"]
            r["efficiency"] = r["speedup"] / r["gpus"]
            r["max_loss_diff_vs_1gpu"] = max(abs(a - b) for a, b in zip(r["loss"], one["loss"]))
        path = same_path.get((r["preset"], r["position"], r["cuda_graph"]))
        if path is not None:
            r["efficiency_same_path"] = r["tokens_per_s"] / path["tokens_per_s"] / r["gpus"]
    return runs


def table(runs: list[dict]) -> str:
    lines = ["| preset | position | GPUs | parallel | mode | graph | tokens/s | per GPU | speed-up | efficiency | efficiency, same path | peak GiB (rank 0) | max loss diff vs 1 GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['preset']} | {r['position']} | {r['gpus']} | {r['parallel']} | {r['mode']} | | failed: {r['error'].strip().splitlines()[-1][:120]} ||||||")
            continue
        lines.append(f"| {r['preset']} | {r['position']} | {r['gpus']} | {r['parallel']} | {r['mode']} | {'yes' if r['cuda_graph'] else 'no'} | {r['tokens_per_s']:,.0f} "
                     f"| {r['tokens_per_s_per_gpu']:,.0f} | {r.get('speedup', float('nan')):.2f} | {r.get('efficiency', float('nan')):.2f} "
                     f"| {r.get('efficiency_same_path', float('nan')):.2f} "
                     f"| {r['peak_gib']:.1f} | {r.get('max_loss_diff_vs_1gpu', float('nan')):.4f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a prepared token store (srope data prepare prints it)")
    parser.add_argument("--gpus", default="1,2", help="GPU counts of the default jobs (default_jobs)")
    parser.add_argument("--jobs", default=None, help="comma-separated PRESET:POSITION:N:ddp|fsdp[:MODE], run in this order (default: default_jobs)")
    parser.add_argument("--batch", type=int, default=16, help="global batch (rows), the same for every N")
    parser.add_argument("--micro", type=int, default=8, help="largest micro-batch per rank")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--skip", type=int, default=6, help="first steps left out of the median")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: processes of gloo on the CPU (the plumbing's test)")
    parser.add_argument("--out", default="out/bench/scaling.json")
    args = parser.parse_args()
    jobs = [parse_job(spec) for spec in (args.jobs or default_jobs([int(n) for n in args.gpus.split(",")])).split(",")]
    visible = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count()
    for name, value in SAFE_NCCL.items():
        os.environ[name] = value
    report = {"environment": environment() | {"gpus_visible": visible}, "command": " ".join(sys.argv),
              "args": vars(args), "runs": []}  # fmt: skip
    for job in jobs:
        if job["gpus"] > visible:
            record = job | {"error": f"needs {job['gpus']} GPUs, {visible} visible"}
        else:
            try:
                record = run_job(job, args)
            except Exception as error:  # a run that cannot start is reported, the others still run
                record = job | {"error": f"{type(error).__name__}: {error}"}
        report["runs"].append(record)
        summarise(report["runs"])
        print(json.dumps({k: v for k, v in record.items() if k not in ("loss", "report", "command")}), flush=True)
        write_json(args.out, report)
    text = table(report["runs"])
    speeds = [r["efficiency"] for r in report["runs"] if r.get("gpus", 1) > 1 and "efficiency" in r]
    header = f"{report['environment'].get('gpu')} x {visible}, commit {report['environment']['commit']}"
    Path(args.out).with_suffix(".md").write_text(f"{header}\n\n{text}\n")
    print(text)
    if speeds:
        print(f"efficiency: median {statistics.median(speeds):.2f} over {len(speeds)} multi-GPU runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
