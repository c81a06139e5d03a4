"""``srope.backend``: one setting for where srope's and fla's kernels run."""

from __future__ import annotations

import os

import pytest
import torch

from srope import backend
from srope.modules import SelectiveRoPE
from srope.ops import gla, selective_rope
from tests.helpers import rel_err


def test_use_sets_and_restores_also_on_errors():
    assert backend.get() == "auto"
    with backend.use("torch"):
        assert backend.get() == "torch"
        with pytest.raises(RuntimeError), backend.use("triton"):
            assert backend.get() == "triton"
            raise RuntimeError
        assert backend.get() == "torch"
    assert backend.get() == "auto"
    with pytest.raises(ValueError, match="one of"):
        backend.use("cuda").__enter__()
    assert backend.get() == "auto"


def test_kernels_and_op_backends_follow_the_setting():
    cpu = torch.zeros(1)
    assert not backend.kernels(cpu) and backend.op_backend() == "auto" and backend.op_backend("torch") == "torch"
    assert backend.fla_backend() == "auto" and backend.fla_backend("torch") == "torch"
    with backend.use("torch"):
        assert not backend.kernels(cpu) and backend.op_backend() == "torch" and backend.op_backend("triton") == "triton"
        assert backend.fla_backend() == "torch" and backend.fla_backend("fla") == "fla"
    with backend.use("fla"):  # fla's pieces as under auto, srope's kernels nowhere
        assert not backend.kernels(cpu) and backend.op_backend() == "torch" and backend.fla_backend() == "auto"


def test_an_explicit_op_backend_wins_over_the_setting():
    q = torch.randn(1, 3, 1, 4)
    with backend.use("torch"), pytest.raises(ValueError, match="needs CUDA tensors"):
        gla(q, q, q, -torch.rand(1, 3, 1, 4), backend="fla")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="checks the error without the interpreter")
def test_triton_on_cpu_without_the_interpreter_says_what_to_do():
    q = torch.randn(1, 5, 2, 4)
    phi = torch.randn(1, 5, 2, 2)
    with backend.use("triton"):
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            backend.kernels(q)
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            selective_rope(q, q, phi, torch.ones(2))


def test_torch_backend_equals_the_default_route_on_the_cpu():
    torch.manual_seed(0)
    layer = SelectiveRoPE(16, 2, 8).double()
    q, k = torch.randn(2, 7, 2, 8, dtype=torch.float64), torch.randn(2, 7, 2, 8, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    auto = layer(q, k, x)[:2]
    with backend.use("torch"):
        forced = layer(q, k, x)[:2]
    assert all(rel_err(a, b) == 0 for a, b in zip(auto, forced))
