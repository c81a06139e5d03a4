"""Kernel tests (marked ``kernels``): interpreted on the CPU (``TRITON_INTERPRET=1``) or
run on CUDA.

The interpreter flag is read when the kernels are decorated, so these tests run in a
process of their own: ``TRITON_INTERPRET=1 python -m pytest -m kernels tests``; the other
pass deselects them (``-m "not kernels"``). Kernel tests marked ``gpu`` need CUDA and the
compiled kernels (no interpreter). Every ``torch.empty`` / ``torch.empty_like`` made during
a kernel test is filled with NaN (integers with a large negative value), so an element a
kernel forgets to write, or a scratch entry it reads before writing, shows up as NaN or
garbage.
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("kernels") is None:
            continue
        if item.get_closest_marker("gpu") is not None:
            if not CUDA:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
            elif INTERPRET:
                item.add_marker(pytest.mark.skip(reason="GPU tests run the compiled kernels: unset TRITON_INTERPRET"))
        elif not (CUDA or INTERPRET):
            item.add_marker(pytest.mark.skip(reason="no CUDA and TRITON_INTERPRET is not 1 (run: TRITON_INTERPRET=1 python -m pytest -m kernels tests)"))


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.numel() and not isinstance(tensor, torch._subclasses.FakeTensor):
        tensor.fill_(float("nan") if tensor.is_floating_point() else -(2**30))
    return tensor


@pytest.fixture(autouse=True)
def poisoned_empty(request, monkeypatch):
    """In kernel tests, NaN-fill every torch.empty / torch.empty_like made during the test."""
    if request.node.get_closest_marker("kernels") is None:
        yield
        return
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: _poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: _poison(empty_like(*a, **kw)))
    yield


@pytest.fixture
def device() -> str:
    return "cuda" if CUDA and not INTERPRET else "cpu"
