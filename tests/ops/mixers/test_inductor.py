"""The chunked PyTorch gated delta rule under inductor on the CPU (not only aot_eager): a packed
batch's gradients equal eager's. Inductor computed the log decay's and β's gradients 125-130%
off when the packed rows' padding was zeroed by a product with the mask; a select is exact."""

from __future__ import annotations

import torch

from srope.ops.mixers.delta_rule import gated_delta_rule_torch


def test_packed_gated_delta_rule_gradients_under_inductor():
    torch.manual_seed(0)
    length, heads, key_dim = 24, 2, 8
    q = torch.randn(1, length, heads, key_dim, requires_grad=True)
    k = torch.nn.functional.normalize(torch.randn(1, length, heads, key_dim), dim=-1).requires_grad_()
    v = torch.randn(1, length, heads, key_dim, requires_grad=True)
    beta = torch.rand(1, length, heads).requires_grad_()
    g = (-torch.rand(1, length, heads)).requires_grad_()
    inputs = (q, k, v, beta, g)
    cu_seqlens = torch.tensor([0, 9, 24], dtype=torch.int32)

    def loss(*x):
        out, _ = gated_delta_rule_torch(*x[:4], x[4], 0.3, cu_seqlens=cu_seqlens)
        return (out * out).sum()

    expected = torch.autograd.grad(loss(*inputs), inputs)
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="inductor")(*inputs), inputs)
    for name, a, b in zip("q k v beta g".split(), got, expected):
        assert float((a - b).norm() / b.norm()) < 1e-4, name
