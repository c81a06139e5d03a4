"""The compiled kernels on CUDA at real sizes (GPU machine, TRITON_INTERPRET unset):

    python -m pytest tests/ops/rotary/test_gpu.py -q

The cases live in ``cuda_checks.py``; every test records its measured errors as a JUnit
property (``--junitxml``: ``benchmarks/run.sh gpu-tests`` keeps them with the run).
"""

from __future__ import annotations

import pytest
import torch

from tests.ops.rotary import cuda_checks

pytestmark = [pytest.mark.gpu, pytest.mark.kernels]  # compiled Triton kernels (tests/conftest.py)


@pytest.mark.parametrize("name", list(cuda_checks.SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_real_sizes_match_float64(record_property, name, dtype):
    errors = cuda_checks.rotation_errors(name, dtype)
    record_property("errors", errors)
    tol = cuda_checks.TOLERANCE[dtype]
    assert errors.pop("final_phase") < 1e-12
    assert all(value < tol for value in errors.values()), errors


def test_backward_is_deterministic_at_scale():
    assert cuda_checks.backward_is_deterministic()


def test_phase_accuracy_at_a_million_tokens(record_property):
    error = cuda_checks.phase_error_rad(2**20)
    record_property("phase_error_rad", error)
    assert error < cuda_checks.PHASE_TOLERANCE_RAD


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_real_size(record_property, dtype):
    errors = cuda_checks.rope_errors(dtype)
    record_property("errors", errors)
    assert all(value < cuda_checks.TOLERANCE[dtype] for value in errors.values()), errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_step_matches_the_module(record_property, dtype):
    errors = cuda_checks.decode_errors(dtype)
    record_property("errors", errors)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert errors["conv_state"] < 1e-6 and errors["q"] < tol and errors["k"] < tol and errors["phase"] < tol, errors


def test_inductor_compile_and_cuda_graph(record_property):
    errors = cuda_checks.compile_and_graph_errors()
    record_property("errors", errors)
    assert errors["graph_breaks"] == 0
    assert errors["compiled_max_err"] < 1e-2 and errors["cuda_graph_max_err"] < 1e-6, errors


def test_programmatic_dependent_launch_gives_the_same_results(record_property):
    errors = cuda_checks.programmatic_launch_mismatches()
    record_property("errors", errors)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert errors["pdl_active"], errors
    assert errors["eager"] == 0, errors
