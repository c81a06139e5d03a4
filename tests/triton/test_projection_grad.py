"""The fused input gradient of the generator's projection (srope.ops.triton.projection)
against float64, interpreted on the CPU or compiled on CUDA, and the projection's
low-precision backward that uses it on CUDA against its torch route."""

from __future__ import annotations

import pytest
import torch

from srope.ops import projection
from srope.ops.triton.projection import projection_input_grad
from tests.helpers import generator, randn, rel_err
from tests.triton.conftest import INTERPRET

SHAPES = [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68)]


def grad_inputs(count, heads, chunk, width, dtype, device, seed=0):
    gen = generator(seed)
    dy = randn(count, heads, width, seed_gen=gen).to(device, torch.float32)
    y = randn(count, heads, width, seed_gen=gen).to(device, torch.float32)
    inv_norm = randn(count, heads, seed_gen=gen).abs().add(0.1).to(device, torch.float32)
    weight = randn(heads, chunk, width, seed_gen=gen).to(device, dtype)
    x = randn(count, heads, chunk, seed_gen=gen, scale=3.0).to(device, torch.float32)
    return dy, y, inv_norm, weight, x


def assert_rounded(low, exact, dtype):
    """``low`` is ``exact`` rounded to ``dtype``: to nearest when compiled; Triton's
    interpreter rounds toward zero, so there one ulp."""
    assert low.dtype == dtype and low.shape == exact.shape
    if INTERPRET:
        ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
        assert ((low.float() - exact).abs() <= exact.abs() * ulp).all()
    else:
        assert torch.equal(low, exact.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("count,heads,chunk,width", SHAPES)
def test_input_grad_matches_float64(dtype, count, heads, chunk, width, device):
    """dx = dz_low @ Wᵀ - r²(dy·y)·x to float32 accuracy (products of 16-bit numbers are
    exact in float32), with dz_low = r·dy and x_low = x rounded to the weight's dtype;
    without write_low the same dx (to float32 rounding). Odd sizes; outputs poisoned with NaN before."""
    dy, y, inv_norm, weight, x = grad_inputs(count, heads, chunk, width, dtype, device)
    dx, x_low, dz_low = projection_input_grad(dy, y, inv_norm, weight, x)
    assert_rounded(dz_low, dy * inv_norm[..., None], dtype)
    assert_rounded(x_low, x, dtype)
    r = inv_norm.double()
    expected = torch.einsum("nhm,him->nhi", dz_low.double(), weight.double()) \
        - (r.square() * (dy.double() * y.double()).sum(-1))[..., None] * x.double()
    assert dx.dtype == torch.float32 and rel_err(dx, expected) < 1e-6
    # Another compiled kernel (WRITE_LOW is a constexpr): the same sums, but the compiler
    # may contract them differently (bit-equal under the interpreter, not always on the H200).
    alone = projection_input_grad(dy, y, inv_norm, weight, x, write_low=False)
    assert alone[1:] == (None, None) and rel_err(alone[0], expected) < 1e-6 and rel_err(alone[0], dx) < 1e-6


def test_input_grad_reads_strided_tokens(device):
    dy, y, inv_norm, weight, x = grad_inputs(9, 2, 16, 16, torch.bfloat16, device, seed=1)
    wide = torch.zeros(9, 3, 2, 16, device=device)
    wide[:, 1] = x
    assert torch.equal(projection_input_grad(dy, y, inv_norm, weight, wide[:, 1])[0], projection_input_grad(dy, y, inv_norm, weight, x)[0])


GRAD_BAD = [
    ("weight dtype", dict(weight=torch.zeros(2, 8, 5)), TypeError, "16-bit|bfloat16"),
    ("x dtype", dict(x=torch.zeros(4, 2, 8, dtype=torch.float64)), TypeError, "float32"),
    ("widths", dict(weight=torch.zeros(2, 8, 6, dtype=torch.bfloat16)), ValueError, "shapes disagree"),
    ("inv_norm", dict(inv_norm=torch.zeros(4, 3)), ValueError, "shapes disagree"),
]


@pytest.mark.parametrize("name,overrides,error,match", GRAD_BAD, ids=[b[0] for b in GRAD_BAD])
def test_input_grad_bad_inputs(name, overrides, error, match, device):
    args = dict(dy=torch.zeros(4, 2, 5), y=torch.zeros(4, 2, 5), inv_norm=torch.zeros(4, 2),
                weight=torch.zeros(2, 8, 5, dtype=torch.bfloat16), x=torch.zeros(4, 2, 8)) | overrides
    args = {key: value.to(device) for key, value in args.items()}
    with pytest.raises(error, match=match):
        projection_input_grad(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 333, 4096 + 5])
def test_projection_on_cuda_against_torch_route(monkeypatch, tokens):
    """On CUDA the bf16 backward takes the fused kernel. Its weight gradient is the torch
    route's bit for bit (same rounded x and dz, same cuBLAS products); its input gradient
    keeps the product in float32 where the torch route rounds it to bf16 before adding the
    norm's term, so it is at least as close to float64, and within bf16 rounding of it."""
    gen = generator(tokens)
    x64 = randn(tokens, 4, 256, seed_gen=gen, dtype=torch.float64).cuda()
    w64 = randn(4, 256, 68, seed_gen=gen, dtype=torch.float64).cuda() / 16
    grad = randn(tokens, 4, 68, seed_gen=gen, dtype=torch.float64).cuda()

    def run(x, w, dtype):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = projection.normalized_head_projection(x, w, 1e-6, dtype)
        return (y, *torch.autograd.grad(y, (x, w), grad.to(x.dtype)))

    exact = run(x64, w64, None)
    fused = run(x64.float(), w64.float(), torch.bfloat16)
    monkeypatch.setattr(projection, "FUSED", False)
    unfused = run(x64.float(), w64.float(), torch.bfloat16)
    assert torch.equal(fused[0], unfused[0]) and torch.equal(fused[2], unfused[2])
    assert rel_err(fused[1], unfused[1]) < 8e-3
    assert rel_err(fused[1], exact[1]) <= rel_err(unfused[1], exact[1]) + 1e-6
    assert rel_err(fused[1], exact[1]) < 2e-2 and rel_err(fused[2], exact[2]) < 2e-2


def test_opcheck_input_grad(device):
    from srope.ops.triton.projection import _input_grad_op

    dy, y, inv_norm, weight, x = grad_inputs(5, 2, 16, 18, torch.bfloat16, device, seed=2)
    for write_low in (True, False):
        torch.library.opcheck(_input_grad_op, (dy, y, inv_norm, weight, x, write_low))
