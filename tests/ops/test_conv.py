"""The short causal conv: its final state, the fla route's plumbing (CPU, with a float64
stand-in for fla's ``causal_conv1d``) and fla's kernel itself (GPU).

The stand-in follows fla 0.6.0's contract as its kernel reads it: ``x [B, T, C]``,
``weight [C, W]``, ``initial_state [N, C, W]`` whose slots ``1..W-1`` hold the inputs
before the first token, a restart at every ``cu_seqlens`` boundary, the activation after
the bias. It is written token by token, independently of ``causal_conv``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from srope.ops import conv as conv_ops
from srope.ops.conv import causal_conv, last_inputs, short_conv
from srope.ops.layout import RowLayout
from srope.ops.mixers import _common
from tests.helpers import generator, rel_err


def naive_fla_conv(x, weight, bias=None, initial_state=None, activation=None, cu_seqlens=None):
    x64, w64 = x.double(), weight.double()
    batch, length, channels = x.shape
    width = weight.shape[1]
    bounds = [(b, 0, length) for b in range(batch)] if cu_seqlens is None else [
        (0, int(s), int(e)) for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    out = torch.zeros_like(x64)
    for n, (b, start, end) in enumerate(bounds):
        prior = torch.zeros(channels, width - 1, dtype=torch.float64) if initial_state is None else initial_state[n, :, 1:].double()
        for t in range(start, end):
            acc = torch.zeros(channels, dtype=torch.float64)
            for w in range(width):
                src = t - (width - 1) + w
                value = x64[b, src] if src >= start else prior[:, src - start + width - 1]
                acc = acc + w64[:, w] * value
            if bias is not None:
                acc = acc + bias.double()
            out[b, t] = F.silu(acc) if activation in ("silu", "swish") else acc
    return out.to(x.dtype), None


@pytest.fixture
def fake_fla(monkeypatch):
    calls = []

    def causal_conv1d(x, weight, bias=None, initial_state=None, activation=None, cu_seqlens=None):
        calls.append({"cu_seqlens": cu_seqlens is not None, "initial_state": initial_state is not None})
        assert x.is_contiguous() and weight.shape == (x.shape[-1], weight.shape[1])
        if initial_state is not None:
            assert initial_state.shape[1:] == (x.shape[-1], weight.shape[1])
        return naive_fla_conv(x, weight, bias, initial_state, activation, cu_seqlens)

    monkeypatch.setattr(_common, "fla_ops", lambda: SimpleNamespace(causal_conv1d=causal_conv1d))
    monkeypatch.setattr(conv_ops, "fla_conv_problem", lambda x, weight, state: None)
    return calls


def layouts(batch: int, length: int, device: str = "cpu"):
    """Dense, right- and left-padded, and packed layouts (with an empty and a 1-token
    sequence), as ``{name: (sequences, layout)}``."""
    mask = torch.ones(batch, length, dtype=torch.long, device=device)
    mask[0, 7:] = 0
    left = torch.ones(batch, length, dtype=torch.long, device=device)
    left[-1, :4] = 0
    packed = torch.tensor([0, 5, 5, 6, batch * length], device=device)
    return {
        "dense": (batch, RowLayout(batch, length, device=device)),
        "right_pad": (batch, RowLayout(batch, length, attention_mask=mask)),
        "left_pad": (batch, RowLayout(batch, length, attention_mask=left)),
        "packed": (len(packed) - 1, RowLayout(1, batch * length, cu_seqlens=packed)),
    }


@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", ["dense", "right_pad", "left_pad", "packed"])
def test_last_inputs_is_the_final_state(name, with_state, width):
    batch, length, channels = 3, 11, 5
    count, layout = layouts(batch, length)[name]
    gen = generator(width)
    x = torch.randn(batch if name != "packed" else 1, batch * length if name == "packed" else length, channels, generator=gen, dtype=torch.float64)
    state = torch.randn(count, channels, width - 1, generator=gen, dtype=torch.float64) if with_state else None
    _, expected = causal_conv(layout.to_rows(x), torch.randn(channels, width, generator=gen, dtype=torch.float64), state,
                              None if layout.identity else layout.lengths)
    assert torch.equal(last_inputs(x, layout, width, state), expected)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", ["dense", "right_pad", "left_pad", "packed"])
def test_fla_route_equals_torch_route(fake_fla, name, with_state, activation):
    batch, length, channels, width = 3, 11, 6, 4
    count, layout = layouts(batch, length)[name]
    gen = generator(7)
    shape = (1, batch * length, channels) if name == "packed" else (batch, length, channels)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(channels, width, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(channels, generator=gen, dtype=torch.float64, requires_grad=True)
    state = torch.randn(count, channels, width - 1, generator=gen, dtype=torch.float64) if with_state else None
    outs = {}
    for backend in ("torch", "fla"):
        y, final = short_conv(x, weight, layout, state, bias, activation, backend=backend)
        grad = torch.randn(y.shape, generator=generator(8), dtype=torch.float64)
        outs[backend] = (y.detach(), final, torch.autograd.grad(y, (x, weight, bias), grad))
    assert fake_fla and fake_fla[-1] == {"cu_seqlens": name == "packed", "initial_state": with_state}
    assert rel_err(outs["fla"][0], outs["torch"][0]) < 1e-12
    assert torch.equal(outs["fla"][1], outs["torch"][1])
    assert all(rel_err(a, b) < 1e-12 for a, b in zip(outs["fla"][2], outs["torch"][2]))
    if layout.mask is not None:  # padded positions come back as zeros from both routes
        assert not outs["fla"][0][~layout.mask].any()


@pytest.mark.parametrize("backend", ["torch", "fla"])
@pytest.mark.parametrize("name", ["dense", "right_pad", "packed"])
def test_without_want_state_no_state_and_the_same_output(fake_fla, name, backend):
    batch, length, channels, width = 3, 9, 5, 4
    count, layout = layouts(batch, length)[name]
    gen = generator(12)
    shape = (1, batch * length, channels) if name == "packed" else (batch, length, channels)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, width, generator=gen, dtype=torch.float64)
    state = torch.randn(count, channels, width - 1, generator=gen, dtype=torch.float64)
    y, final = short_conv(x, weight, layout, state, activation="silu", backend=backend)
    y_alone, none = short_conv(x, weight, layout, state, activation="silu", backend=backend, want_state=False)
    assert final is not None and final.shape == (count, channels, width - 1)
    assert none is None and torch.equal(y_alone, y)


def test_auto_takes_fla_from_fla_min_tokens_on(fake_fla):
    weight = torch.randn(3, 4, dtype=torch.float64)
    for length in (1, conv_ops.FLA_MIN_TOKENS - 1, conv_ops.FLA_MIN_TOKENS):
        short_conv(torch.randn(2, length, 3, dtype=torch.float64), weight, RowLayout(2, length))
    assert len(fake_fla) == 1


def test_fla_backend_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="backend must be one of"):
        short_conv(torch.randn(1, 4, 3), torch.randn(3, 2), RowLayout(1, 4), backend="triton")
    layout = RowLayout(1, 4)
    with pytest.raises(ValueError, match="fla's conv needs CUDA"):
        short_conv(torch.randn(1, 4, 3), torch.randn(3, 2), layout, backend="fla")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", ["dense", "right_pad", "left_pad", "packed"])
def test_fla_kernel_matches_float64(name, with_state, dtype):
    """fla's Triton conv at a real size against the float64 PyTorch route on the CPU."""
    if _common.fla_ops() is None:
        pytest.skip("flash-linear-attention is not importable")
    batch, length, channels, width = 4, 1000, 256, 4
    count, layout = layouts(batch, length)[name]
    gen = generator(11)
    shape = (1, batch * length, channels) if name == "packed" else (batch, length, channels)
    x64 = torch.randn(*shape, generator=gen, dtype=torch.float64)
    w64 = torch.randn(channels, width, generator=gen, dtype=torch.float64) / 2
    state64 = torch.randn(count, channels, width - 1, generator=gen, dtype=torch.float64) if with_state else None
    grad64 = torch.randn(shape, generator=gen, dtype=torch.float64)
    results = {}
    for device, cast in (("cpu", torch.float64), ("cuda", dtype)):
        layout = layouts(batch, length, device)[name][1]
        x = x64.to(device, cast).requires_grad_()
        weight = w64.to(device, torch.float32 if device == "cuda" else torch.float64).requires_grad_()
        state = None if state64 is None else state64.to(device, cast)
        y, final = short_conv(x, weight, layout, state, activation="silu", backend="fla" if device == "cuda" else "torch")
        dx, dw = torch.autograd.grad(y, (x, weight), grad64.to(device, cast))
        results[device] = [t.detach().cpu().double() for t in (y, final, dx, dw)]
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    errors = [rel_err(a, b) for a, b in zip(results["cuda"], results["cpu"])]
    assert all(e < tol for e in errors), errors
