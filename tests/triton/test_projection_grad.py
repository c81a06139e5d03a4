"""The fused input gradient of the generator's projection (srope.ops.triton.projection)
against float64, interpreted on the CPU or compiled on CUDA, and the projection's
low-precision backward that uses it on CUDA against its torch path."""

from __future__ import annotations

import pytest
import torch

from srope.ops import projection
from srope.ops.triton.projection import projection_input_grad
from tests.helpers import generator, randn, rel_err
from tests.triton.conftest import INTERPRET


def inputs(count, heads, chunk, width, dtype, device, seed=0):
    gen = generator(seed)
    dz = randn(count, heads, width, seed_gen=gen).to(device, dtype)
    weight = randn(heads, chunk, width, seed_gen=gen).to(device, dtype)
    x = randn(count, heads, chunk, seed_gen=gen, scale=3.0).to(device, torch.float32)
    d_norm = randn(count, heads, seed_gen=gen).to(device, torch.float32)
    return dz, weight, x, d_norm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("count,heads,chunk,width", [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68)])
@pytest.mark.parametrize("write_low", [True, False])
def test_input_grad_matches_float64(dtype, count, heads, chunk, width, write_low, device):
    """dx = dz @ Wᵀ + d_norm·x from the rounded inputs, to float32 accuracy (products of
    16-bit numbers are exact in float32), and x rounded to dz's dtype. Token counts, chunks
    and widths that are not multiples of the blocks; outputs poisoned with NaN before."""
    dz, weight, x, d_norm = inputs(count, heads, chunk, width, dtype, device)
    dx, x_low = projection_input_grad(dz, weight, x, d_norm, write_low)
    expected = torch.einsum("nhm,him->nhi", dz.double(), weight.double()) + d_norm.double()[..., None] * x.double()
    assert dx.dtype == torch.float32 and dx.shape == x.shape
    assert rel_err(dx, expected) < 1e-6
    if write_low:  # Triton's interpreter rounds the cast toward zero (compiled: to nearest)
        assert x_low.dtype == dtype
        if INTERPRET:
            ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
            assert ((x_low.float() - x).abs() <= x.abs() * ulp).all()
        else:
            assert torch.equal(x_low, x.to(dtype))
    else:
        assert x_low is None


def test_input_grad_reads_strided_tokens(device):
    """x may be a token-strided view (the last two dimensions contiguous)."""
    dz, weight, x, d_norm = inputs(9, 2, 16, 16, torch.bfloat16, device, seed=1)
    wide = torch.zeros(9, 3, 2, 16, device=device)
    wide[:, 1] = x
    dx, _ = projection_input_grad(dz, weight, wide[:, 1], d_norm)
    assert torch.equal(dx, projection_input_grad(dz, weight, x, d_norm)[0])


BAD = [
    ("dz dtype", dict(dz=torch.zeros(4, 2, 5)), TypeError, "16-bit"),
    ("x dtype", dict(x=torch.zeros(4, 2, 8, dtype=torch.float64)), TypeError, "float32"),
    ("widths", dict(weight=torch.zeros(2, 8, 6, dtype=torch.bfloat16)), ValueError, "shapes disagree"),
    ("d_norm", dict(d_norm=torch.zeros(4, 3)), ValueError, "shapes disagree"),
]


@pytest.mark.parametrize("name,overrides,error,match", BAD, ids=[b[0] for b in BAD])
def test_input_grad_bad_inputs(name, overrides, error, match, device):
    args = dict(dz=torch.zeros(4, 2, 5, dtype=torch.bfloat16), weight=torch.zeros(2, 8, 5, dtype=torch.bfloat16),
                x=torch.zeros(4, 2, 8), d_norm=torch.zeros(4, 2)) | overrides
    args = {key: value.to(device) for key, value in args.items()}
    with pytest.raises(error, match=match):
        projection_input_grad(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 333, 4096 + 5])
def test_low_precision_projection_backward_on_cuda(monkeypatch, tokens):
    """On CUDA the bf16 backward takes the fused kernel. Its weight gradient is the torch
    route's bit for bit (same rounded x, same cuBLAS products); its input gradient keeps the
    product in float32 where the torch route rounds it to bf16 before adding the norm's term,
    so it is at least as close to float64 as the torch route's, and within bf16 rounding of it."""
    gen = generator(tokens)
    x64 = randn(tokens, 4, 256, seed_gen=gen, dtype=torch.float64).cuda()
    w64 = randn(4, 256, 68, seed_gen=gen, dtype=torch.float64).cuda() / 16
    grad = randn(tokens, 4, 68, seed_gen=gen, dtype=torch.float64).cuda()

    def grads(x, w, dtype):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        return torch.autograd.grad(projection.normalized_head_projection(x, w, 1e-6, dtype), (x, w), grad.to(x.dtype))

    exact = grads(x64, w64, None)
    fused = grads(x64.float(), w64.float(), torch.bfloat16)
    monkeypatch.setattr(projection, "FUSED_INPUT_GRAD", False)
    unfused = grads(x64.float(), w64.float(), torch.bfloat16)
    assert torch.equal(fused[1], unfused[1])
    assert rel_err(fused[0], unfused[0]) < 8e-3
    assert rel_err(fused[0], exact[0]) <= rel_err(unfused[0], exact[0]) + 1e-6
    assert rel_err(fused[0], exact[0]) < 2e-2 and rel_err(fused[1], exact[1]) < 2e-2


def test_opcheck_input_grad(device):
    from srope.ops.triton.projection import _input_grad_op

    dz, weight, x, d_norm = inputs(5, 2, 16, 18, torch.bfloat16, device, seed=2)
    for write_low in (True, False):
        torch.library.opcheck(_input_grad_op, (dz, weight, x, d_norm, write_low))
