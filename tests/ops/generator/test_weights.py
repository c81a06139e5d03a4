"""The generator's fused first-layer weights (srope.ops.generator.weights) against float64
torch, forward and backward, interpreted on the CPU or compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from srope import backend
from srope.ops.generator.weights import head_weights
from tests.helpers import generator, randn, rel_err

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)

# (heads, inputs, pairs, gates): odd sizes, one step and several over the inputs, the
# GLA-370M head (256 inputs, 64 pairs, the standard gate's 4 logits), a low-rank gate's 16.
SHAPES = [(1, 1, 1, 0), (3, 37, 5, 3), (4, 256, 64, 4), (2, 40, 16, 16), (2, 9, 7, 0)]


def reference(w, gain, gate):
    """What SelectiveRoPE._first_layers builds with torch."""
    heads = w.shape[0]
    out = gain[:, None, None] * w / w.norm(dim=1, keepdim=True)
    if gate is None:
        return out
    return torch.cat([out, gate.unflatten(1, (heads, -1)).permute(1, 2, 0)], dim=-1)


def inputs(heads, inputs_, pairs, gates, seed, device):
    gen = generator(seed)
    w = randn(heads, inputs_, pairs, seed_gen=gen, dtype=torch.float32).to(device)
    gain = (randn(heads, seed_gen=gen, dtype=torch.float32) + 2).to(device)
    gate = randn(gates, heads * inputs_, seed_gen=gen, dtype=torch.float32).to(device) if gates else None
    return w, gain, gate


@pytest.mark.parametrize("heads,inputs_,pairs,gates", SHAPES)
def test_matches_float64(heads, inputs_, pairs, gates, device):
    """Output and the gradients of w, gain and the gate's weight, for a fresh random output
    gradient, within float32 rounding of float64 torch (outputs are poisoned beforehand:
    every element is written)."""
    tensors = inputs(heads, inputs_, pairs, gates, heads * inputs_ + gates, device)
    ours = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    exact = [None if t is None else t.detach().double().requires_grad_() for t in tensors]
    out, out64 = head_weights(*ours), reference(*exact)
    assert out.dtype == torch.float32 and out.shape == out64.shape == (heads, inputs_, pairs + gates)
    assert rel_err(out, out64) < 1e-6
    grad = randn(*out64.shape, seed_gen=generator(5))
    out.backward(grad.to(device, torch.float32))
    out64.backward(grad.to(device, torch.float64))
    for t, t64 in zip(ours, exact):
        if t is not None:
            assert t.grad is not None and t.grad.shape == t64.shape and rel_err(t.grad, t64.grad) < 1e-5


def test_gate_share_is_copied_exactly(device):
    w, gain, gate = inputs(3, 37, 5, 3, 1, device)
    assert torch.equal(head_weights(w, gain, gate)[..., 5:], gate.unflatten(1, (3, -1)).permute(1, 2, 0))


def test_strided_inputs(device):
    """Views that are not contiguous give what their contiguous copies give."""
    w, gain, gate = inputs(2, 20, 6, 3, 2, device)
    w_view = torch.cat([w, w], dim=-1)[..., ::2]
    gate_view = torch.cat([gate, gate], dim=0)[::2]
    assert torch.equal(head_weights(w_view, gain, gate_view), head_weights(w_view.contiguous(), gain, gate_view.contiguous()))


def test_opcheck(device):
    from srope.ops.generator import weights as module

    for gates in (0, 3):
        w, gain, gate = inputs(2, 11, 5, gates, 3, device)
        torch.library.opcheck(module._weights_op.op, (w.requires_grad_(), gain.requires_grad_(), gate))
        torch.library.opcheck(module._weights_bwd_op.op, (torch.randn(2, 11, 5 + gates, device=device), w.detach(), gain.detach(), gates))


BAD = [
    ("dtype", lambda d: head_weights(torch.ones(2, 3, 4, dtype=torch.float64, device=d), torch.ones(2, device=d)), TypeError, "float32"),
    ("rank", lambda d: head_weights(torch.ones(6, 4, device=d), torch.ones(2, device=d)), ValueError, r"\[H, I, R\]"),
    ("gain", lambda d: head_weights(torch.ones(2, 3, 4, device=d), torch.ones(3, device=d)), ValueError, "gain must be"),
    ("gate", lambda d: head_weights(torch.ones(2, 3, 4, device=d), torch.ones(2, device=d), torch.ones(4, 5, device=d)),
     ValueError, "gate must be"),
]


@pytest.mark.parametrize("name,call,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(name, call, error, match, device):
    with pytest.raises(error, match=match):
        call(device)


@pytest.mark.parametrize("gate", ["standard", "low-rank", None])
def test_module_fused_weights_equal_the_torch_route(monkeypatch, gate, device):
    """SelectiveRoPE's first layers through the kernel (srope backend "triton") and through torch:
    the same weight and, for a random output gradient, the same parameter gradients; with
    gradients off (cached) too."""
    from srope.modules import selective_rope as module

    torch.manual_seed(3)
    layer = module.SelectiveRoPE(48, 3, 10, gate=gate).to(device)
    with torch.no_grad():
        layer.proj_gain.mul_(torch.rand(3, device=device) + 0.5)
    grad = None
    results = {}
    for mode in ("torch", "triton"):
        monkeypatch.setattr(backend, "_active", mode)
        weight, sizes = layer._first_layers(torch.float32)
        grad = torch.randn(weight.shape, generator=torch.Generator().manual_seed(4)).to(device) if grad is None else grad
        weight.backward(grad)
        results[mode] = (weight.detach(), sizes, {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None})
        layer.zero_grad(set_to_none=True)
        with torch.no_grad():
            assert torch.equal(layer._first_layers(torch.float32)[0], weight)
    (w_torch, sizes_torch, g_torch), (w_fused, sizes_fused, g_fused) = results["torch"], results["triton"]
    assert sizes_torch == sizes_fused and rel_err(w_fused, w_torch) < 1e-6
    assert g_torch.keys() == g_fused.keys() and {"proj_weight", "proj_gain"} <= g_fused.keys()
    assert all(rel_err(g_fused[name], g_torch[name]) < 1e-5 for name in g_torch)


@pytest.mark.gpu
def test_module_takes_the_kernel_on_cuda():
    from srope.modules import selective_rope as module

    layer = module.SelectiveRoPE(64, 2, 16).cuda()
    assert layer._fuses_weights(torch.float32) and not layer._fuses_weights(torch.float64)
    assert not module.SelectiveRoPE(64, 2, 16, weight_norm=False).cuda()._fuses_weights(torch.float32)
