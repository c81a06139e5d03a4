"""Where the GLA layer's time goes with each position encoding, kernel by kernel.

At bench_layer's shapes (B 8, T 4096, hidden 1024, 4 heads, bf16 autocast, float32 weights
and input, as in training), ``torch.profiler`` records the GPU kernels of one forward+backward
of the layer with NoPE, RoPE and Selective RoPE (the paper's LM setting), and the CPU side
of the same calls (ops and the Python frames that issued them) (``--host-only``: only that), then the kernels of the Selective
RoPE angle generator alone, and of its short convolution alone with each backend of
:func:`srope.ops.conv.short_conv` (PyTorch's ``conv1d`` route, fla's Triton ``causal_conv1d``). Kernel names are shortened to their first 80 characters and summed.
``--python``: also where the eager calls' Python time goes (sampled stacks of every thread).

    python benchmarks/profile_layer.py --out out/bench/profile_layer_h200.json
"""

from __future__ import annotations

import argparse

import torch

from bench_layer import POSITIONS, build
from bench_op import kernel_time
from common import ROOT, environment, median_ms, write_json
from srope.ops.conv import short_conv
from srope.ops.layout import RowLayout


def profile(fn, repeats: int = 5, top: int = 60) -> dict:
    """Median eager ms (do_bench), GPU kernel ms per call, and the ``top`` kernels."""
    fn()
    fn()
    timing = kernel_time(fn, repeats)
    kernels: dict[str, float] = {}
    for name, ms in timing["kernels"].items():
        short = name[:80]
        kernels[short] = round(kernels.get(short, 0.0) + ms, 4)
    ranked = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:top])
    return {"eager_ms": round(median_ms(fn), 4), "kernel_ms": round(timing["kernel_ms"], 4),
            "kernels": ranked}


def op_profile(fn, repeats: int = 5, top: int = 20) -> list[dict]:
    """The ``top`` ATen ops of ``fn`` by the GPU time of the kernels they launched (ms per
    call), grouped by op and input shapes: which op a kernel in :func:`profile` belongs to."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    ops = [e for e in prof.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0]
    ops.sort(key=lambda e: -e.self_device_time_total)
    return [{"op": e.key, "shapes": str(e.input_shapes)[:160], "calls": e.count / repeats,
             "device_ms": round(e.self_device_time_total / 1e3 / repeats, 4)} for e in ops[:top]]


def host_profile(fn, steps: int = 5, top: int = 30) -> dict:
    """Where the CPU side of ``fn`` goes, backward's autograd thread included:
    ``torch.profiler`` CPU events over ``steps`` calls after a warm-up, the ``top`` ops by
    their own CPU time (ms per call, with call counts), and the same grouped by the 4
    innermost Python frames that issued them."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()

    def rows(averages):
        ranked = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:top]
        return [{"op": e.key, "calls": e.count / steps, "self_ms": round(e.self_cpu_time_total / 1e3 / steps, 4),
                 "stack": [frame.split("site-packages/")[-1].split(f"{ROOT}/")[-1] for frame in (e.stack or [])[:4]]}
                for e in ranked]

    averages = prof.key_averages()
    return {"cpu_ms": round(sum(e.self_cpu_time_total for e in averages) / 1e3 / steps, 3),
            "by_op": [{k: v for k, v in r.items() if k != "stack"} for r in rows(averages)],
            "by_stack": rows(prof.key_averages(group_by_stack_n=4))}


def python_profile(fn, seconds: float = 3.0, interval: float = 2e-4, top: int = 30) -> dict:
    """Where the Python time of eager calls of ``fn`` goes, every thread included (autograd
    runs the backward's Python, custom ops' backward among it, on a thread of its own): a
    sampler thread reads the other threads' Python stacks every ``interval`` seconds while
    ``fn`` is called for about ``seconds``. Per thread and function (name, file:line of its
    def), the share of samples it was running in (``self``) and was on the stack in
    (``total``). The GIL's switch interval is cut to ``interval`` meanwhile, else samples
    would fall only where the running thread releases the GIL."""
    import collections
    import sys
    import threading
    import time

    fn()
    torch.cuda.synchronize()
    counts: dict[str, tuple[collections.Counter, collections.Counter]] = {}
    samples: collections.Counter = collections.Counter()
    stop = threading.Event()
    names = {thread.ident: thread.name for thread in threading.enumerate()}

    def where(code) -> str:
        return f"{code.co_name} {code.co_filename.split('site-packages/')[-1].split(f'{ROOT}/')[-1]}:{code.co_firstlineno}"

    def sample() -> None:
        me = threading.get_ident()
        while not stop.is_set():
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, "other")
                own, total = counts.setdefault(name, (collections.Counter(), collections.Counter()))
                samples[name] += 1
                own[where(frame.f_code)] += 1
                stack = set()
                while frame is not None:
                    stack.add(where(frame.f_code))
                    frame = frame.f_back
                total.update(stack)
            time.sleep(interval)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    sampler = threading.Thread(target=sample, daemon=True)
    calls, began = 0, time.perf_counter()
    sampler.start()
    try:
        while time.perf_counter() - began < seconds:
            fn()
            calls += 1
        torch.cuda.synchronize()
    finally:
        stop.set()
        sampler.join()
        sys.setswitchinterval(switch)
    wall = time.perf_counter() - began

    def ranked(counter, n):
        return [{"function": k, "share": round(v / n, 4)} for k, v in counter.most_common(top)]

    return {"ms_per_call": round(1e3 * wall / calls, 3), "calls": calls,
            "threads": {name: {"samples": samples[name], "self": ranked(own, samples[name]), "total": ranked(total, samples[name])}
                        for name, (own, total) in counts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--host-only", action="store_true", help="only the CPU-side profile of each layer")
    parser.add_argument("--python", action="store_true", help="also sample the Python stacks of eager calls of each layer")
    args = parser.parse_args()
    device = "cuda"
    batch, length, hidden = 8, 4096, 1024
    autocast = torch.autocast(device, dtype=torch.bfloat16)
    report = {"environment": environment(), "shape": {"batch": batch, "length": length, "hidden": hidden}, "layer": {}, "parts": {}}
    torch.manual_seed(0)
    x = torch.randn(batch, length, hidden, device=device, requires_grad=True)
    grad = torch.randn_like(x)
    layers = {}
    for name, position in POSITIONS.items():
        layer = layers[name] = build("gla", position, hidden, False, device)

        def step(layer=layer):
            with autocast:
                out = layer(x)[0]
            out.backward(grad)

        report.setdefault("host", {})[name] = host_profile(step)
        print(name, "host", report["host"][name]["cpu_ms"], flush=True)
        if args.python:
            report.setdefault("python", {})[name] = python_profile(step)
            for thread, rows in report["python"][name]["threads"].items():
                print(name, "python", thread, [f"{r['share']:.2f} {r['function']}" for r in rows["self"][:8]], flush=True)
        if not args.host_only:
            report["layer"][name] = profile(step)
            print(name, report["layer"][name]["kernel_ms"], report["layer"][name]["eager_ms"], flush=True)
        write_json(args.out, report)
    if args.host_only:
        return

    pe = layers["selective_rope"].position

    def generator():
        with autocast:
            phi = pe.phase_increments(x, RowLayout(batch, length))[0]
        phi.backward(torch.ones_like(phi))

    report["parts"]["generator"] = profile(generator)
    report["parts"]["generator"]["ops"] = op_profile(generator)
    for row in report["parts"]["generator"]["ops"][:12]:
        print(f"{row['device_ms']:8.4f} {row['op']:<28} {row['shapes']}", flush=True)
    channels = pe.num_heads * pe.pairs
    u = torch.randn(batch, length, channels, device=device, requires_grad=True)
    weight = pe.conv.kernel().detach().clone().requires_grad_()
    layout = RowLayout(batch, length)
    for name in ("torch", "fla"):
        fn = lambda name=name: short_conv(u, weight, layout, activation="silu", backend=name)[0]  # noqa: E731

        def step(fn=fn):
            out = fn()
            out.backward(torch.ones_like(out))

        try:
            report["parts"][f"conv_{name}"] = profile(step, top=8)
        except Exception as error:  # noqa: BLE001 - recorded, the others still run
            report["parts"][f"conv_{name}"] = {"error": repr(error)[-400:]}
        print(name, report["parts"][f"conv_{name}"].get("kernel_ms"), flush=True)
        write_json(args.out, report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
