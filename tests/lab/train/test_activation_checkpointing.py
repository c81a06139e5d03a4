"""``srope train --set activation_checkpointing=true``: the same run, blocks recomputed in the backward."""

from __future__ import annotations

import json

import pytest
import torch

from srope.lab.config import apply_overrides
from srope.lab.train.distributed import World
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.preflight import use_cuda_graph as _use_cuda_graph
from srope.lab.train.trainer import train
from srope.lab.train.trainer import enable_checkpointing as trainer_enable
from tests.lab.train.test_trainer import SMALL, losses


def test_checkpointed_run_equals_the_plain_one(store, tmp_path, monkeypatch):
    from srope.lab.train import trainer

    enabled = []
    monkeypatch.setattr(trainer, "enable_checkpointing", lambda model: enabled.append(model) or trainer_enable(model))
    config = TrainConfig(data=store, max_steps=3, lr=3e-3, **SMALL)
    train(config, tmp_path / "plain")
    assert not enabled
    checkpointed = apply_overrides(config, ["activation_checkpointing=true"])
    assert checkpointed.activation_checkpointing is True
    train(checkpointed, tmp_path / "ckpt")
    assert len(enabled) == 1 and all(layer.gradient_checkpointing for layer in enabled[0].model.layers)
    plain, ckpt = losses(tmp_path / "plain"), losses(tmp_path / "ckpt")
    assert [s for s, _ in plain] == [s for s, _ in ckpt]
    assert all(abs(a - b) <= 1e-6 * abs(b) for (_, a), (_, b) in zip(ckpt, plain)), (ckpt, plain)
    assert json.loads((tmp_path / "ckpt" / "train_config.json").read_text())["activation_checkpointing"] is True


def test_checkpointing_is_checked_and_keeps_the_step_out_of_a_cuda_graph():
    with pytest.raises(ValueError, match="activation_checkpointing must be true or false"):
        TrainConfig(activation_checkpointing="yes").resolved()
    with pytest.raises(ValueError, match="expected a boolean"):
        apply_overrides(TrainConfig(), ["activation_checkpointing=maybe"])
    gpu = World(device=torch.device("cuda", 0))
    assert not _use_cuda_graph(TrainConfig(activation_checkpointing=True), gpu)
    with pytest.raises(ValueError, match="activation_checkpointing"):
        _use_cuda_graph(TrainConfig(activation_checkpointing=True, cuda_graph="on"), gpu)
