"""check_cu_seqlens: a model's one boundary tensor is checked on the host once, not per layer."""

from __future__ import annotations

import pytest
import torch

from srope.ops import checks


def test_cu_seqlens_checked_once_until_it_changes(monkeypatch):
    calls = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or tolist(self))
    cu = torch.tensor([0, 3, 7, 10])
    assert checks.check_cu_seqlens(cu, 1, 10) == 3
    assert checks.check_cu_seqlens(cu, 1, 10) == 3
    assert len(calls) == 1  # the second check reused the first
    with pytest.raises(ValueError, match="end at the sequence length 12"):
        checks.check_cu_seqlens(cu, 1, 12)  # another length is checked again
    cu[1] = 8  # an in-place write: checked again, and now refused
    with pytest.raises(ValueError, match="non-decreasing"):
        checks.check_cu_seqlens(cu, 1, 10)
    with pytest.raises(ValueError, match="non-decreasing"):
        checks.check_cu_seqlens(torch.tensor([0, 8, 7, 10]), 1, 10)  # an equal-looking new tensor too
