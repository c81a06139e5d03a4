"""torch.compile of whole models on the CPU routes, through benchmarks/check_compile.py (on
CUDA the same script runs in the GPU session): for every host and position encoding, a
training step on a dense, left-padded or packed (cu_seqlens) batch traces as one graph,
compiles with fullgraph=True, and its loss and gradients equal eager's."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from srope.registry import mixers, positions
from tests.benchmarks.conftest import as_from_the_command_line

ROOT = Path(__file__).resolve().parents[2]
MIXERS, POSITIONS = tuple(mixers), tuple(positions)  # every registered host and encoding


def check_compile(tmp_path, monkeypatch, *options: str, backend: str = "aot_eager") -> list[dict]:
    """The script's results for ``options`` on the CPU under ``backend``."""
    out = tmp_path / "compile.json"
    monkeypatch.setattr(sys, "argv", ["check_compile.py", "--out", str(out), "--device", "cpu", "--backend", backend, *options])
    as_from_the_command_line(monkeypatch)  # its `common`
    runpy.run_path(str(ROOT / "benchmarks" / "check_compile.py"), run_name="__main__")
    results = json.loads(out.read_text())["results"]
    assert results and not [r for r in results if "error" in r], results
    return results


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_compiled_training_step_is_one_graph_and_matches_eager(tmp_path, monkeypatch, mixer, position):
    """One graph, compiled with fullgraph=True (which raises at a graph break, aot_eager
    tracing the forward and backward graphs), no host sync traced into it, and the loss and
    every gradient as eager's, on a dense and a packed batch, and left-padded where the
    encoding has a padded route of its own (RoPE's positions, Selective RoPE's rows and masked
    angles; NoPE's would only repeat the hosts' routes those cover). fullgraph=True traces a
    tensor read as a Python number (a size taken from cu_seqlens, say) instead of refusing
    it: hence the sync count. A packed batch sizes its per-document rows from cu_seqlens in
    eager; compiled, it must not (ops/layout.py)."""
    layouts = ("dense", "packed") + (("padded",) if position != "nope" else ())
    (record,) = check_compile(tmp_path, monkeypatch, "--no-explain", "--mixers", mixer, "--positions", position, "--layouts", ",".join(layouts))
    for layout in layouts:
        result = record[layout]
        assert result["fullgraph"] and result["compiled_graphs"] == 1 and result["host_syncs"] == 0, (layout, result)
        assert result["loss_error"] <= 1e-6 and result["grad_error"] <= 2e-5, (layout, result)
        assert result["worst_param_error"] <= 1e-4, (layout, result)  # no small parameter hidden by the embedding's


def test_explain_finds_no_graph_break(tmp_path, monkeypatch):
    """explain (the script's report of breaks and where) agrees on one host."""
    (record,) = check_compile(tmp_path, monkeypatch, "--mixers", "gated_deltanet", "--positions", "selective_rope", "--layouts", "dense,packed")
    for layout in ("dense", "packed"):
        assert record[layout]["breaks"] == 0 and record[layout]["graphs"] == 1, record[layout]
        assert record[layout]["fullgraph"], record[layout]


def test_inductor_compiles_gated_deltanet_gradients_right(tmp_path, monkeypatch):
    """Under inductor (what users compile with), not only aot_eager: a two-layer Gated DeltaNet
    on a packed batch had the loss right and gradients 46-210% off, through the padding's
    product with the mask and the short conv's transposed conv1d route (ops/layout.py,
    ops/conv.py). One case: an inductor compile of the backward takes about a minute here."""
    out = tmp_path / "compile.json"
    monkeypatch.setattr(sys, "argv", ["check_compile.py", "--out", str(out), "--device", "cpu", "--backend", "inductor", "--no-explain",
                                      "--mixers", "gated_deltanet", "--positions", "nope", "--layouts", "packed"])
    as_from_the_command_line(monkeypatch)
    runpy.run_path(str(ROOT / "benchmarks" / "check_compile.py"), run_name="__main__")
    (record,) = json.loads(out.read_text())["results"]
    result = record["packed"]
    assert "error" not in result and result["fullgraph"], result
    assert result["loss_error"] <= 1e-5 and result["worst_param_error"] <= 1e-4, result


@pytest.mark.inductor
@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_inductor_training_step_matches_eager(tmp_path, monkeypatch, mixer, position):
    """Every host and position encoding under inductor on the CPU, on a dense, a left-padded
    and a packed batch in one process: one graph with fullgraph=True, no host sync, and the
    loss, all gradients together and every parameter's gradient within 1e-4 relative of
    eager's. Inductor on the CPU has compiled gradients wrong where aot_eager was exact (a
    product with the padding mask, a transposed conv1d: ops/layout.py, ops/conv.py). Each
    case compiles three forward and backward graphs, minutes on 2 cores: marked inductor,
    run by make test-inductor."""
    layouts = ("dense", "padded", "packed")
    (record,) = check_compile(tmp_path, monkeypatch, "--no-explain", "--mixers", mixer, "--positions", position, "--layouts", ",".join(layouts),
                              backend="inductor")
    for layout in layouts:
        result = record[layout]
        assert result["fullgraph"] and result["compiled_graphs"] == 1 and result["host_syncs"] == 0, (layout, result)
        assert result["loss_error"] <= 1e-4 and result["grad_error"] <= 1e-4, (layout, result)
        assert result["worst_param_error"] <= 1e-4, (layout, result)
