"""Host time of srope's eager calls, measured on a CPU: what the host does around the kernels.

Runs srope's kernel route (``srope.backend.use("triton")``) under Triton's interpreter with
every kernel launch counted and skipped, so the launched kernels cost nothing and their
outputs are garbage: only time and counts are measured. What is left is the Python and
autograd side of each call (validation, routing, allocation, tile arithmetic, autograd nodes),
the part of an eager step's host time that srope's code decides. A GPU machine adds Triton's
launcher per launch (``bench_host.py`` measures both there). For comparing commits where no
GPU is at hand; the numbers are this CPU's, the launch counts are any machine's.

Cases (float32 inputs under bf16 autocast, as a training step): the rotation op; the Selective
RoPE module as a host layer calls it (``host_input``, the call, the backward of q, k and the
host's copy of x), against NoPE and RoPE doing the same; the GLA layer with each encoding
(its mixer runs PyTorch's reference on the CPU: compare encodings, not absolute times). On the
CPU the generator's normalised projection takes its PyTorch route (its kernels are CUDA-only in
the module), so its own ops are in the module's time as PyTorch ops, not as two launches.

    python benchmarks/bench_host_cpu.py --out out/bench/host_cpu.json
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is decorated

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from common import environment, position_configs, write_json  # noqa: E402


class Launches:
    """Counts Triton launches and skips them (the interpreter's ``kernel[grid](...)``)."""

    def __init__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self.count = 0
        counter = self

        def skipped(kernel, grid):
            def launch(*args, **kwargs):
                counter.count += 1

            return launch

        InterpretedFunction.__getitem__ = skipped


def host_us(fn, calls: int, rounds: int) -> float:
    """The fastest round's µs per call: a lower bound that other load on the machine can only raise."""
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return round(best, 1)


def build_cases(hidden: int, length: int, heads: int) -> dict:
    from srope.layers import GatedLinearAttention
    from srope.ops import selective_rope

    g = torch.Generator().manual_seed(0)
    head_dim = hidden // 2 // heads  # GLA's keys: hidden · expand_k (0.5)
    q, k = (torch.randn(1, length, heads, head_dim, generator=g).requires_grad_() for _ in range(2))
    x = torch.randn(1, length, hidden, generator=g).requires_grad_()
    phi = torch.rand(1, length, heads, head_dim // 2, generator=g).requires_grad_()
    temperature = torch.rand(head_dim // 2, generator=g)

    def op():
        q_rot, k_rot, _ = selective_rope(q, k, phi, temperature)
        (q_rot.sum() + k_rot.sum()).backward()

    cases = {"op: selective_rope forward + backward": op}
    for name, position in position_configs(rope={"theta": 500000.0}).items():
        layer = GatedLinearAttention(hidden_size=hidden, num_heads=heads, position=position)
        encoding = layer.position

        def module(encoding=encoding):
            with torch.autocast("cpu", torch.bfloat16):
                x_cast = encoding.host_input(x)
                q_rot, k_rot, _ = encoding(q, k, x, x_cast=x_cast)
            (q_rot.float().sum() + k_rot.float().sum() + x_cast.float().sum()).backward()

        def layer_step(layer=layer):
            with torch.autocast("cpu", torch.bfloat16):
                out = layer(x)[0]
            out.float().sum().backward()

        cases[f"module {name}: host_input + call + backward"] = module
        cases[f"GLA layer {name}: forward + backward"] = layer_step
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/bench/host_cpu.json")
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; the fastest counts")
    parser.add_argument("--shape", default="256,64,4", metavar="HIDDEN,T,HEADS", help="the layer's size (B = 1)")
    args = parser.parse_args()
    hidden, length, heads = (int(v) for v in args.shape.split(","))
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # skipped kernels leave their outputs unwritten: no slow denormals downstream
    launches = Launches()
    from srope import backend

    entries = {}
    with backend.use("triton"):
        for name, fn in build_cases(hidden, length, heads).items():
            fn()
            launches.count = 0
            fn()
            entries[name] = {"launches": launches.count, "host_us": host_us(fn, args.calls, args.rounds)}
            print(f"{name:<50} {entries[name]['host_us']:>9.1f} µs  {entries[name]['launches']:>3} launches", flush=True)
    write_json(args.out, {"environment": environment(), "shape": {"hidden": hidden, "length": length, "heads": heads},
                          "calls": args.calls, "rounds": args.rounds, "entries": entries})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
