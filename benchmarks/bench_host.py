"""Host time per call on a GPU: where an eager step's time goes when the GPU waits for the CPU.

Every entry runs at sizes where the GPU's own time is negligible, so the wall time of a call is
what the CPU spends issuing it. From the bottom up: plain Python (the machine's speed), a torch
op, an empty Triton kernel launched through its JIT entry point (few and many arguments, with
and without programmatic dependent launch) and through a ``torch.library`` custom op, then
srope's ops and the GLA layer with each position encoding (forward, forward + backward), and the
Selective RoPE generator and its pieces. Then cProfile of the forward + backward entries named
by ``--profile`` (the backward run on the calling thread), the functions with the most time of
their own.

    python benchmarks/bench_host.py --out out/bench/host.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from common import environment, position_configs, write_json

from srope.layers import GatedLinearAttention
from srope.ops import rope, selective_rope
from srope.ops._triton import await_predecessor
from srope.ops.layout import RowLayout
from srope.ops.rotary import naive as reference


@triton.jit
def _empty3(a, b, c, n):
    pass


@triton.jit
def _empty24(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11,
             n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    pass


@triton.jit
def _empty24_pdl(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11,
                 n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    await_predecessor(True)


def host_us(fn, calls: int, rounds: int = 5) -> dict:
    """Median over rounds of the host microseconds per call (no synchronisation inside a
    round), and the same with the GPU drained at the round's end."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    host, drained = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host.append((issued - start) / calls * 1e6)
        drained.append((done - start) / calls * 1e6)
    return {"host_us": round(statistics.median(host), 2), "drained_us": round(statistics.median(drained), 2),
            "host_us_rounds": [round(h, 2) for h in host]}


def build_cases() -> dict:
    dev = torch.device("cuda")
    small = [torch.zeros(1024, device=dev) for _ in range(12)]
    ints = list(range(1, 13))
    pdl_ok = torch.cuda.get_device_capability()[0] >= 9

    @torch.library.custom_op("srope_bench::empty24", mutates_args=())
    def empty24_op(a: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(a)
        _empty24[(1,)](out, *small[1:], *ints, BLOCK=128, FLAG=True)
        return out

    @empty24_op.register_fake
    def _(a):
        return torch.empty_like(a)

    def loop():
        total = 0
        for i in range(100):
            total += i
        return total

    cases = {
        "python: 100-step loop": loop,
        "torch: a + b (1024 floats)": lambda: small[0] + small[1],
        "torch: empty(1024)": lambda: torch.empty(1024, device=dev),
        "triton: empty kernel, 4 args": lambda: _empty3[(1,)](small[0], small[1], small[2], 5),
        "triton: empty kernel, 24 args + 2 constexpr": lambda: _empty24[(1,)](*small, *ints, BLOCK=128, FLAG=True),
        "custom op: empty_like + empty kernel (24 args)": lambda: empty24_op(small[0]),
    }
    if pdl_ok:
        cases["triton: empty kernel, 24 args, launch_pdl"] = lambda: _empty24_pdl[(1,)](*small, *ints, BLOCK=128, FLAG=True, launch_pdl=True)

    g = torch.Generator().manual_seed(0)
    shape = (1, 16, 4, 128)
    q, k = (torch.randn(*shape, generator=g).to(dev, torch.bfloat16) for _ in range(2))
    phi = (torch.rand(*shape[:3], 64, generator=g) * 2).to(dev, torch.bfloat16)
    temperature = reference.rope_inverse_frequencies(128, 500000.0).to(dev, torch.float32)
    positions = torch.arange(16, device=dev).expand(1, 16)
    leaves = [t.clone().requires_grad_() for t in (q, k, phi)]

    def srope_fwd_bwd():
        q_rot, k_rot = selective_rope(*leaves, temperature, backend="triton")[:2]
        torch.autograd.grad((q_rot.float().sum() + k_rot.float().sum()), leaves)

    with torch.no_grad():
        cases["op: rope forward (1 x 16 x 4 x 128)"] = lambda: rope(q, k, positions, temperature, backend="triton")
        cases["op: selective_rope forward"] = lambda: selective_rope(q, k, phi, temperature, backend="triton")
    cases["op: selective_rope forward + backward (+ 2 sums)"] = srope_fwd_bwd
    cases["torch: the 2 sums + grad of the line above, alone"] = lambda: torch.autograd.grad(
        leaves[0].float().sum() + leaves[1].float().sum(), leaves[:2])

    hidden, length = 256, 64
    x = torch.randn(1, length, hidden, device=dev, requires_grad=True)
    positions_cfg = position_configs(rope={"theta": 500000.0})
    for name, position in positions_cfg.items():
        layer = GatedLinearAttention(hidden_size=hidden, position=position, num_heads=4, expand_k=0.5, expand_v=1.0,
                                     use_short_conv=True).to(dev)

        def fwd(layer=layer):
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                return layer(x)[0]

        def fwd_bwd(layer=layer):
            with torch.autocast("cuda", torch.bfloat16):
                out = layer(x)[0]
            out.float().sum().backward()

        q_in, k_in = (torch.randn(1, length, 4, hidden // 8, device=dev, requires_grad=True) for _ in range(2))

        def module(encoding=layer.position):  # as bench_host_cpu.py times it on a CPU, launches included here
            with torch.autocast("cuda", torch.bfloat16):
                x_cast = encoding.host_input(x)
                q_rot, k_rot, _ = encoding(q_in, k_in, x, x_cast=x_cast)
            (q_rot.float().sum() + k_rot.float().sum() + x_cast.float().sum()).backward()

        cases[f"GLA layer {name}: forward (no grad)"] = fwd
        cases[f"GLA layer {name}: forward + backward"] = fwd_bwd
        cases[f"module {name}: host_input + call + backward"] = module
        if name == "selective_rope":
            pe = layer.position

            def generator(pe=pe):
                with torch.autocast("cuda", torch.bfloat16):
                    increments = pe.phase_increments(x, RowLayout(1, length))[0]
                increments.float().sum().backward()

            def first_layers(pe=pe):
                pe._first_layers(torch.float32)[0].sum().backward()

            def projection(pe=pe):
                with torch.autocast("cuda", torch.bfloat16, enabled=False):
                    parts = pe.project(x, torch.bfloat16)
                sum(part.sum() for part in parts).backward()

            # the generator's pieces, each with what it needs before it: the differences
            # between consecutive rows are the projection's and the conv-gate's own cost
            cases["Selective RoPE generator: first layers (weight norm), fwd + bwd"] = first_layers
            cases["Selective RoPE generator: + normalised projection, fwd + bwd"] = projection
            cases["Selective RoPE generator: forward + backward"] = generator
    return cases


def entries(cases: dict, calls: int) -> dict:
    results = {}
    for name, fn in cases.items():
        try:
            results[name] = host_us(fn, calls)
        except Exception as error:  # noqa: BLE001 - one entry failing must not lose the others
            results[name] = {"error": repr(error)[-300:]}
        print(f"{name:<55} {results[name]}", flush=True)
    return results


def _where(code: tuple) -> str:
    path, line, function = code
    for marker in ("site-packages/", "src/", "benchmarks/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{function} {path}:{line}"


def python_profile(fn, calls: int, top: int = 30) -> list[dict]:
    """cProfile of ``calls`` calls, the backward on this thread (autograd's device threads
    are invisible to cProfile): the functions with the most time of their own, µs per call."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
    torch.cuda.synchronize()
    rows = sorted(pstats.Stats(profiler).stats.items(), key=lambda item: -item[1][2])[:top]
    return [{"function": _where(code), "calls": round(nc / calls, 2), "self_us": round(tt / calls * 1e6, 1), "total_us": round(ct / calls * 1e6, 1)}
            for code, (_, nc, tt, ct, _) in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/bench/host.json")
    parser.add_argument("--calls", type=int, default=200, help="calls per round (5 rounds, median)")
    parser.add_argument("--profile", default="GLA layer,generator", metavar="WORDS",
                        help="cProfile the fwd+bwd entries whose names contain one of these comma-separated words ('' for none)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_host measures launches on a GPU: no CUDA device here")
    cases = build_cases()
    report = {"environment": environment(), "command": " ".join(sys.argv), "calls": args.calls,
              "entries": entries(cases, args.calls), "profiles": {}}
    words = [w for w in args.profile.split(",") if w]
    for name, fn in cases.items():
        if "backward" in name and any(w in name for w in words):
            try:
                report["profiles"][name] = python_profile(fn, args.calls)
            except Exception as error:  # noqa: BLE001
                report["profiles"][name] = [{"error": repr(error)[-300:]}]
            print(name, [f"{r.get('self_us')} {r.get('function')}" for r in report["profiles"][name][:8]], flush=True)
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
