"""Real-size checks of the compiled Triton kernels on CUDA, for ``test_gpu.py`` and
``test_decode.py``.

Every check runs on fresh seeded random inputs and returns the relative RMS errors
``‖a−b‖/‖b‖`` against the float64 reference (``srope.ops.rotary.naive``) run on the GPU.
"""

from __future__ import annotations

import math
import os

import torch

from srope import backend
from srope.modules import SelectiveRoPE
from srope.ops import rope, selective_rope
from srope.ops.rotary import naive as reference
from tests.helpers import rel_err

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
PHASE_TOLERANCE_RAD = 1e-3

# (B, T, H, Hk, D, R, packed lengths or None)
SHAPES = {
    "8x4096x4x128": (8, 4096, 4, 4, 128, 64, None),
    "1x65536x4x128": (1, 65536, 4, 4, 128, 64, None),
    "16x4096x16x64": (16, 4096, 16, 16, 64, 32, None),
    "gqa-partial-oddR": (2, 3001, 16, 4, 128, 27, None),
    "packed": (1, 20000, 4, 2, 64, 32, [0, 1, 4095, 0, 7000, 3, 8901]),
}
GRAD_NAMES = ("q", "k", "phi", "temperature", "offset")


def _normal(g, *size, scale=1.0, dtype=torch.float32):
    return (scale * torch.randn(*size, generator=g, device="cuda", dtype=torch.float32)).to(dtype)


def rotation_inputs(shape, dtype, seed=0):
    batch, length, heads, key_heads, dim, pairs, lengths = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k = _normal(g, batch, length, heads, dim, dtype=dtype), _normal(g, batch, length, key_heads, dim, dtype=dtype)
    phi = _normal(g, batch, length, key_heads, pairs, scale=0.5, dtype=dtype)
    temperature = torch.rand(key_heads, pairs, generator=g, device="cuda")
    cu, count = None, batch
    if lengths is not None:
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        cu, count = torch.tensor(bounds, dtype=torch.int32, device="cuda"), len(lengths)
    offset = _normal(g, count, key_heads, pairs, scale=100.0, dtype=torch.float64)
    return [q, k, phi, temperature, offset], cu


def run_rotation(shape, dtype, seed=0):
    """Forward + backward of the kernels and of the float64 reference on the same inputs."""
    inputs, cu = rotation_inputs(shape, dtype, seed)
    leaves = [x.clone().requires_grad_() for x in inputs]
    ref_leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = selective_rope(*leaves[:4], offset=leaves[4], cu_seqlens=cu, output_final_phase=True, backend="triton")
    ref = reference.selective_rope(*ref_leaves, cu_seqlens=cu)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    grads = [torch.randn(x.shape, generator=g, device="cuda", dtype=torch.float64) for x in ref[:2]]
    torch.autograd.backward(out[:2], [x.to(dtype) for x in grads])
    torch.autograd.backward(ref[:2], grads)
    return out, ref, leaves, ref_leaves


def rotation_errors(name: str, dtype: torch.dtype, seed: int = 0) -> dict:
    out, ref, leaves, ref_leaves = run_rotation(SHAPES[name], dtype, seed)
    errors = {"q": rel_err(out[0], ref[0]), "k": rel_err(out[1], ref[1]), "final_phase": rel_err(out[2], ref[2])}
    for label, leaf, ref_leaf in zip(GRAD_NAMES, leaves, ref_leaves):
        errors[f"grad_{label}"] = rel_err(leaf.grad, ref_leaf.grad)
    return errors


def backward_is_deterministic(name: str = "packed", dtype: torch.dtype = torch.bfloat16) -> bool:
    runs = []
    for _ in range(2):
        _, _, leaves, _ = run_rotation(SHAPES[name], dtype, seed=3)
        runs.append([leaf.grad for leaf in leaves])
    return all(torch.equal(a, b) for a, b in zip(*runs))


def phase_error_rad(length: int = 2**20) -> float:
    """Max angle error at T = ``length`` with φ ∈ [0, 2) (Φ reaches ~length rad), float32."""
    pairs = 4
    g = torch.Generator(device="cuda").manual_seed(10)
    phi = (torch.rand(1, length, 1, pairs, generator=g, device="cuda", dtype=torch.float64) * 2).float()
    temperature = torch.tensor([1.0, 0.7, 0.31, 0.013], device="cuda")
    unit = torch.zeros(1, length, 1, 2 * pairs, device="cuda")
    unit[..., :pairs] = 1.0  # rotating (1, 0) gives (cos a, sin a): read the angle back
    q_rot, _, _ = selective_rope(unit, unit, phi, temperature, backend="triton")
    measured = torch.atan2(q_rot[..., pairs:].double(), q_rot[..., :pairs].double())
    exact = temperature.double() * torch.cumsum(phi.double(), dim=1)
    return (torch.remainder(measured - exact + math.pi, 2 * math.pi) - math.pi).abs().max().item()


def rope_errors(dtype: torch.dtype) -> dict:
    g = torch.Generator(device="cuda").manual_seed(4)
    q = _normal(g, 8, 4096, 4, 128, dtype=dtype).requires_grad_()
    k = _normal(g, 8, 4096, 2, 128, dtype=dtype).requires_grad_()
    positions = torch.arange(4096, device="cuda").expand(8, -1) + 100000
    inv_freq = reference.rope_inverse_frequencies(128, 500000.0).cuda()
    out = rope(q, k, positions, inv_freq, backend="triton")
    ref_q, ref_k = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref = reference.rope(ref_q, ref_k, positions, inv_freq)
    grads = [torch.randn(x.shape, generator=g, device="cuda", dtype=torch.float64) for x in ref]
    torch.autograd.backward(out, [x.to(dtype) for x in grads])
    torch.autograd.backward(ref, grads)
    return {"q": rel_err(out[0], ref[0]), "k": rel_err(out[1], ref[1]), "grad_q": rel_err(q.grad, ref_q.grad), "grad_k": rel_err(k.grad, ref_k.grad)}


def fused_decode_step(module, q, k, x, state):
    """The module's cached decode path through the fused kernel."""
    return module.decode_step(q, k, x, state)


def unfused_step(module, q, k, x, state):
    """The same step through the module's PyTorch route (the reference for the fused one;
    on CUDA the module would otherwise take the fused kernel itself)."""
    with backend.use("torch"):
        return module(q, k, x, state=state, use_cache=True)


def decode_errors(dtype: torch.dtype) -> dict:
    """GLA-370M-like generator (hidden 1024, 4 heads, D 128): prefill 16 tokens with the
    module, then 4 steps with the module's path and with the fused step; worst errors."""
    torch.manual_seed(5)
    module = SelectiveRoPE(1024, 4, 128, gate="standard", bias=True).cuda().to(dtype)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 0.5)  # trained-like: gates away from 0.5
    x = torch.randn(8, 20, 1024, device="cuda", dtype=dtype)
    q = torch.randn(8, 20, 4, 128, device="cuda", dtype=dtype)
    k = torch.randn(8, 20, 4, 128, device="cuda", dtype=dtype)
    worst = {"q": 0.0, "k": 0.0, "phase": 0.0, "conv_state": 0.0}
    with torch.no_grad():
        _, _, state = module(q[:, :16], k[:, :16], x[:, :16], use_cache=True)
        torch_state = fused_state = state
        for t in range(16, 20):
            sl = slice(t, t + 1)
            q_ref, k_ref, torch_state = unfused_step(module, q[:, sl], k[:, sl], x[:, sl], torch_state)
            q_out, k_out, fused_state = fused_decode_step(module, q[:, sl], k[:, sl], x[:, sl], fused_state)
            worst["q"] = max(worst["q"], rel_err(q_out, q_ref))
            worst["k"] = max(worst["k"], rel_err(k_out, k_ref))
            worst["phase"] = max(worst["phase"], rel_err(fused_state.phase, torch_state.phase))
            # u comes from its own kernel (another summation order than torch's bmm)
            worst["conv_state"] = max(worst["conv_state"], rel_err(fused_state.conv, torch_state.conv))
    return worst


def compile_and_graph_errors() -> dict:
    """Inductor ``torch.compile(fullgraph=True)`` over the op and a CUDA-graph replay of its
    forward+backward, both against eager (bf16, GQA, with offset)."""
    inputs, _ = rotation_inputs((2, 1000, 4, 2, 64, 32, None), torch.bfloat16, seed=6)
    leaves = [x.requires_grad_() for x in inputs]

    def loss(q, k, phi, temperature, offset):
        q_rot, k_rot, _ = selective_rope(q, k, phi, temperature, offset=offset)
        return (q_rot.float() * k_rot.float().repeat_interleave(2, dim=2)).sum()

    want = torch.autograd.grad(loss(*leaves), leaves)
    explained = torch._dynamo.explain(loss)(*leaves)
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(*leaves), leaves)
    static = [x.detach().clone().requires_grad_() for x in leaves]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            torch.autograd.grad(loss(*static), static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_grads = torch.autograd.grad(loss(*static), static)
    graph.replay()
    torch.cuda.synchronize()
    return {
        "graph_breaks": explained.graph_break_count,
        "compiled_max_err": max(rel_err(a, b) for a, b in zip(got, want)),
        "cuda_graph_max_err": max(rel_err(a, b) for a, b in zip(graph_grads, want)),
    }


def _module_step(module, q, k, x):
    """The layer's Selective RoPE forward and backward (GLA-370M generator, fused path), then,
    with no grad, a cached prefill and one fused decode step."""
    q_rot, k_rot = module(q, k, x)[:2]
    loss = q_rot.float().square().sum() + (k_rot.float() * q_rot.float()).sum()
    params = [p for p in module.parameters() if p.requires_grad]
    outputs = [q_rot, k_rot, *torch.autograd.grad(loss, [q, k, x, *params], allow_unused=True)]
    outputs = [t for t in outputs if t is not None]
    with torch.no_grad():
        _, _, state = module(q[:, :-1], k[:, :-1], x[:, :-1], use_cache=True)
        q_step, k_step, state = module.decode_step(q[:, -1:], k[:, -1:], x[:, -1:], state)
    return [*outputs, q_step, k_step, state.phase]


def programmatic_launch_mismatches() -> dict:
    """The same work with programmatic dependent launch off (``SROPE_PDL=0``) and on, eagerly:
    the rotation op (GQA with offset and temperature gradient; packed) and the Selective RoPE
    module (projection, gate, rotation; cached prefill and decode step). Returns whether PDL
    was in use and the worst relative error with it on against off (0: the same bits). PDL
    inside CUDA graphs is covered by :func:`compile_and_graph_errors` (which runs with it on)."""
    from srope.ops import _triton as ops

    def rotation():
        out = []
        for shape, seed in ((SHAPES["gqa-partial-oddR"], 11), (SHAPES["packed"], 12)):
            rot, _, leaves, _ = run_rotation(shape, torch.bfloat16, seed=seed)
            out += [rot[0], rot[1], *(leaf.grad for leaf in leaves)]
        return out

    torch.manual_seed(13)
    module = SelectiveRoPE(1024, 4, 128, gate="standard", bias=True).cuda()
    x = torch.randn(4, 513, 1024, device="cuda").requires_grad_()
    q = torch.randn(4, 513, 4, 128, device="cuda").requires_grad_()
    k = torch.randn(4, 513, 4, 128, device="cuda").requires_grad_()

    def everything():
        return [t.clone() for t in rotation() + _module_step(module, q, k, x)]

    previous = os.environ.get(ops.PDL_ENV)
    try:
        os.environ[ops.PDL_ENV] = "0"
        want = everything()
        os.environ[ops.PDL_ENV] = "1"
        active = bool(ops.pdl(q))
        got = everything()
    finally:
        if previous is None:
            os.environ.pop(ops.PDL_ENV, None)
        else:
            os.environ[ops.PDL_ENV] = previous
    return {"pdl_active": active, "eager": max(rel_err(a, b) for a, b in zip(got, want))}
