"""Gradient checkpointing: every host × position encoding gives the loss and gradients it gives
without, dense and padded, and really recomputes its blocks in the backward."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rel_err
from tests.models.test_models import IDS, PAIRS, tiny_model, tokens


def _loss_and_grads(model, ids, mask, labels):
    model.zero_grad(set_to_none=True)
    loss = model(ids, attention_mask=mask, labels=labels, use_cache=False).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _enable(model, **kwargs):
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x; older: the alias
    if enable is not None:
        enable(**kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs.get("activation_checkpointing_kwargs"))


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_checkpointing_gives_the_same_loss_and_gradients(mixer, position):
    model = tiny_model(mixer, position, dtype=torch.float64).train()
    ids = tokens(2, 9, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in row 1
    labels = ids.masked_fill(mask == 0, -100)
    batches = [(ids, None, ids), (ids, mask, labels)]
    plain = [_loss_and_grads(model, *batch) for batch in batches]

    calls = []
    model.model.layers[0].mixer.register_forward_hook(lambda *_: calls.append(1))
    _enable(model)
    for (loss, grads), batch in zip(plain, batches):
        calls.clear()
        ckpt_loss, ckpt_grads = _loss_and_grads(model, *batch)
        assert len(calls) == 2, "the block was not recomputed in the backward"
        assert rel_err(ckpt_loss, loss) < 1e-12
        assert ckpt_grads.keys() == grads.keys()
        for name in grads:
            assert rel_err(ckpt_grads[name], grads[name]) < 1e-10, name


def test_reentrant_checkpointing_and_refused_cache():
    model = tiny_model("gla", "selective_rope", dtype=torch.float64).train()
    ids = tokens(2, 7, seed=5)
    loss, grads = _loss_and_grads(model, ids, None, ids)
    _enable(model, activation_checkpointing_kwargs={"use_reentrant": True})
    ckpt_loss, ckpt_grads = _loss_and_grads(model, ids, None, ids)
    assert rel_err(ckpt_loss, loss) < 1e-12
    assert all(rel_err(ckpt_grads[name], grads[name]) < 1e-10 for name in grads)
    with pytest.raises(ValueError, match="gradient checkpointing"):
        model(ids, use_cache=True)
    with torch.no_grad():  # no backward: nothing is checkpointed, the cache works
        assert model(ids, use_cache=True).past_key_values is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (fla's mixers and srope's Triton kernels)")
@pytest.mark.parametrize("mixer", ["gla", "gated_deltanet", "forgetting_attn", "attention"])
def test_checkpointing_on_cuda(mixer):
    model = tiny_model(mixer, "selective_rope").cuda().train()
    ids = tokens(2, 70, seed=6).cuda()
    loss, grads = _loss_and_grads(model, ids, None, ids)
    _enable(model)
    ckpt_loss, ckpt_grads = _loss_and_grads(model, ids, None, ids)
    assert rel_err(ckpt_loss, loss) < 1e-6
    assert all(rel_err(ckpt_grads[name], grads[name]) < 1e-4 for name in grads)
