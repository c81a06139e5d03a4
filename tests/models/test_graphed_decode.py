"""The captured decoding step's state write-back (the replay itself needs CUDA: it is checked
against eager decoding on the GPU by benchmarks/check_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from srope.models.graphed_decode import _copy_all


def test_copy_all_writes_every_state_tensor_of_every_dtype():
    g = torch.Generator().manual_seed(0)
    targets = [torch.zeros(3), torch.zeros(2, 4, dtype=torch.float64), torch.zeros(4, 3, dtype=torch.bfloat16), torch.zeros(5)]
    sources = [torch.randn(3, generator=g), torch.randn(2, 4, generator=g, dtype=torch.float64),
               torch.randn(3, 4, generator=g).to(torch.bfloat16).t(), torch.randn(5, generator=g)]  # one strided
    _copy_all(targets, sources)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources))


def test_copy_all_refuses_lists_of_different_lengths():
    with pytest.raises(ValueError):
        _copy_all([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)])
