"""What the models do with the Hugging Face keyword arguments beyond their own, and with
inputs that do not fit the model or the cache: a packed batch described by position_ids, the
Trainer's num_items_in_batch, hidden states, tuples, and clear errors for the rest."""

from __future__ import annotations

import pytest
import torch

from srope.models.cache import CACHE_FIELD
from tests.helpers import rel_err
from tests.models.test_models import MIXERS, tiny_model, tokens


def _flattened_position_ids(bounds):
    return torch.cat([torch.arange(e - s) for s, e in zip(bounds[:-1], bounds[1:])])[None]


@pytest.mark.parametrize("mixer", MIXERS)
def test_position_ids_that_restart_pack_the_row_as_cu_seqlens_do(mixer):
    """DataCollatorWithFlattening's batch: one row, positions restarting at 0 per document."""
    model = tiny_model(mixer, "selective_rope")
    bounds = [0, 5, 12, 13, 20]
    ids = tokens(1, 20, seed=4)
    by_cu = model(ids, labels=ids, cu_seqlens=torch.tensor(bounds, dtype=torch.int32), use_cache=False)
    by_positions = model(ids, labels=ids, position_ids=_flattened_position_ids(bounds), use_cache=False)
    assert torch.equal(by_positions.logits, by_cu.logits) and torch.equal(by_positions.loss, by_cu.loss)
    assert rel_err(by_positions.logits[:, 5:12], model(ids[:, 5:12], use_cache=False).logits) < 1e-5


def test_position_ids_the_model_counts_itself_pass_and_others_are_refused():
    model = tiny_model("gla", "rope")
    ids = tokens(2, 9, seed=1)
    plain = model(ids, use_cache=False).logits
    assert torch.equal(model(ids, position_ids=torch.arange(9).expand(2, 9), use_cache=False).logits, plain)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: positions count the real tokens (pads may hold anything)
    counted = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    assert torch.equal(model(ids, attention_mask=mask, position_ids=counted, use_cache=False).logits,
                       model(ids, attention_mask=mask, use_cache=False).logits)  # fmt: skip
    for bad in (torch.arange(9).flip(0).expand(2, 9), torch.arange(9.0).expand(2, 9), torch.arange(8).expand(2, 8)):
        with pytest.raises(ValueError, match="position_ids must"):
            model(ids, position_ids=bad)
    with pytest.raises(ValueError, match="either cu_seqlens or position_ids"):
        model(ids[:1], position_ids=_flattened_position_ids([0, 4, 9]), cu_seqlens=torch.tensor([0, 4, 9]))


def test_unknown_keywords_and_unavailable_outputs_are_refused():
    model = tiny_model("gla", "selective_rope")
    ids = tokens(1, 6, seed=2)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['attention_masks'\]"):
        model(ids, attention_masks=torch.ones_like(ids))
    with pytest.raises(TypeError, match="unexpected keyword"):
        model.model(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="output_attentions is not available"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="logits_to_keep must be an integer >= 0"):
        model(ids, logits_to_keep=-1)
    assert model(ids, cache_position=torch.arange(6)).logits.shape == (1, 6, model.config.vocab_size)  # generate's, ignored


def test_hidden_states_and_tuples():
    model = tiny_model("gated_deltanet", "rope")
    ids = tokens(2, 7, seed=3)
    out = model(ids, output_hidden_states=True, use_cache=False)
    hidden = out.hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1
    assert torch.equal(hidden[0], model.model.embeddings(ids))
    assert torch.equal(model.lm_head(hidden[-1]), out.logits)
    as_tuple = model(ids, labels=ids, use_cache=False, return_dict=False)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(ids, labels=ids, use_cache=False).loss)


def test_num_items_in_batch_makes_the_loss_a_sum_over_that_count():
    model = tiny_model("gla", "nope")
    ids = tokens(2, 8, seed=5)
    mean = model(ids, labels=ids, use_cache=False).loss
    assert torch.allclose(model(ids, labels=ids, use_cache=False, num_items_in_batch=7).loss, mean * 14 / 7)
    assert torch.allclose(model(ids, labels=ids, use_cache=False, num_items_in_batch=torch.tensor(28)).loss, mean / 2)


def test_trainer_gradient_accumulation_gives_the_full_batch_step(tmp_path):
    """transformers' Trainer: batch 2 x 1 accumulation step and batch 1 x 2 steps make the same
    update (the Trainer hands the model num_items_in_batch and leaves the scaling to it)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ids = tokens(2, 10, seed=6)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    weights = []
    for batch, accumulate in ((2, 1), (1, 2)):
        model = tiny_model("gla", "selective_rope").train()
        args = TrainingArguments(output_dir=str(tmp_path / f"b{batch}"), per_device_train_batch_size=batch, gradient_accumulation_steps=accumulate,
                                 max_steps=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
                                 report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, dataloader_drop_last=False, seed=0,
                                 data_seed=0, disable_tqdm=True)  # fmt: skip
        Trainer(model=model, args=args, train_dataset=data).train()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    start = torch.cat([p.detach().flatten() for p in tiny_model("gla", "selective_rope").parameters()])
    assert not torch.equal(weights[0], start)
    assert rel_err(weights[1] - start, weights[0] - start) < 1e-4


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_cache_of_another_model_or_batch_is_refused(mixer):
    model = tiny_model(mixer, "nope")
    ids = tokens(2, 6, seed=8)
    cache = getattr(model(ids, use_cache=True), CACHE_FIELD)
    with pytest.raises(ValueError, match="the state holds 2 sequences, this call has 1"):
        model(ids[:1, :1], cache=cache, use_cache=True)
    deeper = tiny_model(mixer, "nope", num_hidden_layers=3)
    with pytest.raises(ValueError, match="the cache holds 2 layers, this model has 3"):
        deeper(ids[:, :1], cache=cache, use_cache=True)


def test_generate_refuses_right_padded_prompts():
    model = tiny_model("gla", "selective_rope")
    ids = tokens(2, 6, seed=9)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    with pytest.raises(ValueError, match="pad prompts on the left"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
