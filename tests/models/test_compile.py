"""torch.compile of whole models on the CPU routes (benchmarks/check_compile.py; on CUDA the
same script runs in the GPU session): no graph break on dense or left-padded batches, for
every host and position encoding, and compiled training steps equal to eager."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check_compile():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "benchmarks"))  # its `common`
        return runpy.run_path(str(ROOT / "benchmarks" / "check_compile.py"))


@pytest.mark.parametrize("position", ["nope", "rope", "selective_rope"])
@pytest.mark.parametrize("mixer", ["attention", "forgetting_attn", "gla", "gated_deltanet"])
def test_dense_models_trace_as_one_graph(check_compile, mixer, position):
    model = check_compile["build"](mixer, position, "cpu")
    ids, kwargs = check_compile["batch"](model, "dense", "cpu")
    found = check_compile["graph_breaks"](model, ids, kwargs, "cpu")
    assert found["breaks"] == 0 and found["graphs"] == 1, found


@pytest.mark.parametrize("mixer", ["attention", "forgetting_attn", "gla", "gated_deltanet"])
def test_compiled_selective_rope_training_step_matches_eager(check_compile, mixer):
    """Dense and left-padded batches: one graph each (fullgraph=True), loss and all gradients
    as eager's (packed batches: below)."""
    record = check_compile["check"](mixer, "selective_rope", "cpu", "aot_eager", ("dense", "padded"))
    for layout in ("dense", "padded"):
        result = record[layout]
        assert result["breaks"] == 0 and result["fullgraph"], (layout, result)
        assert result["loss_error"] <= 1e-6 and result["grad_error"] <= 2e-5, (layout, result)
        assert result["worst_param_error"] <= 1e-4, (layout, result)  # no small parameter hidden by the embedding's


@pytest.mark.parametrize("mixer", ["attention", "gla"])
def test_packed_batches_break_only_at_the_rows_width(check_compile, mixer):
    """A packed batch (cu_seqlens) breaks the graph only where the torch routes size their
    per-document rows from cu_seqlens (ops/layout.py): the boundary check is asserted on
    the device and the loss masks document starts without boolean indexing. The compiled
    step equals eager."""
    result = check_compile["check"](mixer, "selective_rope", "cpu", "aot_eager", ("packed",))["packed"]
    assert result["reasons"] and all(str(r["where"]).startswith("srope/ops/layout.py") for r in result["reasons"]), result
    assert result["loss_error"] <= 1e-6 and result["grad_error"] <= 2e-5 and result["worst_param_error"] <= 1e-4, result
