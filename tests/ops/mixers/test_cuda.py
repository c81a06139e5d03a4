"""Every CUDA path of the mixers against the CPU float64 reference (GPU only).

Run on the GPU machine with ``python -m pytest -m gpu tests/ops/mixers -q``. The case
table and the comparison live in ``cuda_checks.py``; every case records its measured errors
as a JUnit property (``benchmarks/run.sh gpu-tests`` keeps them). fla's first calls autotune (minutes on a fresh machine without a Triton cache).
"""

from __future__ import annotations

import pytest
import torch

from srope.ops.mixers import fla_available, fla_gated_backward_is_broken
from tests.ops.mixers import cuda_checks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = cuda_checks.cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cuda_path_matches_cpu_reference(record_property, case):
    result = cuda_checks.run_case(case, batch=2, length=300)
    record_property("result", result)
    if result["passed"] is None:
        pytest.skip(result["skipped"])
    assert result["passed"], result


def test_fla_gated_delta_rule_training_is_refused_where_broken():
    if not fla_available():
        pytest.skip("flash-linear-attention is not importable")
    refused = cuda_checks.gdn_fla_training_refused()
    assert refused["raised"] is fla_gated_backward_is_broken(), refused
