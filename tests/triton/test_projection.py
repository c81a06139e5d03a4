"""The projection's input-gradient kernel against the float64 formula (autograd of x̂ @ W)."""

from __future__ import annotations

import pytest
import torch

from srope.ops.projection import normalized_head_projection
from srope.ops.triton.projection import projection_input_grad
from tests.helpers import generator, randn, rel_err


def reference_dx(x, weight, dy, eps):
    x = x.detach().double().requires_grad_()
    x_hat = x / torch.sqrt(x.square().sum(-1, keepdim=True) + eps)
    y = torch.einsum("nhi,him->nhm", x_hat, weight.double())
    (dx,) = torch.autograd.grad(y, x, dy.double())
    return dx


def saved(x, weight, eps):
    """What the autograd function saves: z = x @ W per head and 1 / sqrt(|x|² + ε)."""
    inv_norm = torch.rsqrt(x.square().sum(-1) + eps)
    return torch.einsum("nhi,him->nhm", x, weight), inv_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("count,heads,chunk,width", [(37, 3, 20, 19), (16, 1, 16, 16), (5, 2, 40, 33)])
def test_input_grad_matches_the_formula(dtype, count, heads, chunk, width, device):
    """Sizes off every block (tokens, channels, outputs), a zero token, outputs poisoned first."""
    g = generator(3)
    eps = 1e-6
    x = randn(count, heads, chunk, seed_gen=g, dtype=dtype).to(device)
    x[0] = 0
    weight = randn(heads, chunk, width, seed_gen=g, dtype=dtype).to(device)
    dy = randn(count, heads, width, seed_gen=g, dtype=dtype).to(device)
    z, inv_norm = saved(x, weight, eps)
    dx = projection_input_grad(dy, z, inv_norm, x, weight)
    assert dx.dtype == dtype and dx.shape == x.shape and torch.isfinite(dx).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(dx, reference_dx(x, weight, dy, eps).to(device)) < tol


def test_input_grad_bad_inputs(device):
    x = torch.zeros(4, 2, 8, device=device)
    weight = torch.zeros(2, 8, 5, device=device)
    dy = torch.zeros(4, 2, 5, device=device)
    with pytest.raises(ValueError, match="expected dy, z"):
        projection_input_grad(dy, dy, torch.zeros(4, 3, device=device), x, weight)
    with pytest.raises(TypeError, match="share one dtype"):
        projection_input_grad(dy.double(), dy, torch.zeros(4, 2, device=device), x, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_module_backward_at_the_370m_layer_size(dtype):
    """normalized_head_projection's backward on CUDA (this kernel) against float64 autograd,
    8 × 4096 tokens, hidden 1024 in 4 heads, 65 outputs (ω's 64 pairs and a standard gate)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8 * 4096, 4, 256, device="cuda", dtype=dtype, generator=g).requires_grad_()
    weight = (torch.randn(4, 256, 65, device="cuda", dtype=dtype, generator=g) / 16).requires_grad_()
    dy = torch.randn(8 * 4096, 4, 65, device="cuda", dtype=dtype, generator=g)
    y = normalized_head_projection(x, weight, 1e-6)
    y.backward(dy)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(x.grad, reference_dx(x, weight, dy, 1e-6)) < tol
