"""The token embedding's deterministic backward: the same values as nn.Embedding's, the
settings it switches restored, and on CUDA the same weight gradient in every repeat."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from srope.models import SRopeConfig, SRopeForCausalLM
from srope.models.embedding import Embedding, deterministic_algorithms, deterministic_embedding


@pytest.mark.parametrize("padding_idx", [None, 0, 5])
def test_matches_embedding_in_float64(padding_idx):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 7, (3, 11), generator=gen)  # repeated tokens: rows share gradients
    grad = torch.randn(3, 11, 5, dtype=torch.float64, generator=gen)
    ours = deterministic_embedding(ids, weight, padding_idx)
    (ours_grad,) = torch.autograd.grad(ours, weight, grad)
    reference = F.embedding(ids, weight, padding_idx)
    (reference_grad,) = torch.autograd.grad(reference, weight, grad)
    assert torch.equal(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad, rtol=1e-12, atol=1e-12)
    if padding_idx is not None:
        assert ours_grad[padding_idx].abs().sum() == 0  # the padding row learns nothing, as in nn.Embedding


@pytest.mark.parametrize("enabled,warn_only", [(False, False), (True, False), (True, True)])
def test_settings_restored(enabled, warn_only):
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    try:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        with deterministic_algorithms():
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.utils.deterministic.fill_uninitialized_memory
        assert torch.are_deterministic_algorithms_enabled() == enabled
        assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
        with pytest.raises(KeyError), deterministic_algorithms():
            raise KeyError("an error inside")
        assert torch.are_deterministic_algorithms_enabled() == enabled
        assert torch.utils.deterministic.fill_uninitialized_memory == before[2]
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


def test_model_uses_it():
    model = SRopeForCausalLM(SRopeConfig(vocab_size=16, hidden_size=16, num_heads=2, num_hidden_layers=1, position="nope"))
    assert isinstance(model.get_input_embeddings(), Embedding)
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # transformers' init and tying still see an embedding


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the CPU's embedding backward is deterministic already")
def test_cuda_weight_gradient_repeats_bitwise():
    gen = torch.Generator(device="cuda").manual_seed(0)
    embedding = Embedding(4, 384).cuda()  # few tokens at many positions: the case where atomic sums collide most
    ids = torch.randint(0, 4, (1024, 129), device="cuda", generator=gen)
    grad = torch.randn(1024, 129, 384, device="cuda", generator=gen)
    grads = []
    for _ in range(5):
        embedding.weight.grad = None
        embedding(ids).backward(grad)
        grads.append(embedding.weight.grad.clone())
    assert all(torch.equal(g, grads[0]) for g in grads[1:])
    weight64 = embedding.weight.detach().double().requires_grad_()
    (reference,) = torch.autograd.grad(F.embedding(ids, weight64), weight64, grad.double())
    # each row sums ~33,000 float32 terms (sums ~150): float32 summation in any order is off
    # by ~3e-3 (the CPU's sequential sum: 2.95e-3); a lost or misplaced term is off by ~1
    torch.testing.assert_close(grads[0].double(), reference, rtol=0, atol=2e-2)
