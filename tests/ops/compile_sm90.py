"""Compile every Triton kernel of srope for an H100/H200 (sm_90) on a machine without a GPU.

The op wrappers run on CPU tensors with the kernel launches replaced by recorders; every
distinct launch (and every autotune config) is then compiled through Triton's full
pipeline down to ptxas, as a GPU with programmatic dependent launch gets them
(``ops.pdl``). Prints one JSON line per kernel variant with the registers and
spill bytes ptxas reports, whether the PTX waits for the previous kernel, the layout conversions in the TTGIR (most of them a round trip
through shared memory) and the approximate instructions found in the PTX.

    python -m tests.ops.compile_sm90     (TRITON_INTERPRET must be unset)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from srope.ops.generator import gate as head_gate
from srope.ops.generator import projection_kernels as projection_grad
from srope.ops.generator import weights as head_weights
from srope.ops.rotary import chunk as ops
from srope.ops.rotary import decode, kernels

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
APPROX = re.compile(r"\b((?:sin|cos|ex2|lg2|rsqrt|sqrt|rcp|tanh|div)\.approx[.\w]*)")
# sin.approx / cos.approx are what accurate kernels must never use (their error grows with the
# angle); libdevice's exp is accurate and uses ex2.approx internally after its own reduction.
FORBIDDEN = ("sin.approx", "cos.approx")
TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64", torch.int32: "*i32", torch.int64: "*i64"}


class Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records instead of launching."""

    def __init__(self, kernel, name, calls):
        self.fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
        self.configs = kernel.configs if isinstance(kernel, triton.runtime.Autotuner) else None
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self, args, kwargs))


def with_pdl(_x) -> dict:
    return {"PDL": True, "launch_pdl": True}


def record_launches() -> list:
    calls = []
    for module in (ops, decode, head_gate, head_weights, projection_grad):
        module.pdl = with_pdl
    for name in ("chunk_sum_kernel", "chunk_scan_fwd_kernel", "chunk_scan_bwd_kernel", "dphi_kernel",
                 "srope_fwd_kernel", "srope_bwd_kernel"):
        setattr(kernels, name, Recorder(getattr(kernels, name), name, calls))
    for name in ("_rope_fwd", "_rope_bwd"):
        setattr(ops, name, Recorder(getattr(ops, name), name, calls))
    decode.decode_step_kernel = Recorder(decode.decode_step_kernel, "decode_step_kernel", calls)
    decode.generator_inputs_kernel = Recorder(decode.generator_inputs_kernel, "generator_inputs_kernel", calls)
    # (dim, pairs, block_t, dtype, packed): the 8x4096x4x128 and 16x4096x16x64 benchmarks' tiles
    # (every RoPE autotune config); odd R with partial rotary, float32, packed (the first config only).
    cases = ((128, 64, ops.default_block_t(8, 4096, 4, 64), torch.bfloat16, False),
             (64, 32, ops.default_block_t(16, 4096, 16, 32), torch.bfloat16, False), (10, 3, 16, torch.float32, True))
    for dim, pairs, block_t, dtype, packed in cases:
        batch = 1 if packed else 2
        q = torch.zeros(batch, 40, 4, dim, dtype=dtype)
        k = torch.zeros(batch, 40, 2, dim, dtype=dtype)
        phi = torch.zeros(batch, 40, 2, pairs, dtype=dtype)
        temperature, offset = torch.ones(2, pairs), torch.zeros(3 if packed else batch, 2, pairs, dtype=torch.float64)
        cu = torch.tensor([0, 5, 5, 40], dtype=torch.int32) if packed else None
        tables = ops.chunk_tables(cu, 40, block_t) if packed else (None, None)
        base = ops.selective_rope_fwd(q, k, phi, temperature, offset, cu, *tables, block_t)[3]
        for flags in ((True, False, False), (True, True, True)):
            ops.selective_rope_bwd(q, k, q, k, phi, temperature, base, cu, *tables, block_t, *flags)
        positions, inv_freq = torch.arange(40)[None].expand(batch, 40), torch.ones(pairs, dtype=torch.float64)
        ops.rope_fwd(q, k, positions, inv_freq, block_t)
        ops.rope_bwd(q, k, q, k, positions, inv_freq, block_t, True)
    bf16 = dict(dtype=torch.bfloat16)
    decode._decode_op(
        torch.zeros(8, 1, 4, 128, **bf16), torch.zeros(8, 1, 4, 128, **bf16), torch.zeros(8, 256, **bf16),
        torch.zeros(8, 256, 3, **bf16), torch.zeros(256, 4), torch.zeros(8, 4, 64, dtype=torch.float64), torch.ones(64),
        None, torch.zeros(4, 64), torch.zeros(8, 4, **bf16), True,
    )
    decode._inputs_op(torch.zeros(8, 1024, **bf16), torch.zeros(4, 256, 68), torch.zeros(4), 64, 1e-6)  # GLA-370M, standard gate
    # the step that computes those inputs itself (GLA-370M's generator in float32: a float32 conv state)
    decode._decode_op(
        torch.zeros(8, 1, 4, 128, **bf16), torch.zeros(8, 1, 4, 128, **bf16), None, torch.zeros(8, 256, 3), torch.zeros(256, 4),
        torch.zeros(8, 4, 64, dtype=torch.float64), torch.ones(64), None, torch.zeros(4, 64), None, True,
        torch.zeros(8, 1024, **bf16), torch.zeros(4, 256, 68), torch.zeros(4), 1e-6,
    )
    # the generator projection's backward at GLA-370M, with and without the weight gradient
    projection_grad.backward_kernel = Recorder(projection_grad.backward_kernel, "backward_kernel", calls)
    # (and with the host's gradient of the forward's cast added in: x is then that bf16 cast)
    for host_grad, weight_grad in ((None, True), (None, False), (torch.zeros(64, 4, 256, **bf16), True)):
        x = torch.zeros(64, 4, 256) if host_grad is None else torch.zeros(64, 4, 256, **bf16)
        projection_grad._backward_op(torch.zeros(64, 4, 68), None, torch.zeros(64, 4, 68), None, torch.zeros(64, 4),
                                     torch.zeros(4, 256, 68, **bf16), x, host_grad, weight_grad)
    # split as the generator runs it with the standard gate: the ω map's 64 columns, then the
    # gate's 4 shares, whose gradient is a broadcast over heads
    projection_grad._backward_op(torch.zeros(64, 4, 64), torch.zeros(64, 1, 4).expand(64, 4, 4), torch.zeros(64, 4, 64),
                                 torch.zeros(64, 4, 4), torch.zeros(64, 4), torch.zeros(4, 256, 68, **bf16),
                                 torch.zeros(64, 4, 256, **bf16), torch.zeros(64, 4, 256, **bf16), True)
    # and its float32 forward (with the weight's split)
    for name in ("split_weight_kernel", "forward_kernel"):
        setattr(projection_grad, name, Recorder(getattr(projection_grad, name), name, calls))
    for cast, split in ((None, None), (torch.bfloat16, None), (torch.bfloat16, 64)):
        projection_grad._forward_op(torch.zeros(64, 4, 256), torch.zeros(4, 256, 68), 1e-6, cast, split)
    # the generator's phase gate at GLA-370M (4 heads x 64 pairs), with and without the bias and SiLU
    for name in ("apply_fwd_kernel", "apply_bwd_kernel"):
        setattr(head_gate, name, Recorder(getattr(head_gate, name), name, calls))
    c, y, gate_bias, e = torch.zeros(64, 256), torch.zeros(64, 4, 4), torch.zeros(4), torch.zeros(4, 64)
    for bias, silu in ((e, True), (None, False)):
        head_gate._apply_op(c, y, gate_bias, bias, silu)
        head_gate._apply_bwd_op(torch.zeros(64, 4, 64), c, y, gate_bias, bias, silu)
    # and with the conv fused in (4 taps; with and without the conv's bias, e and SiLU)
    for name in ("conv_gate_fwd_kernel", "conv_gate_bwd_kernel", "conv_taps_bwd_kernel"):
        setattr(head_gate, name, Recorder(getattr(head_gate, name), name, calls))
    u, w, conv_bias = torch.zeros(2, 32, 256), torch.zeros(256, 4), torch.zeros(256)
    for biases, silu in (((conv_bias, e), True), ((None, None), False)):
        head_gate._conv_gate_op(u, w, biases[0], y, gate_bias, biases[1], silu)
        head_gate._conv_gate_bwd_op(torch.zeros(64, 4, 64), u, w, biases[0], y, gate_bias, biases[1], silu)
    # wider heads (head_dim 256) and a longer conv: fewer tokens per backward program
    for pairs, width in ((128, 4), (64, 5)):
        u, w, conv_bias, e = torch.zeros(2, 32, 4 * pairs), torch.zeros(4 * pairs, width), torch.zeros(4 * pairs), torch.zeros(4, pairs)
        head_gate._conv_gate_op(u, w, conv_bias, y, gate_bias, e, True)
        head_gate._conv_gate_bwd_op(torch.zeros(64, 4, pairs), u, w, conv_bias, y, gate_bias, e, True)
    # the generator's weight-normed first layers at GLA-370M: the standard gate's 4 logits, a
    # low-rank gate's 16, no gate
    for name in ("weights_fwd_kernel", "weights_bwd_kernel"):
        setattr(head_weights, name, Recorder(getattr(head_weights, name), name, calls))
    for gates in (4, 16, 0):
        gate = torch.zeros(gates, 1024) if gates else None
        head_weights._weights_op(torch.zeros(4, 256, 64), torch.ones(4), gate)
        head_weights._weights_bwd_op(torch.zeros(4, 256, 64 + gates), torch.zeros(4, 256, 64), torch.ones(4), gates)
    return calls


def signature(recorder, args, kwargs, extra):
    """The argument types, the constexprs and the JIT's specialisation: on the GPU every
    tensor's address and every integer that is a multiple of 16 is marked divisible by 16
    (which lets Triton vectorise; without it the registers reported here are not the GPU's),
    and an integer equal to 1 becomes a constexpr."""
    fn = recorder.fn
    values = dict(zip(fn.arg_names, args))
    values.update({name: value for name, value in kwargs.items() if name in fn.arg_names})
    values.update(extra)
    sig, constants, attrs = {}, {}, {}
    divisible = [["tt.divisibility", 16]]
    for index, name in enumerate(fn.arg_names):
        value = values[name] if name in values else fn.params[index].default  # a constexpr left at its default
        if fn.params[index].is_constexpr or value is None:
            sig[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[name], attrs[(index,)] = TYPES[value.dtype], divisible  # CUDA allocations are 256-byte aligned
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value == 1:
            sig[name], constants[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = divisible
    return sig, constants, attrs


def ptxas_report(ptx: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as handle:
            handle.write(ptx)
        out = subprocess.run([PTXAS, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out)]
    return {"registers": registers, "spill_bytes": sum(spills)}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be decorated for compilation")
    seen = set()
    for recorder, args, kwargs in record_launches():
        configs = recorder.configs or [None]
        if recorder.configs and args[0].dtype == torch.float32:
            configs = configs[:1]  # the odd-R float32 case: one config is enough
        for config in configs:
            extra = dict(config.kwargs) if config is not None else {}
            warps = config.num_warps if config is not None else kwargs.get("num_warps", 4)
            sig, constants, attrs = signature(recorder, args, kwargs, extra)
            key = (recorder.name, warps, tuple(sorted(sig.items())), tuple(sorted((k, repr(v)) for k, v in constants.items())),
                   tuple(sorted(attrs)))
            if key in seen:
                continue
            seen.add(key)
            options = {"num_warps": warps, **{name: kwargs[name] for name in ("maxnreg", "num_stages", "launch_pdl") if name in kwargs}}
            compiled = triton.compile(ASTSource(recorder.fn, sig, constants, attrs), target=TARGET, options=options)
            ptx = compiled.asm["ptx"]
            tile = {name: constants.get(name) for name in ("R", "BT", "ST", "F64", "CAST", "HOST_GRAD", "WEIGHT_GRAD")
                    if name in constants}
            print(json.dumps({"kernel": recorder.name, "warps": warps, **tile, **ptxas_report(ptx),
                              "shared_bytes": compiled.metadata.shared,
                              "layout_conversions": compiled.asm["ttgir"].count("ttg.convert_layout"),
                              "approx": sorted(set(APPROX.findall(ptx))),
                              "launch_pdl": bool(options.get("launch_pdl")), "waits": "griddepcontrol.wait" in ptx}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
