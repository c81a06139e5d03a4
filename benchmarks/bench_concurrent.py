"""How many steps a second K small runs make together on one GPU, K processes at once.

Processes on one GPU take turns (time slicing) unless the CUDA MPS daemon runs, which lets
their kernels overlap. A small model's step is many small kernels, so K runs at once can make
up to K times the steps of one, or no more than one: this measures which, for a
configuration of ``profile_synth.py`` (its model, batch and the runner's captured step, head
at the scored positions). Each worker warms up (captures), waits for the others, then steps
for ``--seconds``; the result is every worker's steps a second and their sum.

    python benchmarks/bench_concurrent.py --only mqar-release-512x64-d64-srope --processes 1 3 --out out/bench/concurrent.json

Start the MPS daemon (``nvidia-cuda-mps-control -d``) before this script to measure with it:
the script records whether a control pipe was found.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import torch

from common import environment, write_json
from profile_synth import CONFIGS, build_step
from srope.lab import provenance
from srope.lab.graphed import graphed_optimizer_step


def worker(name: str, seconds: float, barrier, results) -> None:
    try:
        results.put(steps_per_second(name, seconds, barrier))
    except BaseException as error:  # the parent waits on the queue: tell it, then fail
        barrier.abort()
        results.put(f"{type(error).__name__}: {error}")
        raise


def steps_per_second(name: str, seconds: float, barrier) -> float:
    device = torch.device("cuda")
    model, optimizer, loss, x, y, scored, _ = build_step(*CONFIGS[name], device, None)
    step = graphed_optimizer_step(model, optimizer, loss, strict=True)
    for _ in range(5):  # two eager steps, the capture, replays
        step(0, 1e-4, x, y, scored)
    torch.cuda.synchronize()
    barrier.wait(timeout=600)  # every worker captured
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            step(0, 1e-4, x, y, scored)
        torch.cuda.synchronize()
        steps += 20
    return steps / (time.perf_counter() - start)


def measure(name: str, processes: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(name, seconds, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [results.get(timeout=900) for _ in procs]
    errors = [r for r in rates if isinstance(r, str)]
    if errors:
        for p in procs:
            p.kill()
        raise RuntimeError(f"{name} x{processes}: " + "; ".join(errors))
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a worker of {name} exited with {p.exitcode}")
    return {"steps_per_s_each": [round(r, 1) for r in rates], "steps_per_s_total": round(sum(rates), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    mps = os.path.exists(os.path.join(pipe, "control"))
    results, source = {}, provenance.commit()
    for name in args.only:
        for k in args.processes:
            results[f"{name}/x{k}"] = measure(name, k, args.seconds)
            print(f"{name} x{k} (MPS {'on' if mps else 'off'}):", results[f"{name}/x{k}"], flush=True)
            write_json(args.out, {"provenance": provenance.record(source=source), "environment": environment(), "mps": mps, "configs": results})


if __name__ == "__main__":
    main()
