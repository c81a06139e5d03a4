"""The host's fused pieces (srope.ops.fused): the PyTorch path against the unfused PyTorch
expression in float64, the errors, and on CUDA fla's kernels against float64 forward and
backward, in the dtypes a training step gives them."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from srope.layers.common import GatedRMSNorm, RMSNorm
from srope.ops.fused import rms_norm, rms_norm_gated, swiglu
from srope.ops.mixers import _common
from tests.helpers import generator, rel_err


def _inputs(shape, seed, n):
    gen = generator(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(n)]


def test_torch_path_is_the_unfused_expression():
    x, h, g = _inputs((3, 7, 5), 0, 3)
    w = torch.rand(5, generator=generator(1), dtype=torch.float64) + 0.5
    assert torch.equal(rms_norm(x, w, 1e-5, backend="torch"), F.rms_norm(x, (5,), w, 1e-5))
    out, total = rms_norm(x, w, 1e-5, residual=h, backend="torch")
    assert torch.equal(total, h + x) and torch.equal(out, F.rms_norm(h + x, (5,), w, 1e-5))
    assert torch.equal(rms_norm_gated(x, g, w, 1e-5, backend="torch"), F.rms_norm(x, (5,), w, 1e-5) * F.silu(g))
    assert torch.equal(swiglu(g, x, backend="torch"), F.silu(g) * x)


def test_rmsnorm_module_keeps_nn_rmsnorm_state_and_values():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(6, eps=1e-6), nn.RMSNorm(6, eps=1e-6)
    nn.init.normal_(theirs.weight)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    assert list(GatedRMSNorm(6).state_dict()) == ["norm.weight"]


def test_gated_norm_computes_in_the_weight_dtype():
    """A bf16 mixer output under a float32 norm weight is normalised in float32, as before."""
    x = torch.randn(2, 4, 8).bfloat16()
    w = torch.ones(8)
    out = rms_norm_gated(x, None, w, 1e-5, backend="torch")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.rms_norm(x.float(), (8,), w, 1e-5))


def test_bad_input_is_refused():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="weight must be \\[4\\]"):
        rms_norm(x, torch.ones(5))
    with pytest.raises(ValueError, match="residual must have the shape"):
        rms_norm(x, torch.ones(4), residual=torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="gate must have the shape"):
        rms_norm_gated(x, torch.randn(2, 3), torch.ones(4))
    with pytest.raises(ValueError, match="one shape"):
        swiglu(x, torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="backend must be one of"):
        rms_norm(x, torch.ones(4), backend="triton")
    with pytest.raises(ValueError, match="needs CUDA"):
        rms_norm(x, torch.ones(4), backend="fla")


# ---------------------------------------------------------------------------------------
# CUDA: fla's kernels against float64
# ---------------------------------------------------------------------------------------

def _fla_or_skip():
    if _common.fla_ops() is None:
        pytest.skip("flash-linear-attention is not importable")


def _check(fn, tensors64, dtypes, tol, autocast=False):
    """``fn`` on CUDA in ``dtypes`` (and autocast) against ``fn`` in float64 on the CPU through
    the PyTorch path: every output and every input gradient."""
    results = {}
    for device in ("cpu", "cuda"):
        inputs = [t.to(device, torch.float64 if device == "cpu" else d).requires_grad_() for t, d in zip(tensors64, dtypes)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and device == "cuda"):
            out = fn(*inputs, backend="torch" if device == "cpu" else "fla")
        outs = out if isinstance(out, tuple) else (out,)
        gen = generator(99)
        grads_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(device, o.dtype) for o in outs]
        grads = torch.autograd.grad(outs, inputs, grads_out)
        results[device] = [t.detach().cpu() for t in (*outs, *grads)]
    errors = [rel_err(a, b) for a, b in zip(results["cuda"], results["cpu"])]
    assert all(e < tol for e in errors), errors
    return results["cuda"]


def _check_norm(fn, shape, dtype, with_other: bool, seed: int):
    """``fn(x, weight, other, backend)`` with ``other`` (residual or gate) in ``dtype`` or None."""
    _fla_or_skip()
    x, other = _inputs(shape, seed, 2)
    w = torch.rand(shape[-1], generator=generator(seed + 1), dtype=torch.float64) + 0.5
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    if with_other:
        _check(fn, (x, w, other), (dtype, torch.float32, dtype), tol)
    else:
        _check(lambda x, w, backend: fn(x, w, None, backend), (x, w), (dtype, torch.float32), tol)


@pytest.mark.parametrize("shape", [(4, 419, 512), (3, 1, 1024), (1, 1000, 96)], ids=["copying", "decode", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fla_rms_norm_matches_float64(shape, dtype, with_residual):
    _check_norm(lambda x, w, h, backend: rms_norm(x, w, 1e-5, residual=h, backend=backend), shape, dtype, with_residual, seed=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fla_residual_under_autocast_keeps_a_float32_sum():
    """The training step's case: a float32 residual stream plus a bf16 block output."""
    _fla_or_skip()
    x, h = _inputs((4, 419, 512), 5, 2)
    w = torch.rand(512, generator=generator(6), dtype=torch.float64) + 0.5
    fn = lambda x, w, h, backend: rms_norm(x, w, 1e-5, residual=h, backend=backend)  # noqa: E731
    out, total, *_ = _check(fn, (x, w, h), (torch.bfloat16, torch.float32, torch.float32), 1e-2, autocast=True)
    assert total.dtype == torch.float32 and out.dtype == torch.bfloat16
    assert rel_err(total, h + x.bfloat16().double()) < 1e-7  # the sum itself is formed in float32


@pytest.mark.parametrize("shape", [(4, 419, 16, 32), (2, 77, 4, 256), (5, 1, 4, 128)], ids=["copying", "gla-370m", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gated", [True, False], ids=["gate", "no-gate"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fla_gated_norm_matches_float64(shape, dtype, gated):
    _check_norm(lambda x, w, g, backend: rms_norm_gated(x, g, w, 1e-5, backend=backend), shape, dtype, gated, seed=7)


@pytest.mark.parametrize("shape", [(4, 419, 1376), (1, 1, 1408), (3, 333, 77)], ids=["copying", "decode", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fla_swiglu_matches_float64(shape, dtype):
    _fla_or_skip()
    g, u = _inputs(shape, 9, 2)
    _check(lambda g, u, backend: swiglu(g, u, backend=backend), (g, u), (dtype, dtype), 1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("mixer", ["gla", "gated_deltanet"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_model_step_with_fla_pieces_is_as_accurate_as_the_torch_pieces(mixer, monkeypatch):
    """A bf16-autocast training step of a whole model with fla's norms and SwiGLU, and with the
    PyTorch pieces, each against the same model's float64 step on the CPU: fla's loss and every
    parameter gradient are no further from float64 than bf16 rounding puts the PyTorch pieces.
    (The two bf16 steps differ from each other by a few percent on the small gradients of some
    parameters, so comparing them with each other says nothing.)"""
    _fla_or_skip()
    from srope.layers import common as layers
    from srope.models import SRopeConfig, SRopeForCausalLM, modeling

    torch.manual_seed(0)
    config = SRopeConfig(mixer=mixer, hidden_size=256, num_hidden_layers=2, num_heads=4, vocab_size=300, position="selective_rope")
    model = SRopeForCausalLM(config)
    reference = copy.deepcopy(model).double()
    ids = torch.randint(0, 300, (3, 333), generator=generator(1))
    reference_loss = reference(input_ids=ids, labels=ids).loss
    reference_loss.backward()
    expected = [reference_loss.detach()] + [p.grad for p in reference.parameters()]
    model, ids = model.cuda(), ids.cuda()
    errors = {}
    for backend in ("fla", "torch"):
        # the pieces alone take each route: srope.backend would move the mixers too
        monkeypatch.setattr(layers, "rms_norm", functools.partial(rms_norm, backend=backend))
        monkeypatch.setattr(layers, "rms_norm_gated", functools.partial(rms_norm_gated, backend=backend))
        monkeypatch.setattr(modeling, "swiglu", functools.partial(swiglu, backend=backend))
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        errors[backend] = [rel_err(a.cpu(), b) for a, b in zip([loss] + [p.grad for p in model.parameters()], expected)]
    names = ["loss"] + [name for name, _ in model.named_parameters()]
    worse = {n: (f, t) for n, f, t in zip(names, errors["fla"], errors["torch"]) if f > 2 * t + 0.02}
    assert errors["fla"][0] < 1e-2 and errors["torch"][0] < 1e-2, (errors["fla"][0], errors["torch"][0])
    assert not worse, f"relative error against float64 (fla, torch pieces): {worse}"


def test_auto_gives_fla_only_large_training_norms_and_decode_sized_inference():
    """fla's norms tune per block of 2,048 rows: "auto" gives them the training calls of large
    models (one shape) and decode-sized inference, and keeps small models' steps (whose
    length may change every curriculum stage) and long inference calls on PyTorch."""
    from srope.ops.fused import FLA_NORM_MIN_ELEMENTS, NORM_INFERENCE_MAX_ROWS, fla_norm_pays

    assert fla_norm_pays(8 * 4096, 1024, grad=True)  # gla-370m's step
    assert fla_norm_pays(4 * 4096 * 4, 256, grad=True)  # its gated output norm at batch 4
    assert not fla_norm_pays(256 * 128, 384, grad=True)  # the CUDA demo's last stage
    assert not fla_norm_pays(FLA_NORM_MIN_ELEMENTS // 64 - 1, 64, grad=True)
    assert fla_norm_pays(NORM_INFERENCE_MAX_ROWS, 4096, grad=False)
    assert not fla_norm_pays(NORM_INFERENCE_MAX_ROWS + 1, 16, grad=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_routes_norms_by_size_on_the_gpu():
    """On the GPU, "auto" is bit-equal to PyTorch's norm for long inference calls and small
    training calls, and to fla's for decode-sized and large training calls."""
    _fla_or_skip()
    from srope.ops.fused import FLA_NORM_MIN_ELEMENTS, NORM_INFERENCE_MAX_ROWS

    w = torch.rand(64, device="cuda") + 0.5
    with torch.no_grad():
        long = torch.randn(NORM_INFERENCE_MAX_ROWS + 1, 64, device="cuda")
        assert torch.equal(rms_norm(long, w, 1e-5), rms_norm(long, w, 1e-5, backend="torch"))
        short = torch.randn(8, 64, device="cuda")
        assert torch.equal(rms_norm(short, w, 1e-5), rms_norm(short, w, 1e-5, backend="fla"))
    small = torch.randn(4096, 64, device="cuda", requires_grad=True)
    assert torch.equal(rms_norm(small, w, 1e-5), rms_norm(small, w, 1e-5, backend="torch"))
    large = torch.randn(FLA_NORM_MIN_ELEMENTS // 64, 64, device="cuda", requires_grad=True)
    assert torch.equal(rms_norm(large, w, 1e-5), rms_norm(large, w, 1e-5, backend="fla"))