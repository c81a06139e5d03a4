"""The selective_rope / rope ops against float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from srope.ops import rope, selective_rope
from srope.ops.mixers import naive as mixers_naive
from srope.ops.rotary import naive as reference
from tests.helpers import generator, naive_selective_rope, randn, rel_err

# (B, T, H, Hk, D, R, cu_seqlens)
SHAPES = [
    (1, 1, 1, 1, 2, 1, None),  # T = 1, smallest pair
    (2, 7, 2, 2, 8, 4, None),  # odd T
    (2, 13, 4, 2, 10, 3, None),  # GQA, odd R, partial rotary (2R = 6 < D = 10)
    (3, 65, 6, 3, 16, 5, None),  # T past a typical block size
    (1, 19, 2, 1, 8, 4, [0, 5, 5, 12, 19]),  # packed, with an empty sequence
    (1, 9, 4, 4, 6, 2, [0, 1, 9]),  # packed, a one-token sequence
]


def make_inputs(shape, seed, dtype=torch.float64, per_head_temperature=False, with_offset=True):
    batch, length, heads, key_heads, dim, pairs, cu = shape
    g = generator(seed)
    q = randn(batch, length, heads, dim, seed_gen=g, dtype=dtype)
    k = randn(batch, length, key_heads, dim, seed_gen=g, dtype=dtype)
    phi = randn(batch, length, key_heads, pairs, seed_gen=g, dtype=dtype)
    temperature = torch.rand(*((key_heads, pairs) if per_head_temperature else (pairs,)), generator=g, dtype=torch.float64).to(dtype)
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    count = batch if cu is None else len(cu) - 1
    offset = randn(count, key_heads, pairs, seed_gen=g, scale=3.0) if with_offset else None
    return q, k, phi, temperature, offset, cu_seqlens


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("per_head_temperature", [False, True])
def test_reference_matches_naive_rotation(shape, per_head_temperature):
    q, k, phi, temperature, offset, cu = make_inputs(shape, seed=1, per_head_temperature=per_head_temperature)
    q_rot, k_rot, _ = selective_rope(q, k, phi, temperature, offset=offset, cu_seqlens=cu, backend="torch")
    q_ref, k_ref = naive_selective_rope(q, k, phi, temperature, offset, cu)
    assert rel_err(q_rot, q_ref) < 1e-12 and rel_err(k_rot, k_ref) < 1e-12


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_forward_and_backward_match_float64(shape, dtype, tol):
    inputs64 = make_inputs(shape, seed=2, per_head_temperature=True)
    inputs64 = [x if x is None or x.dtype == torch.int32 else x.clone().requires_grad_() for x in inputs64]
    low = [x if x is None or x.dtype == torch.int32 else x.detach().to(dtype).requires_grad_() for x in inputs64]
    low[4] = None if low[4] is None else inputs64[4].detach().clone().requires_grad_()  # offset: float64 in both
    # Compare against the float64 run on the same (rounded) inputs.
    ref_in = [x if x is None or x.dtype == torch.int32 else x.detach().double().requires_grad_() for x in low]
    out = selective_rope(*low[:4], offset=low[4], cu_seqlens=low[5], output_final_phase=True)
    ref = selective_rope(*ref_in[:4], offset=ref_in[4], cu_seqlens=ref_in[5], output_final_phase=True)
    assert out[0].dtype == dtype and out[1].dtype == dtype and out[2].dtype == torch.float64
    assert rel_err(out[0], ref[0]) < tol and rel_err(out[1], ref[1]) < tol
    assert rel_err(out[2], ref[2]) < 1e-12
    g = generator(3)
    grads_out = [randn(*x.shape, seed_gen=g) for x in out[:2]]
    torch.autograd.backward(out[:2], [x.to(dtype) for x in grads_out])
    torch.autograd.backward(ref[:2], grads_out)
    for name, a, b in zip(["q", "k", "phi", "temperature", "offset"], low[:5], ref_in[:5]):
        if a is None:
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype, name
        assert rel_err(a.grad, b.grad) < tol, (name, rel_err(a.grad, b.grad))


@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[4]])
def test_gradcheck_float64(shape):
    inputs = make_inputs(shape, seed=4, per_head_temperature=True)
    q, k, phi, temperature, offset = [x.clone().requires_grad_() for x in inputs[:5]]
    cu = inputs[5]

    def fn(q, k, phi, temperature, offset):
        return selective_rope(q, k, phi, temperature, offset=offset, cu_seqlens=cu)[:2]

    assert torch.autograd.gradcheck(fn, (q, k, phi, temperature, offset))


def test_final_phase_has_no_gradient_and_is_float64():
    q, k, phi, temperature, offset, _ = make_inputs(SHAPES[1], seed=5, dtype=torch.float32)
    phi.requires_grad_()
    *_, final = selective_rope(q, k, phi, temperature, offset=offset.float(), output_final_phase=True)
    assert final.dtype == torch.float64 and not final.requires_grad
    assert selective_rope(q, k, phi, temperature)[2] is None


@pytest.mark.parametrize("split", [1, 4, 6])
def test_split_and_continue_with_offset(split):
    q, k, phi, temperature, offset, _ = make_inputs((2, 7, 4, 2, 8, 3, None), seed=6)
    full = selective_rope(q, k, phi, temperature, offset=offset, output_final_phase=True)
    a = selective_rope(q[:, :split], k[:, :split], phi[:, :split], temperature, offset=offset, output_final_phase=True)
    b = selective_rope(q[:, split:], k[:, split:], phi[:, split:], temperature, offset=a[2], output_final_phase=True)
    assert rel_err(torch.cat([a[0], b[0]], 1), full[0]) < 1e-13
    assert rel_err(torch.cat([a[1], b[1]], 1), full[1]) < 1e-13
    assert rel_err(b[2], full[2]) < 1e-14


def test_packed_equals_sequences_one_by_one():
    cu = [0, 5, 5, 12, 19]
    q, k, phi, temperature, offset, cu_seqlens = make_inputs((1, 19, 2, 1, 8, 4, cu), seed=7, per_head_temperature=True)
    packed = selective_rope(q, k, phi, temperature, offset=offset, cu_seqlens=cu_seqlens, output_final_phase=True)
    for n, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        if s == e:
            assert torch.equal(packed[2][n], offset[n])
            continue
        one = selective_rope(q[:, s:e], k[:, s:e], phi[:, s:e], temperature, offset=offset[n : n + 1], output_final_phase=True)
        assert rel_err(packed[0][:, s:e], one[0]) < 1e-13 and rel_err(packed[1][:, s:e], one[1]) < 1e-13
        assert rel_err(packed[2][n : n + 1], one[2]) < 1e-13


def test_complex_recurrence_equals_rotated_linear_attention():
    """GLA with pair-tied decay on selective_rope-rotated q/k == the complex Λ_t R_t recurrence."""
    g = generator(8)
    batch, length, heads, pairs, value_dim = 2, 23, 3, 4, 5
    q, k = randn(batch, length, heads, 2 * pairs, seed_gen=g), randn(batch, length, heads, 2 * pairs, seed_gen=g)
    v = randn(batch, length, heads, value_dim, seed_gen=g)
    phi = randn(batch, length, heads, pairs, seed_gen=g)
    temperature = torch.rand(heads, pairs, generator=g, dtype=torch.float64) * 2
    log_decay = -torch.rand(batch, length, heads, pairs, generator=g, dtype=torch.float64)
    q_rot, k_rot, _ = selective_rope(q, k, phi, temperature)
    real, _ = mixers_naive.gated_linear_attention_recurrence(q_rot, k_rot, v, torch.cat([log_decay, log_decay], -1))
    complex_out = mixers_naive.complex_rotation_recurrence(q, k, v, temperature * phi, torch.exp(log_decay))
    assert rel_err(real, complex_out) < 1e-10
    # Untied decay breaks the equivalence: the check can fail.
    untied = torch.cat([log_decay, log_decay.flip(-1)], -1)
    assert rel_err(mixers_naive.gated_linear_attention_recurrence(q_rot, k_rot, v, untied)[0], complex_out) > 1e-3


def standard_rope(x, theta):
    """Textbook RoPE (rotate-half form), written independently of srope, in float64."""
    dim, length = x.shape[-1], x.shape[1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)[None, :, None, :]
    rotated_half = torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1)
    return x * emb.cos() + rotated_half * emb.sin()


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_selective_rope_with_unit_steps_is_standard_rope(theta):
    g = generator(9)
    batch, length, heads, dim = 2, 300, 2, 16
    q, k = randn(batch, length, heads, dim, seed_gen=g), randn(batch, length, heads, dim, seed_gen=g)
    phi = torch.ones(batch, length, heads, dim // 2, dtype=torch.float64)
    offset = -torch.ones(batch, heads, dim // 2, dtype=torch.float64)
    temperature = reference.rope_inverse_frequencies(dim, theta)
    q_rot, k_rot, _ = selective_rope(q, k, phi, temperature, offset=offset)
    assert rel_err(q_rot, standard_rope(q, theta)) < 1e-12 and rel_err(k_rot, standard_rope(k, theta)) < 1e-12
    positions = torch.arange(length).expand(batch, length)
    q_fix, k_fix = rope(q, k, positions, temperature)
    assert rel_err(q_fix, q_rot) < 1e-12 and rel_err(k_fix, k_rot) < 1e-12


def test_phase_accuracy_at_a_million_tokens():
    """float32 inputs at T = 2^20: angle error vs float64 stays below 1e-3 rad."""
    length, pairs = 2**20, 4
    g = generator(10)
    phi64 = torch.rand(1, length, 1, pairs, generator=g, dtype=torch.float64) * 2  # Φ grows to ~1e6
    phi32 = phi64.float()
    temperature = torch.tensor([1.0, 0.7, 0.31, 0.013])
    unit = torch.zeros(1, length, 1, 2 * pairs)
    unit[..., :pairs] = 1.0  # rotating (1, 0) gives (cos a, sin a): read the angle back
    q_rot, _, _ = selective_rope(unit, unit, phi32, temperature)
    measured = torch.atan2(q_rot[..., pairs:].double(), q_rot[..., :pairs].double())
    exact = temperature.double() * torch.cumsum(phi32.double(), dim=1)
    error = torch.remainder(measured - exact + math.pi, 2 * math.pi) - math.pi
    assert error.abs().max().item() < 1e-3, error.abs().max().item()
    # A float32 running sum would fail this check by orders of magnitude.
    naive = temperature * torch.cumsum(phi32, dim=1)
    naive_error = torch.remainder(naive.double() - exact + math.pi, 2 * math.pi) - math.pi
    assert naive_error.abs().max().item() > 1e-2


def _bad(**overrides):
    g = generator(11)
    args = dict(
        q=randn(2, 5, 4, 8, seed_gen=g, dtype=torch.float32),
        k=randn(2, 5, 2, 8, seed_gen=g, dtype=torch.float32),
        phi=randn(2, 5, 2, 3, seed_gen=g, dtype=torch.float32),
        temperature=torch.ones(3),
    )
    args.update(overrides)
    return args


BAD_INPUTS = [
    ("q rank", dict(q=torch.zeros(2, 5, 32)), ValueError, "q must have 4 dimensions"),
    ("q not a tensor", dict(q=[[1.0]]), TypeError, "q must be a torch.Tensor"),
    ("heads not divisible", dict(k=torch.zeros(2, 5, 3, 8), phi=torch.zeros(2, 5, 3, 3)), ValueError, "multiple of the key heads"),
    ("k batch", dict(k=torch.zeros(3, 5, 2, 8)), ValueError, "k must be"),
    ("R = 0", dict(phi=torch.zeros(2, 5, 2, 0), temperature=torch.ones(0)), ValueError, "1 <= R"),
    ("2R > D", dict(phi=torch.zeros(2, 5, 2, 5), temperature=torch.ones(5)), ValueError, "2R <= head_dim"),
    ("phi heads", dict(phi=torch.zeros(2, 5, 4, 3)), ValueError, "phi must be"),
    ("phi integer", dict(phi=torch.zeros(2, 5, 2, 3, dtype=torch.long)), TypeError, "phi must be a floating"),
    ("temperature shape", dict(temperature=torch.ones(4)), ValueError, "temperature must be"),
    ("temperature heads", dict(temperature=torch.ones(3, 3)), ValueError, "temperature must be"),
    ("offset shape", dict(offset=torch.zeros(2, 3)), ValueError, "offset must be"),
    ("offset batch", dict(offset=torch.zeros(3, 2, 3)), ValueError, "offset must be"),
    ("dtype mismatch", dict(k=torch.zeros(2, 5, 2, 8, dtype=torch.float64)), TypeError, "share a dtype"),
    ("device mismatch", dict(temperature=torch.ones(3, device="meta")), ValueError, "on one device"),
    ("cu_seqlens with B > 1", dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "batch size 1"),
    ("cu_seqlens float", dict(cu_seqlens=torch.tensor([0.0, 5.0])), ValueError, "int32/int64"),
    ("cu_seqlens a list", dict(cu_seqlens=[0, 5]), TypeError, "cu_seqlens must be a torch.Tensor"),
    ("unknown backend", dict(backend="cuda"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("name,overrides,error,match", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_clear_errors(name, overrides, error, match):
    with pytest.raises(error, match=match):
        selective_rope(**_bad(**overrides))


def _one_row():
    """_bad()'s valid inputs with batch size 1 (for cu_seqlens)."""
    args = _bad()
    return {name: value[:1] for name, value in args.items() if name != "temperature"} | {"temperature": args["temperature"]}


@pytest.mark.parametrize("bounds,match", [([0, 3], "end at the sequence length 5"), ([0, 4, 2, 5], "non-decreasing"), ([1, 5], "start at 0")])
def test_bad_cu_seqlens(bounds, match):
    args = _one_row()
    with pytest.raises(ValueError, match=match):
        selective_rope(**args, cu_seqlens=torch.tensor(bounds))


def test_strided_cu_seqlens_are_refused():
    """The kernels read cu_seqlens as a flat array: a strided view would be read as another one."""
    with pytest.raises(ValueError, match="cu_seqlens must be contiguous"):
        selective_rope(**_one_row(), cu_seqlens=torch.tensor([0, 9, 2, 9, 5, 9])[::2])


@pytest.mark.parametrize("bounds", [[0, 3], [0, 4, 2, 5], [1, 5]])
def test_bad_cu_seqlens_under_compile(bounds):
    """Compiled, the boundaries are asserted on the device (no host sync, no graph break),
    and bad ones still raise."""
    args = _one_row()
    step = lambda cu: selective_rope(**args, cu_seqlens=cu)[0]
    torch._dynamo.reset()
    good = torch.tensor([0, 2, 2, 5])
    assert torch._dynamo.explain(step)(good).graph_break_count == 0
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(good), step(good))
    with pytest.raises(RuntimeError, match="cu_seqlens must be non-decreasing, start at 0 and end at the sequence length 5"):
        compiled(torch.tensor(bounds))


def test_rope_bad_inputs():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="positions must be"):
        rope(q, q, torch.zeros(1, 3, dtype=torch.long), torch.ones(4))
    with pytest.raises(ValueError, match="inv_freq must be"):
        rope(q, q, torch.zeros(1, 4, dtype=torch.long), torch.ones(5))
    for dtype in (torch.bool, torch.complex64):
        with pytest.raises(TypeError, match="integer or real floating"):
            rope(q, q, torch.zeros(1, 4, dtype=dtype), torch.ones(4))
