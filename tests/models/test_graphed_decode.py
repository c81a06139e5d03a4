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


def test_graphs_are_kept_per_backend_setting(monkeypatch):
    """A graph replays the kernels it captured: a step under another srope.backend setting
    captures its own (the capture itself needs CUDA; here it is stood in for)."""
    from types import SimpleNamespace

    from srope import backend
    from srope.models import graphed_decode

    monkeypatch.setattr(graphed_decode, "_DecodeGraph", lambda *args: SimpleNamespace(step=lambda ids, cache: args[3]))
    model = torch.nn.Module()
    graphs, cache = graphed_decode.DecodeGraphs(model), SimpleNamespace(layers=[])
    graphs.step(torch.zeros(2, 1, dtype=torch.long), cache)
    with backend.use("torch"):
        graphs.step(torch.zeros(2, 1, dtype=torch.long), cache)
    graphs.step(torch.zeros(2, 1, dtype=torch.long), cache)
    assert sorted(key[2] for key in graphs.graphs) == ["auto", "torch"]


def test_a_model_is_freed_when_its_last_reference_goes():
    """The model owns its DecodeGraphs, which refers back to it weakly: a strong reference
    would make a cycle, and a deleted model would keep its (device) memory until the garbage
    collector ran. Copies and pickles get graphs of their own model."""
    import copy
    import gc
    import pickle
    import weakref

    from tests.models.test_models import tiny_model

    model = tiny_model("gla", "selective_rope")
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone._decode_graphs.model is clone and model._decode_graphs.model is model
    gc.disable()
    try:
        ref = weakref.ref(model)
        del model, clone
        assert ref() is None
    finally:
        gc.enable()
