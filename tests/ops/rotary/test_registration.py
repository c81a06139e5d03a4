"""The torch.library registration: schema, fake tensors, autograd, torch.compile."""

from __future__ import annotations

import pytest
import torch

from srope.ops import selective_rope
from srope.ops.rotary import chunk as ops
from srope.ops.rotary.decode import _decode_op
from tests.helpers import generator, randn, rel_err

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)


def _inputs(device, packed=False):
    g = generator(20)
    q = randn(1, 9, 4, 8, seed_gen=g, dtype=torch.float32).to(device).requires_grad_()
    k = randn(1, 9, 2, 8, seed_gen=g, dtype=torch.float32).to(device).requires_grad_()
    phi = randn(1, 9, 2, 3, seed_gen=g, dtype=torch.float32).to(device).requires_grad_()
    temperature = torch.rand(2, 3, generator=g).to(device).requires_grad_()
    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32, device=device) if packed else None
    offset = randn(3 if packed else 1, 2, 3, seed_gen=g).to(device).requires_grad_()
    return q, k, phi, temperature, offset, cu


def test_opcheck_selective_rope(device):
    for packed in (False, True):
        q, k, phi, temperature, offset, cu = _inputs(device, packed)
        tables = ops.chunk_tables(cu, 9, 4) if packed else (None, None)
        torch.library.opcheck(ops.selective_rope_fwd.op, (q, k, phi, temperature, offset, cu, *tables, 4))


def test_opcheck_rope_and_decode(device):
    q, k, *_ = _inputs(device)
    torch.library.opcheck(ops.rope_fwd.op, (q, k, torch.arange(9, device=device)[None], torch.rand(3, device=device), 4))
    g = generator(21)
    args = (
        randn(2, 1, 4, 8, seed_gen=g, dtype=torch.float32), randn(2, 1, 2, 8, seed_gen=g, dtype=torch.float32),
        randn(2, 6, seed_gen=g, dtype=torch.float32), randn(2, 6, 3, seed_gen=g, dtype=torch.float32),
        randn(6, 4, seed_gen=g, dtype=torch.float32), randn(2, 2, 3, seed_gen=g), torch.rand(3, generator=g),
        None, randn(2, 3, seed_gen=g, dtype=torch.float32), torch.rand(2, 2, generator=g),
    )
    torch.library.opcheck(_decode_op.op, tuple(a.to(device) if a is not None else None for a in args) + (True,))
    # u and the per-head gate computed from x in the step (hidden 16 over 2 key heads, R 3 + 2 gate shares)
    from_x = (None if i == 2 else a for i, a in enumerate(args[:9]))
    tail = (None, True, randn(2, 16, seed_gen=g, dtype=torch.float32), randn(2, 8, 5, seed_gen=g, dtype=torch.float32),
            randn(2, seed_gen=g, dtype=torch.float32), 1e-6)
    torch.library.opcheck(_decode_op.op, tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in (*from_x, *tail)))


def test_torch_compile_keeps_the_op_in_one_graph(device):
    q, k, phi, temperature, offset, _ = _inputs(device)

    def loss(q, k, phi, temperature, offset):
        q_rot, k_rot, _ = selective_rope(q, k, phi, temperature, offset=offset, backend="triton")
        return (q_rot.sin() * 2).sum() + k_rot.square().sum()

    explained = torch._dynamo.explain(loss)(q, k, phi, temperature, offset)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    leaves = (q, k, phi, temperature, offset)
    grads = torch.autograd.grad(compiled(*leaves), leaves)
    eager = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(grads, eager):
        assert rel_err(a, b) < 1e-6
