"""torch.compile of whole models on the CPU routes (benchmarks/check_compile.py; on CUDA the
same script runs in the GPU session): for every host and position encoding, a training step
on a dense, left-padded or packed (cu_seqlens) batch traces as one graph, compiles with
fullgraph=True, and its loss and gradients equal eager's."""

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


MIXERS = ("attention", "forgetting_attn", "gla", "gated_deltanet")
POSITIONS = ("nope", "rope", "selective_rope")
# Left padding for the encodings with a padded route of their own (RoPE's positions, Selective
# RoPE's rows and masked angles); NoPE's would only repeat the hosts' routes those cover.
CASES = [(mixer, position, layout) for mixer in MIXERS for position in POSITIONS
         for layout in ("dense", "packed") + (("padded",) if position != "nope" else ())]


@pytest.mark.parametrize(("mixer", "position", "layout"), CASES)
def test_compiled_training_step_is_one_graph_and_matches_eager(check_compile, mixer, position, layout):
    """One graph, compiled with fullgraph=True (which raises at a graph break, aot_eager
    tracing the forward and backward graphs), no host sync traced into it, and the loss and
    every gradient as eager's. fullgraph=True traces a tensor read as a Python number (a
    size taken from cu_seqlens, say) instead of refusing it: hence the sync count. A packed
    batch sizes its per-document rows from cu_seqlens in eager; compiled, it must not
    (ops/layout.py)."""
    result = check_compile["check"](mixer, position, "cpu", "aot_eager", (layout,), explain=False)[layout]
    assert result["fullgraph"] and result["compiled_graphs"] == 1 and result["host_syncs"] == 0, result
    assert result["loss_error"] <= 1e-6 and result["grad_error"] <= 2e-5, result
    assert result["worst_param_error"] <= 1e-4, result  # no small parameter hidden by the embedding's


@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_explain_finds_no_graph_break(check_compile, layout):
    """explain (check_compile.py's report of breaks and where) agrees on one host."""
    model = check_compile["build"]("gated_deltanet", "selective_rope", "cpu")
    ids, kwargs = check_compile["batch"](model, layout, "cpu")
    found = check_compile["graph_breaks"](model, ids, kwargs, "cpu")
    assert found["breaks"] == 0 and found["graphs"] == 1, found
