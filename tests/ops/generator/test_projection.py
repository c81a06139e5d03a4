"""normalized_head_projection against the explicit formula (float64, forward and backward)."""

from __future__ import annotations

import pytest
import torch

from srope.ops.generator import projection
from srope.ops.generator.projection import normalized_head_projection
from tests.helpers import generator, rel_err


def explicit(x, weight, eps):
    x_hat = x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)
    return torch.einsum("...hi,him->...hm", x_hat, weight)


@pytest.mark.parametrize("tokens,slab", [(1, 4), (7, 4), (8, 4), (11, 4), (13, 2048)])
def test_matches_explicit_normalisation(monkeypatch, tokens, slab):
    monkeypatch.setattr(projection, "TORCH_SLAB", slab)  # small slabs: the split weight gradient runs
    gen = generator(tokens)
    x = torch.randn(2, tokens, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, tokens, 3, 4, generator=gen, dtype=torch.float64)
    ours = normalized_head_projection(x, weight, 1e-6)
    ref = explicit(x, weight, 1e-6)
    assert rel_err(ours, ref) < 1e-13
    for a, b in zip(torch.autograd.grad(ours, (x, weight), grad), torch.autograd.grad(ref, (x, weight), grad)):
        assert rel_err(a, b) < 1e-12


def test_gradcheck(monkeypatch):
    monkeypatch.setattr(projection, "TORCH_SLAB", 2)
    gen = generator(1)
    x = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: normalized_head_projection(a, b, 1e-3), (x, weight))


@pytest.mark.parametrize("cast", [None, torch.bfloat16], ids=["plain", "cast"])
def test_split_parts_are_the_columns(cast):
    """``split``: two contiguous tensors, the unsplit output's columns, with the same
    gradients (an unused part's included, and a broadcast gradient for the second)."""
    gen = generator(2)
    x = torch.randn(2, 6, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    out = normalized_head_projection(x, weight, 1e-6, cast=cast, split=4)
    (first, rest), x_cast = out if cast is not None else (out, None)
    whole = normalized_head_projection(x, weight, 1e-6)
    assert first.is_contiguous() and rest.is_contiguous() and torch.equal(torch.cat([first, rest], -1), whole)
    assert cast is None or torch.equal(x_cast, x.detach().to(cast))
    grad_first = torch.randn(first.shape, generator=gen, dtype=torch.float64)
    grad_rest = torch.randn(2, 6, 1, 3, generator=gen, dtype=torch.float64).expand(rest.shape)
    ours = torch.autograd.grad((first, rest), (x, weight), (grad_first, grad_rest))
    ref = torch.autograd.grad(whole, (x, weight), torch.cat([grad_first, grad_rest], -1), retain_graph=True)
    assert all(rel_err(a, b) < 1e-13 for a, b in zip(ours, ref))
    alone = torch.autograd.grad(normalized_head_projection(x, weight, 1e-6, split=4)[0], (x, weight), grad_first)
    ref = torch.autograd.grad(whole, (x, weight), torch.cat([grad_first, torch.zeros_like(rest)], -1))
    assert all(rel_err(a, b) < 1e-13 for a, b in zip(alone, ref))


@pytest.mark.parametrize("split", [0, 7, True, 2.5])
def test_bad_split(split):
    with pytest.raises(ValueError, match="split"):
        normalized_head_projection(torch.randn(4, 3, 5, dtype=torch.float64), torch.randn(3, 5, 7, dtype=torch.float64), 1e-6,
                                   split=split)


def test_zero_input_rows_stay_finite():
    x = torch.zeros(3, 2, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    y = normalized_head_projection(x, weight, 1e-6)
    y.sum().backward()
    assert torch.equal(y, torch.zeros_like(y)) and torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all()


@pytest.mark.parametrize("x_shape,w_shape,dtype,error", [
    ((4, 2, 3), (2, 4, 3), torch.float64, ValueError),
    ((4, 2, 3), (2, 3), torch.float64, ValueError),
    ((4, 2, 3), (2, 3, 5), torch.float32, TypeError),
])
def test_bad_shapes_and_dtypes_raise(x_shape, w_shape, dtype, error):
    with pytest.raises(error, match="x"):
        normalized_head_projection(torch.randn(x_shape, dtype=torch.float64), torch.randn(w_shape, dtype=dtype), 1e-6)


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [5, 9])
def test_low_precision_backward(monkeypatch, grad_dtype, tokens):
    """grad_dtype changes the backward's products only: the forward is bitwise the float32
    one, and both gradients stay within that dtype's rounding of the float64 ones."""
    monkeypatch.setattr(projection, "TORCH_SLAB", 4)
    gen = generator(tokens)
    x64 = torch.randn(2, tokens, 3, 16, generator=gen, dtype=torch.float64)
    w64 = torch.randn(3, 16, 8, generator=gen, dtype=torch.float64)
    grad = torch.randn(2, tokens, 3, 8, generator=gen, dtype=torch.float64)
    ref = torch.autograd.grad(explicit(x64.requires_grad_(), w64.requires_grad_(), 1e-6), (x64, w64), grad)
    x, w = x64.detach().float().requires_grad_(), w64.detach().float().requires_grad_()
    full = normalized_head_projection(x, w, 1e-6)
    low = normalized_head_projection(x, w, 1e-6, grad_dtype)
    assert torch.equal(full, low)
    grads = torch.autograd.grad(low, (x, w), grad.float())
    exact = torch.autograd.grad(full, (x, w), grad.float())
    for ours, fp32, expected in zip(grads, exact, ref):
        assert ours.dtype == torch.float32
        assert rel_err(ours.double(), expected) < (2e-2 if grad_dtype == torch.bfloat16 else 3e-3)
        assert rel_err(ours, fp32) > 1e-5  # the products did run in grad_dtype


def test_bad_grad_dtype_raises():
    with pytest.raises(TypeError, match="grad_dtype"):
        normalized_head_projection(torch.randn(4, 2, 3), torch.randn(2, 3, 5), 1e-6, torch.float64)


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
def test_cast_and_its_gradient(cast):
    """With ``cast`` the function also returns x rounded to that dtype, and the gradient a
    map of that copy sends back is added into x's: exactly the plain gradient plus it, as
    autograd would add the two; y and its gradient are untouched. Either output may go unused."""
    gen = generator(5)
    x = torch.randn(2, 9, 3, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 16, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(2, 9, 3, 8, generator=gen, dtype=torch.float64)
    grad_cast = torch.randn(2, 9, 3, 16, generator=gen, dtype=torch.float64).to(cast)
    plain = normalized_head_projection(x, weight, 1e-6)
    y, x_cast = normalized_head_projection(x, weight, 1e-6, cast=cast)
    assert torch.equal(y, plain) and x_cast.dtype == cast and torch.equal(x_cast, x.detach().to(cast))
    expected = torch.autograd.grad(plain, (x, weight), grad_y)
    both = torch.autograd.grad((y, x_cast), (x, weight), (grad_y, grad_cast))
    assert torch.equal(both[0], expected[0] + grad_cast.double()) and torch.equal(both[1], expected[1])
    y, x_cast = normalized_head_projection(x, weight, 1e-6, cast=cast)
    assert torch.equal(torch.autograd.grad(y, x, grad_y)[0], expected[0])
    y, x_cast = normalized_head_projection(x, weight, 1e-6, cast=cast)
    assert torch.equal(torch.autograd.grad(x_cast, x, grad_cast)[0], grad_cast.double())


def test_bad_cast_raises():
    with pytest.raises(TypeError, match="cast"):
        normalized_head_projection(torch.randn(4, 2, 3), torch.randn(2, 3, 5), 1e-6, cast=torch.float64)


def test_cast_with_low_precision_backward_keeps_only_the_cast():
    """Under autocast (cast == grad_dtype) the backward holds x as its bf16 copy, which the
    host's maps keep anyway, not a second float32 copy; the gradients stay within bf16
    rounding of float64 and the -r²(dy·y)·x term's rounding barely moves them."""
    gen = generator(6)
    x = torch.randn(2, 33, 3, 16, generator=gen, requires_grad=True)
    weight = torch.randn(3, 16, 8, generator=gen, requires_grad=True)
    grad_y = torch.randn(2, 33, 3, 8, generator=gen)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y, x_cast = normalized_head_projection(x, weight, 1e-6, torch.bfloat16, torch.bfloat16)
    assert not [t for t in saved if t.dtype == torch.float32 and t.numel() == x.numel()]
    assert any(t.dtype == torch.bfloat16 and t.data_ptr() == x_cast.data_ptr() for t in saved)
    grads = torch.autograd.grad(y, (x, weight), grad_y)
    kept = torch.autograd.grad(normalized_head_projection(x, weight, 1e-6, torch.bfloat16), (x, weight), grad_y)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    exact = torch.autograd.grad(normalized_head_projection(x64, w64, 1e-6), (x64, w64), grad_y.double())
    for ours, float32_x, expected in zip(grads, kept, exact):
        assert ours.dtype == torch.float32
        assert rel_err(ours, expected) < 2e-2 and rel_err(ours, float32_x) < 1e-3


def test_the_callers_copy_is_kept_like_the_cast():
    """``x_low`` (the host's own bf16 copy of x) is what the backward keeps, with no float32
    copy of x: the gradients are bitwise those of ``cast == grad_dtype``, and none flows into the copy."""
    gen = generator(7)
    x = torch.randn(2, 17, 3, 16, generator=gen, requires_grad=True)
    weight = torch.randn(3, 16, 8, generator=gen, requires_grad=True)
    grad_y = torch.randn(2, 17, 3, 8, generator=gen)
    x_low = x.to(torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = normalized_head_projection(x, weight, 1e-6, torch.bfloat16, x_low=x_low)
    assert not [t for t in saved if t.dtype == torch.float32 and t.numel() == x.numel()]
    assert any(t.dtype == torch.bfloat16 and t.data_ptr() == x_low.data_ptr() for t in saved)
    y_cast, _ = normalized_head_projection(x, weight, 1e-6, torch.bfloat16, torch.bfloat16)
    assert torch.equal(y, y_cast)
    ours = torch.autograd.grad(y, (x, weight), grad_y)
    expected = torch.autograd.grad(y_cast, (x, weight), grad_y)
    assert all(torch.equal(a, b) for a, b in zip(ours, expected))


@pytest.mark.parametrize("options,match", [
    (dict(grad_dtype=torch.bfloat16, cast=torch.bfloat16), "either cast"),
    (dict(grad_dtype=torch.float16), "x_low must be x"),  # not the backward's dtype
    (dict(), "x_low must be x"),  # no lower grad_dtype
])
def test_bad_x_low_raises(options, match):
    x = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match=match):
        normalized_head_projection(x, torch.randn(2, 3, 5), 1e-6, x_low=x.bfloat16(), **options)
