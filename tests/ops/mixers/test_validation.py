"""Bad inputs raise clear errors; backend choice and the fla #640 guard (no GPU needed)."""

from __future__ import annotations

import warnings

import pytest
import torch

from srope.ops.mixers import (
    fla_gated_backward_is_broken,
    forgetting_attention,
    gated_delta_rule,
    gla,
    softmax_attention,
)
from srope.ops.mixers import _common as common
from srope.ops.mixers.delta_rule import issue_640_problem


def _gla_args(**overrides):
    args = dict(q=torch.zeros(2, 5, 3, 4), k=torch.zeros(2, 5, 3, 4), v=torch.zeros(2, 5, 3, 6), log_decay=torch.zeros(2, 5, 3, 4))
    return args | overrides


def _gdn_args(**overrides):
    args = dict(
        q=torch.zeros(2, 5, 3, 4), k=torch.zeros(2, 5, 3, 4), v=torch.zeros(2, 5, 3, 6),
        beta=torch.zeros(2, 5, 3), log_decay=torch.zeros(2, 5, 3),
    )  # fmt: skip
    return args | overrides


def _attn_args(**overrides):
    args = dict(q=torch.zeros(2, 3, 4, 8), k=torch.zeros(2, 5, 2, 8), v=torch.zeros(2, 5, 2, 6), log_forget=torch.zeros(2, 5, 4))
    return args | overrides


GLA_BAD = [
    ("q rank", dict(q=torch.zeros(2, 5, 12)), ValueError, "q must have 4 dimensions"),
    ("q not a tensor", dict(q=[[0.0]]), TypeError, "q must be a torch.Tensor"),
    ("T = 0", dict(q=torch.zeros(2, 0, 3, 4)), ValueError, "T >= 1"),
    ("k shape", dict(k=torch.zeros(2, 5, 3, 5)), ValueError, r"k must have shape \[2, 5, 3, 4\]"),
    ("v heads", dict(v=torch.zeros(2, 5, 2, 6)), ValueError, r"v must have shape \[2, 5, 3, \?\]"),
    ("decay shape", dict(log_decay=torch.zeros(2, 5, 3)), ValueError, "log_decay must have shape"),
    ("integer q", dict(q=torch.zeros(2, 5, 3, 4, dtype=torch.long)), TypeError, "floating-point"),
    ("dtype mismatch", dict(v=torch.zeros(2, 5, 3, 6, dtype=torch.float64)), TypeError, "share a dtype"),
    ("state shape", dict(initial_state=torch.zeros(2, 3, 6, 4)), ValueError, r"initial_state must have shape \[2, 3, 4, 6\]"),
    ("state per packed sequence", dict(initial_state=torch.zeros(2, 3, 4, 6), cu_seqlens=torch.tensor([0, 2, 5])), ValueError, "batch size 1"),
    ("scale type", dict(scale="0.5"), TypeError, "scale must be a float"),
    ("scale nan", dict(scale=float("nan")), ValueError, "scale must be finite"),
    ("final-state flag", dict(output_final_state=1), TypeError, "output_final_state must be a bool"),
    ("backend", dict(backend="cuda"), ValueError, "backend must be one of"),
    ("fla on CPU", dict(backend="fla"), ValueError, "needs CUDA tensors"),
    ("device mismatch", dict(log_decay=torch.zeros(2, 5, 3, 4, device="meta")), ValueError, "on one device"),
]


@pytest.mark.parametrize("name,overrides,error,match", GLA_BAD, ids=[b[0] for b in GLA_BAD])
def test_gla_bad_inputs(name, overrides, error, match):
    with pytest.raises(error, match=match):
        gla(**_gla_args(**overrides))


def test_packed_checks():
    packed = {name: x[:1] for name, x in _gla_args().items()}
    with pytest.raises(ValueError, match="end at the sequence length 5"):
        gla(**packed, cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 3, 4, 6\]"):
        gla(**packed, cu_seqlens=torch.tensor([0, 3, 5]), initial_state=torch.zeros(1, 3, 4, 6))
    with pytest.raises(ValueError, match="int32/int64"):
        gla(**packed, cu_seqlens=torch.tensor([0.0, 5.0]))


GDN_BAD = [
    ("beta shape", dict(beta=torch.zeros(2, 5, 3, 1)), ValueError, r"beta must have shape \[2, 5, 3\]"),
    ("decay per channel", dict(log_decay=torch.zeros(2, 5, 3, 4)), ValueError, r"log_decay must have shape \[2, 5, 3\]"),
    ("beta integer", dict(beta=torch.zeros(2, 5, 3, dtype=torch.long)), TypeError, "beta must be a floating"),
    ("k heads", dict(k=torch.zeros(2, 5, 1, 4)), ValueError, "k must have shape"),
    ("l2norm flag", dict(qk_l2norm="yes"), TypeError, "qk_l2norm must be a bool"),
    ("state shape", dict(initial_state=torch.zeros(2, 3, 4)), ValueError, "initial_state must have shape"),
    ("fla on CPU", dict(backend="fla"), ValueError, "needs CUDA tensors"),
]


@pytest.mark.parametrize("name,overrides,error,match", GDN_BAD, ids=[b[0] for b in GDN_BAD])
def test_gated_delta_rule_bad_inputs(name, overrides, error, match):
    with pytest.raises(error, match=match):
        gated_delta_rule(**_gdn_args(**overrides))


ATTN_BAD = [
    ("Tq > Tk", dict(q=torch.zeros(2, 6, 4, 8)), ValueError, r"Tq <= Tk"),
    ("heads not divisible", dict(k=torch.zeros(2, 5, 3, 8), v=torch.zeros(2, 5, 3, 6)), ValueError, "multiple of the key/value heads"),
    ("k head dim", dict(k=torch.zeros(2, 5, 2, 7)), ValueError, r"k must have shape \[2, \?, \?, 8\]"),
    ("v length", dict(v=torch.zeros(2, 4, 2, 6)), ValueError, r"v must have shape \[2, 5, 2, \?\]"),
    ("forget per kv head", dict(log_forget=torch.zeros(2, 5, 2)), ValueError, r"log_forget must have shape \[2, 5, 4\]"),
    ("forget missing", dict(log_forget=None), TypeError, "log_forget must be a torch.Tensor"),
    ("key_mask shape", dict(key_mask=torch.ones(2, 3, dtype=torch.bool)), ValueError, r"key_mask must have shape \[2, 5\]"),
    ("packed needs Tq == Tk", dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "Tq == Tk"),
    ("fla on CPU", dict(backend="fla"), ValueError, "needs CUDA tensors"),
    ("backend", dict(backend=None), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("name,overrides,error,match", ATTN_BAD, ids=[b[0] for b in ATTN_BAD])
def test_attention_bad_inputs(name, overrides, error, match):
    with pytest.raises(error, match=match):
        forgetting_attention(**_attn_args(**overrides))
    if "forget" not in name:
        args = _attn_args(**overrides)
        del args["log_forget"]
        with pytest.raises(error, match=match):
            softmax_attention(**args)


def test_packed_attention_needs_batch_one():
    args = _attn_args(q=torch.zeros(2, 5, 4, 8))
    with pytest.raises(ValueError, match="batch size 1"):
        forgetting_attention(**args, cu_seqlens=torch.tensor([0, 2, 5]))


# ----------------------------------------------------------------------------------------
# Backend choice without a GPU: a CUDA *device* object is enough for the decision logic.
# ----------------------------------------------------------------------------------------

CUDA = torch.device("cuda")


def test_resolve_backend(monkeypatch):
    assert common.resolve_backend("auto", torch.device("cpu")) == "torch"
    assert common.resolve_backend("torch", CUDA) == "torch"
    assert common.resolve_backend("auto", CUDA, "no such kernel") == "torch"
    with pytest.raises(ValueError, match="cannot run this call: no such kernel"):
        common.resolve_backend("fla", CUDA, "no such kernel")
    monkeypatch.setattr(common, "_load_fla", lambda: (None, "ModuleNotFoundError: fla"))
    monkeypatch.setattr(common, "_warned", set())
    with pytest.warns(RuntimeWarning, match="not importable"):
        assert common.resolve_backend("auto", CUDA) == "torch"
    with pytest.raises(ImportError, match=r"srope\[cuda\].*ModuleNotFoundError: fla"):
        common.resolve_backend("fla", CUDA)
    monkeypatch.setattr(common, "_load_fla", lambda: (object(), None))
    assert common.resolve_backend("auto", CUDA) == "fla" and common.resolve_backend("fla", CUDA) == "fla"


@pytest.mark.parametrize(
    "capability,name,triton_version,broken",
    [
        ((9, 0), "NVIDIA H200", "3.6.0", True),
        ((9, 0), "NVIDIA H100 80GB HBM3", "3.4.0", True),
        ((9, 0), "NVIDIA H200", "3.7.0+git1234", True),
        ((9, 0), "NVIDIA H200", "3.7.1", False),
        ((9, 0), "NVIDIA H200", "3.3.1", False),
        ((9, 0), "NVIDIA H200", None, False),
        ((8, 0), "NVIDIA A100-SXM4-80GB", "3.6.0", False),
        ((10, 0), "NVIDIA B200", "3.6.0", False),
    ],
)
def test_issue_640_condition(capability, name, triton_version, broken):
    assert common.gated_backward_broken_for(capability, name, triton_version) is broken


def test_no_cuda_means_not_broken():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only answer; the GPU tests cover CUDA machines")
    assert fla_gated_backward_is_broken() is False and fla_gated_backward_is_broken("cpu") is False


def test_issue_640_routing(monkeypatch):
    monkeypatch.setattr(common, "fla_gated_backward_is_broken", lambda device=None: True)
    monkeypatch.setattr(common, "_warned", set())
    assert issue_640_problem(CUDA, gated=True, grad=False, backend="auto") is None  # forward-only may use fla
    assert issue_640_problem(CUDA, gated=False, grad=True, backend="auto") is None  # plain DeltaNet is unaffected
    assert issue_640_problem(torch.device("cpu"), gated=True, grad=True, backend="auto") is None
    with pytest.warns(RuntimeWarning, match="fla #640"):
        assert "#640" in issue_640_problem(CUDA, gated=True, grad=True, backend="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning comes once
        assert "#640" in issue_640_problem(CUDA, gated=True, grad=True, backend="auto")
    with pytest.raises(RuntimeError, match="issue #640"):
        issue_640_problem(CUDA, gated=True, grad=True, backend="fla")
    monkeypatch.setattr(common, "fla_gated_backward_is_broken", lambda device=None: False)
    assert issue_640_problem(CUDA, gated=True, grad=True, backend="fla") is None


def test_empty_packed_sequences_are_dropped_for_fla_and_restored():
    h0 = torch.arange(3 * 2, dtype=torch.float32).view(3, 1, 2, 1).requires_grad_()
    cu, state, restore = common.without_empty_sequences(torch.tensor([0, 3, 3, 5]), h0)
    assert cu.tolist() == [0, 3, 5] and torch.equal(state, h0[[0, 2]])
    final = -torch.ones(2, 1, 2, 1)
    restored = restore(final)
    assert torch.equal(restored, torch.stack([final[0], h0[1], final[1]]))
    restored.sum().backward()
    assert h0.grad.view(3, 2).tolist() == [[0, 0], [1, 1], [0, 0]]  # only the empty sequence's state passes through
    cu, state, restore = common.without_empty_sequences(torch.tensor([0, 0, 4]), None)
    assert cu.tolist() == [0, 4] and state is None
    assert torch.equal(restore(torch.ones(1, 1, 2, 1)), torch.stack([torch.zeros(1, 2, 1), torch.ones(1, 2, 1)]))


def test_torch_paths_ignore_autocast():
    """Inside a bfloat16 autocast region the PyTorch paths still compute in float32."""
    from tests.ops.mixers.common import attention_inputs, delta_inputs, gla_inputs

    q, k, v, g, h0 = (x.float() for x in gla_inputs(1, 20, 2, 4, 3, seed=1))
    q2, k2, v2, beta, g2, _ = (x.float() for x in delta_inputs(1, 20, 2, 4, 3, seed=2))
    qa, ka, va, f = (x.float() for x in attention_inputs(1, 20, 20, 2, 2, 4, 3, seed=3))
    calls = [
        lambda: gla(q, k, v, g, initial_state=h0, output_final_state=True),
        lambda: gated_delta_rule(q2, k2, v2, beta, g2, output_final_state=True),
        lambda: (forgetting_attention(qa, ka, va, f),),
        lambda: (softmax_attention(qa, ka, va),),
    ]
    for fn in calls:
        plain = fn()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = fn()
        for a, b in zip(autocast, plain):
            assert a.dtype == torch.float32 and torch.allclose(a, b, rtol=1e-6, atol=1e-6)
