"""The summed LM loss from hidden states (srope.ops.loss): the CPU route against a float64
computation, ignored targets, the model's ``targets=`` path and its errors. The fused CUDA
route is checked against this one on the GPU (benchmarks/check_cuda.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from srope.models import SRopeForCausalLM, preset_config
from srope.ops.loss import IGNORE_INDEX, summed_cross_entropy


def test_summed_cross_entropy_against_float64():
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 17, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    targets = torch.randint(0, 50, (3, 17))
    targets[1, 4:9] = IGNORE_INDEX
    loss = summed_cross_entropy(hidden, weight, targets)
    loss.backward()
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    ref = F.cross_entropy((h64 @ w64.T).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
    for got, want in ((hidden.grad, h64.grad), (weight.grad, w64.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_model_targets_give_the_summed_loss_of_its_logits():
    torch.manual_seed(1)
    model = SRopeForCausalLM(preset_config("gla-tiny", position="selective_rope", vocab_size=100, hidden_size=32, num_heads=2))
    ids = torch.randint(0, 100, (2, 12))
    targets = torch.roll(ids, -1, dims=1)
    targets[:, -1] = IGNORE_INDEX
    out = model(ids, targets=targets, use_cache=False)
    assert out.logits is None
    logits = model(ids, use_cache=False).logits
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    assert torch.allclose(out.loss, ref, rtol=1e-6)
    mean = model(ids, labels=ids, use_cache=False).loss  # the HF path: shifted inside, mean
    assert torch.allclose(mean * 22, ref, rtol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        model(ids, labels=ids, targets=targets)
    with pytest.raises(ValueError, match=r"targets must be \[B, T\]"):
        model(ids, targets=targets[:, :5])
    with pytest.raises(ValueError, match="fused=True needs CUDA"):
        summed_cross_entropy(torch.randn(1, 2, 4), torch.randn(5, 4), torch.zeros(1, 2, dtype=torch.long), fused=True)
