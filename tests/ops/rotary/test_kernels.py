"""The Triton rotation kernels (Selective RoPE and fixed RoPE) against the float64 reference.

Small shapes, sized for the interpreter; ``block_t`` is set small so that short
sequences still span several chunks (and chunk boundaries fall inside sequences).
"""

from __future__ import annotations

import math

import pytest
import torch

import srope.ops.rotary.chunk as triton_ops
from srope.ops import rope, selective_rope
from srope.ops.rotary import naive as reference
from srope.ops.rotary.chunk import (
    chunk_tables,
    default_block_t,
    rope_triton,
    selective_rope_triton,
)
from tests.helpers import generator, randn, rel_err

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)

# (B, T, H, Hk, D, R, cu_seqlens, block_t)
SHAPES = [
    (1, 1, 1, 1, 2, 1, None, 16),  # T = 1, one pair
    (2, 7, 2, 2, 8, 4, None, 4),  # odd T, 2 chunks, the last one partial
    (2, 13, 4, 2, 10, 3, None, 4),  # GQA, odd R, partial rotary (2R = 6 < D = 10)
    (3, 37, 2, 1, 6, 3, None, 8),  # T not a multiple of the block: 5 chunks
    (1, 23, 2, 1, 8, 4, [0, 5, 5, 6, 12, 23], 4),  # packed: empty and one-token sequences
    # many chunks per sequence: 35 (the last partial); packed, 1 to 33 and an empty sequence
    (2, 69, 2, 2, 4, 2, None, 2),
    (1, 150, 2, 1, 6, 3, [0, 1, 38, 38, 103, 150], 2),
]
IDS = ["T1", "oddT", "gqa-oddR-partial", "chunks", "packed", "many-chunks", "many-chunks-packed"]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
NAMES = ("q", "k", "phi", "temperature", "offset")


def make_inputs(shape, seed, dtype, device, per_head_temperature=True, with_offset=True):
    batch, length, heads, key_heads, dim, pairs, cu, _ = shape
    g = generator(seed)
    q = randn(batch, length, heads, dim, seed_gen=g, dtype=dtype).to(device)
    k = randn(batch, length, key_heads, dim, seed_gen=g, dtype=dtype).to(device)
    phi = randn(batch, length, key_heads, pairs, seed_gen=g, dtype=dtype).to(device)
    temp_shape = (key_heads, pairs) if per_head_temperature else (pairs,)
    temp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    temperature = (torch.rand(*temp_shape, generator=g, dtype=torch.float64) * 2).to(device, temp_dtype)
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    count = batch if cu is None else len(cu) - 1
    offset = randn(count, key_heads, pairs, seed_gen=g, scale=30.0).to(device) if with_offset else None
    return [q, k, phi, temperature, offset], cu_seqlens


def run_both(shape, dtype, device, seed=0, **kwargs):
    """Forward + backward of the kernels and of the float64 reference on the same inputs."""
    inputs, cu = make_inputs(shape, seed, dtype, device, **kwargs)
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    out = selective_rope_triton(*leaves, cu_seqlens=cu, block_t=shape[-1])
    ref = reference.selective_rope(*ref_leaves, cu_seqlens=cu)
    g = generator(seed + 1)
    grads = [randn(*x.shape, seed_gen=g).to(device) for x in ref[:2]]
    torch.autograd.backward(out[:2], [x.to(dtype) for x in grads])
    torch.autograd.backward(ref[:2], grads)
    return out, ref, leaves, ref_leaves


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_forward_and_all_gradients_match_float64(shape, dtype, device):
    out, ref, leaves, ref_leaves = run_both(shape, dtype, device)
    tol = TOLERANCE[dtype]
    assert out[0].dtype == dtype and out[1].dtype == dtype and out[2].dtype == torch.float64
    assert rel_err(out[0], ref[0]) < tol and rel_err(out[1], ref[1]) < tol
    assert rel_err(out[2], ref[2]) < 1e-13  # the final phase is summed in float64 throughout
    for name, leaf, ref_leaf in zip(NAMES, leaves, ref_leaves):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype, name
        assert rel_err(leaf.grad, ref_leaf.grad) < tol, (name, rel_err(leaf.grad, ref_leaf.grad))


@pytest.mark.parametrize("index", [5, 6], ids=IDS[5:7])
def test_chunk_scans_in_several_steps(index, device, monkeypatch):
    """The chunk scans walk a sequence's chunks BC at a time, loading the next step's before
    scanning this one's; on the GPU a step holds up to 1024 chunks, here 4 (odd channel
    blocks too), so that the walk takes several steps, the last one partial."""
    monkeypatch.setattr(triton_ops, "_scan_tile", lambda chunks, block_r: {"BC": 4, "BRS": 2, "num_warps": 4})
    out, ref, leaves, ref_leaves = run_both(SHAPES[index], torch.float32, device, seed=15)
    assert rel_err(out[0], ref[0]) < 1e-4 and rel_err(out[1], ref[1]) < 1e-4 and rel_err(out[2], ref[2]) < 1e-13
    for name, leaf, ref_leaf in zip(NAMES, leaves, ref_leaves):
        assert rel_err(leaf.grad, ref_leaf.grad) < 1e-4, (name, rel_err(leaf.grad, ref_leaf.grad))


@pytest.mark.parametrize("per_head", [False, True], ids=["shared-temperature", "per-head-temperature"])
def test_without_offset_and_shared_temperature(per_head, device):
    shape = (2, 11, 4, 2, 8, 4, None, 4)
    out, ref, leaves, ref_leaves = run_both(shape, torch.float32, device, per_head_temperature=per_head, with_offset=False)
    assert rel_err(out[0], ref[0]) < 1e-4 and rel_err(out[1], ref[1]) < 1e-4
    for name, leaf, ref_leaf in zip(NAMES[:4], leaves, ref_leaves):
        assert leaf.grad.shape == leaf.shape and rel_err(leaf.grad, ref_leaf.grad) < 1e-4, name


def test_gradients_only_for_inputs_that_need_them(device):
    inputs, _ = make_inputs(SHAPES[2], 3, torch.float32, device)
    q, k, phi, temperature, offset = inputs
    q.requires_grad_()
    q_rot, k_rot, _ = selective_rope_triton(q, k, phi, temperature, offset, block_t=4)
    (q_rot.square().sum() + k_rot.sum()).backward()
    ref_q = q.detach().double().requires_grad_()
    ref = reference.selective_rope(ref_q, k.double(), phi.double(), temperature.double(), offset)
    ref[0].square().sum().backward()
    assert rel_err(q.grad, ref_q.grad) < 1e-4
    assert phi.grad is None and temperature.grad is None and offset.grad is None


@pytest.mark.parametrize("wanted", ["offset", "temperature", "phi", "offset+temperature"])
def test_each_parameter_gradient_alone(wanted, device):
    """Gradients of the phase inputs one at a time, q and k constants: the backward's flags
    select its work per gradient (the offset's gradient was once zero without phi's)."""
    inputs, _ = make_inputs(SHAPES[3], 13, torch.float32, device)
    names = wanted.split("+")
    leaves = [x.clone().requires_grad_(name in names) for name, x in zip(NAMES, inputs)]
    ref_leaves = [x.detach().double().requires_grad_(name in names) for name, x in zip(NAMES, inputs)]
    out = selective_rope_triton(*leaves, block_t=8)
    ref = reference.selective_rope(*ref_leaves)
    weights = [randn(*x.shape, seed_gen=generator(14)).to(device) for x in ref[:2]]
    sum((o * w.to(o.dtype)).sum() for o, w in zip(out[:2], weights)).backward()
    sum((o * w).sum() for o, w in zip(ref[:2], weights)).backward()
    for name, leaf, ref_leaf in zip(NAMES, leaves, ref_leaves):
        if name in names:
            assert rel_err(leaf.grad, ref_leaf.grad) < 1e-4, (name, rel_err(leaf.grad, ref_leaf.grad))
        else:
            assert leaf.grad is None, name


@pytest.mark.parametrize("used", ["q", "k"])
def test_gradients_when_one_rotated_output_is_unused(used, device):
    """The loss reads only q_rot (or only k_rot): the other output's gradient reaches the
    backward as None (no zero-filled gradients are materialised) and counts as zero."""
    inputs, _ = make_inputs(SHAPES[3], 5, torch.float32, device)
    leaves = [x.clone().requires_grad_() for x in inputs]
    ref_leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = selective_rope_triton(*leaves, block_t=8)
    ref = reference.selective_rope(*ref_leaves)
    index = 0 if used == "q" else 1
    weight = randn(*ref[index].shape, seed_gen=generator(6)).to(device)
    (out[index] * weight).sum().backward()
    (ref[index] * weight).sum().backward()
    for name, leaf, ref_leaf in zip(NAMES, leaves, ref_leaves):
        expected = ref_leaf.grad if ref_leaf.grad is not None else torch.zeros_like(ref_leaf)
        assert leaf.grad is not None and rel_err(leaf.grad, expected) < 1e-4, name


@pytest.mark.parametrize(
    "shape", [(1, 6, 2, 1, 6, 2, None, 4), (1, 7, 2, 1, 4, 2, [0, 3, 3, 7], 2)], ids=["gqa-partial", "packed"]
)
def test_gradcheck_float64(shape, device):
    """Finite differences through the kernels in float64 (fast mode: random projections of
    the Jacobian, so the interpreter runs the kernels a few dozen times, not thousands)."""
    inputs, cu = make_inputs(shape, 4, torch.float64, device)
    leaves = [x.clone().requires_grad_() for x in inputs]

    def fn(*args):
        return selective_rope_triton(*args, cu_seqlens=cu, block_t=shape[-1])[:2]

    assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)


def test_backward_is_bitwise_deterministic(device):
    shape = (1, 45, 4, 2, 8, 4, [0, 9, 9, 30, 45], 8)
    grads = []
    for _ in range(2):
        _, _, leaves, _ = run_both(shape, torch.float32, device, seed=5)
        grads.append([leaf.grad for leaf in leaves])
    for name, a, b in zip(NAMES, *grads):
        assert torch.equal(a, b), name


def test_public_op_dispatches_to_the_kernels(device, monkeypatch):
    inputs, cu = make_inputs(SHAPES[4], 6, torch.float32, device)
    out = selective_rope(*inputs[:4], offset=inputs[4], cu_seqlens=cu, output_final_phase=True, backend="triton")
    ref = selective_rope(*inputs[:4], offset=inputs[4], cu_seqlens=cu, output_final_phase=True, backend="torch")
    assert rel_err(out[0], ref[0]) < 1e-4 and rel_err(out[1], ref[1]) < 1e-4 and rel_err(out[2], ref[2]) < 1e-13
    assert out[2].dtype == torch.float64 and not out[2].requires_grad
    calls = []
    monkeypatch.setattr(triton_ops, "selective_rope_triton", lambda *a, **kw: calls.append(1) or ref)
    selective_rope(*inputs[:4], cu_seqlens=cu, backend="triton")
    selective_rope(*inputs[:4], cu_seqlens=cu, backend="auto")
    assert len(calls) == (2 if device == "cuda" else 1)  # "auto" takes the kernels only for CUDA tensors


def test_forcing_triton_on_the_cpu_without_the_interpreter_is_an_error(monkeypatch):
    inputs, _ = make_inputs(SHAPES[1], 7, torch.float32, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors, or TRITON_INTERPRET=1"):
        selective_rope(*inputs[:4], backend="triton")
    with pytest.raises(ValueError, match="needs CUDA tensors, or TRITON_INTERPRET=1"):
        rope(inputs[0], inputs[1], torch.zeros(2, 7, dtype=torch.long), torch.ones(4), backend="triton")


@pytest.mark.parametrize("split", [1, 6, 13])
def test_chunked_prefill_continues_from_the_final_phase(split, device):
    inputs, _ = make_inputs((2, 19, 2, 1, 8, 4, None, 4), 8, torch.float32, device)
    q, k, phi, temperature, offset = inputs
    full = selective_rope_triton(q, k, phi, temperature, offset, block_t=4)
    a = selective_rope_triton(q[:, :split], k[:, :split], phi[:, :split], temperature, offset, block_t=4)
    b = selective_rope_triton(q[:, split:], k[:, split:], phi[:, split:], temperature, a[2], block_t=4)
    assert rel_err(torch.cat([a[0], b[0]], 1), full[0]) < 1e-6
    assert rel_err(torch.cat([a[1], b[1]], 1), full[1]) < 1e-6
    assert rel_err(b[2], full[2]) < 1e-14


def test_non_contiguous_inputs(device):
    """q/k as views of a fused projection, phi with a strided batch: the kernels take strides."""
    g = generator(9)
    qkv = randn(2, 17, 3 * 4 * 8, seed_gen=g, dtype=torch.float32).to(device)
    q = qkv[..., : 4 * 8].unflatten(-1, (4, 8))
    k = qkv[..., 4 * 8 : 6 * 8].unflatten(-1, (2, 8))
    phi = randn(4, 17, 2, 3, seed_gen=g, dtype=torch.float32).to(device)[::2]
    temperature = torch.rand(3, generator=g).to(device)
    out = selective_rope_triton(q, k, phi, temperature, block_t=8)
    ref = reference.selective_rope(q.double(), k.double(), phi.double(), temperature.double())
    assert not q.is_contiguous() and not phi.is_contiguous()
    assert rel_err(out[0], ref[0]) < 1e-5 and rel_err(out[1], ref[1]) < 1e-5


def test_chunk_tables():
    cu = torch.tensor([0, 5, 5, 6, 12, 23], dtype=torch.int32)
    cu_chunks, chunk_seq = chunk_tables(cu, 23, 4)
    # chunks per sequence: 2, 0, 1, 2, 3 -> 8 chunks; 6 + 5 = 11 slots, the last 3 unused.
    assert cu_chunks.tolist() == [0, 2, 2, 3, 5, 8]
    assert chunk_seq.tolist() == [0, 0, 2, 3, 3, 4, 4, 4, 5, 5, 5]
    assert default_block_t(8, 4096, 4) == 16 and default_block_t(16, 4096, 16, 32) == 32
    assert default_block_t(1, 4096, 4) == 16 and default_block_t(1, 1, 1) == 16 and default_block_t(64, 4096, 4, 3) == 128


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_long_sequence_phase_accuracy(device, monkeypatch, fast):
    """T = 2^15 tokens with Φ up to ~3e4 rad, 256-token chunks in 64-token sub-tiles.
    Exact path (float32 q/k): the angle error is the float32 rounding of an angle in
    [0, 2π) (~1e-6 rad); fast path (taken for 16-bit q/k, forced here for float32 so
    that the angle can be read back): a few float32 roundings of an angle below 2π plus
    one sub-tile's increments (< 2π + 128 rad). Either is independent of T, where a
    float32 running sum is off by more than 1e-3 rad."""
    length, pairs = 2**15, 4
    g = generator(10)
    phi = (torch.rand(1, length, 1, pairs, generator=g, dtype=torch.float64) * 2).float().to(device)
    temperature = torch.tensor([1.0, 0.7, 0.31, 0.013], device=device)
    unit = torch.zeros(1, length, 1, 2 * pairs, device=device)
    unit[..., :pairs] = 1.0  # rotating (1, 0) gives (cos a, sin a): read the angle back
    sub = triton_ops.MAX_SUB_T
    monkeypatch.setattr(triton_ops, "INTERPRET_SUB_T", sub)  # as on the GPU
    if fast:
        monkeypatch.setattr(triton_ops, "FAST_SCAN_DTYPES", (torch.float32,))
    q_rot, _, final = selective_rope_triton(unit, unit, phi, temperature, block_t=256)
    measured = torch.atan2(q_rot[..., pairs:].double(), q_rot[..., :pairs].double()).cpu()
    phase = torch.cumsum(phi.double().cpu(), dim=1)
    exact = temperature.double().cpu() * phase
    error = torch.remainder(measured - exact + math.pi, 2 * math.pi) - math.pi
    bound = 8 * (2 * math.pi + sub * 2.0) * 2.0**-24 if fast else 2e-6
    assert error.abs().max().item() < bound, (error.abs().max().item(), bound)
    assert rel_err(final.cpu(), phase[:, -1]) < 1e-14
    naive = temperature.cpu() * torch.cumsum(phi.cpu(), dim=1)
    naive_error = torch.remainder(naive.double() - exact + math.pi, 2 * math.pi) - math.pi
    assert naive_error.abs().max().item() > 1e-3


# ---------------------------------------------------------------------- fixed RoPE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_forward_and_backward(dtype, device):
    g = generator(11)
    batch, length, heads, key_heads, dim, pairs = 2, 21, 4, 2, 12, 5
    q = randn(batch, length, heads, dim, seed_gen=g, dtype=dtype).to(device).requires_grad_()
    k = randn(batch, length, key_heads, dim, seed_gen=g, dtype=dtype).to(device).requires_grad_()
    positions = torch.randint(0, 10**6, (batch, length), generator=g).to(device)  # large positions
    inv_freq = reference.rope_inverse_frequencies(2 * pairs, 10000.0).to(device).requires_grad_()
    out = rope_triton(q, k, positions, inv_freq, block_t=8)
    ref_q, ref_k = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref_f = inv_freq.detach().clone().requires_grad_()
    ref = reference.rope(ref_q, ref_k, positions, ref_f)
    grads = [randn(*x.shape, seed_gen=g).to(device) for x in ref]
    torch.autograd.backward(out, [x.to(dtype) for x in grads])
    torch.autograd.backward(ref, grads)
    tol = TOLERANCE[dtype]
    assert rel_err(out[0], ref[0]) < tol and rel_err(out[1], ref[1]) < tol
    assert rel_err(q.grad, ref_q.grad) < tol and rel_err(k.grad, ref_k.grad) < tol
    assert rel_err(inv_freq.grad, ref_f.grad) < tol


def test_rope_public_op(device):
    g = generator(12)
    q = randn(1, 9, 2, 8, seed_gen=g, dtype=torch.float32).to(device)
    positions = torch.arange(9, device=device)[None] + 5
    inv_freq = reference.rope_inverse_frequencies(8, 500000.0).to(device)
    out = rope(q, q, positions, inv_freq, backend="triton")
    ref = rope(q, q, positions, inv_freq, backend="torch")
    assert rel_err(out[0], ref[0]) < 1e-5 and rel_err(out[1], ref[1]) < 1e-5


@pytest.mark.parametrize("op", ["selective_rope", "rope"])
def test_backward_keeps_the_rotated_outputs_not_the_inputs(op, device):
    """The backward reads the rotated q and k (which the host's own op keeps for its
    backward), so q and k themselves are not held until then; a rotated output changed in
    place before the backward is refused by autograd, never read silently."""
    inputs, _ = make_inputs(SHAPES[2], 7, torch.bfloat16, device)
    q, k = (x.clone().requires_grad_() for x in inputs[:2])
    saved = []

    def run():
        if op == "rope":
            positions = torch.arange(q.shape[1], device=device).expand(q.shape[0], -1)
            return rope_triton(q, k, positions, reference.rope_inverse_frequencies(2 * 3, 10000.0).to(device), block_t=4)
        return selective_rope_triton(q, k, *inputs[2:], block_t=4)[:2]

    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        q_rot, k_rot = run()
    pointers = {t.data_ptr() for t in saved}
    assert {q_rot.data_ptr(), k_rot.data_ptr()} <= pointers and not {q.data_ptr(), k.data_ptr()} & pointers
    q_rot, k_rot = run()  # (without the hooks: with them autograd checks no versions)
    q_rot.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (q_rot.float().sum() + k_rot.float().sum()).backward()


# (B, T, Hk, R, cu_seqlens, block_t, the token given a NaN φ, scan tile): the NaN inside a
# chunk and at a chunk's first token with the scans in one step; in a later chunk and in the
# second packed sequence with the scans walking 2 chunks a step
NAN_CASES = [
    (1, 32, 1, 2, None, None, 20, None),
    (2, 37, 2, 3, None, 8, 16, None),
    (1, 69, 1, 2, None, 2, 50, 2),
    (1, 23, 2, 2, [0, 9, 23], 4, 14, 2),
]


@pytest.mark.parametrize("case", NAN_CASES, ids=["in-chunk", "chunk-start", "many-chunks", "packed"])
def test_a_nan_phase_reaches_no_earlier_token(case, device, monkeypatch):
    """Causality holds for non-finite values too, as in the PyTorch path: a NaN φ at token t
    leaves every output before t (and the other sequences) as it was, and a NaN gradient at
    token t leaves dφ after t finite. A chunk's starting phase and a chunk's gradient carry
    are exclusive sums, which ``inclusive - x`` would turn into NaN for the whole chunk."""
    batch, length, key_heads, pairs, cu, block_t, bad, tile = case
    if tile is not None:
        monkeypatch.setattr(triton_ops, "_scan_tile", lambda chunks, block_r: {"BC": tile, "BRS": 2, "num_warps": 4})
    inputs, cu_seqlens = make_inputs((batch, length, 2 * key_heads, key_heads, 2 * pairs + 2, pairs, cu, 0), 21, torch.float32, device)
    q, k, phi, temperature, offset = inputs
    clean = selective_rope_triton(q, k, phi, temperature, offset, cu_seqlens, block_t=block_t)
    poisoned = phi.clone()
    poisoned[:, bad] = float("nan")
    out = selective_rope_triton(q, k, poisoned, temperature, offset, cu_seqlens, block_t=block_t)
    first = 0 if cu is None else max(s for s in cu if s <= bad)  # the poisoned token's sequence
    for got, want in zip(out[:2], clean[:2]):
        assert torch.equal(got[:, :bad], want[:, :bad])
        assert got[:, bad:].isnan().any()
    if cu is not None:
        after = next(s for s in cu if s > bad)
        assert torch.equal(out[0][:, after:], clean[0][:, after:]) and first > 0

    leaf = phi.clone().requires_grad_()
    q_rot, k_rot, _ = selective_rope_triton(q, k, leaf, temperature, offset, cu_seqlens, block_t=block_t)
    grad = torch.ones_like(q_rot)
    grad[:, bad] = float("nan")
    torch.autograd.backward([q_rot, k_rot], [grad, torch.ones_like(k_rot)])
    end = length if cu is None else next(s for s in cu if s > bad)
    assert leaf.grad[:, bad + 1 :].isfinite().all() and leaf.grad[:, first : bad + 1].isnan().any()
    assert leaf.grad[:, :first].isfinite().all() and end > bad
