"""The plain optimiser step of the lab's :class:`~srope.lab.trainer.Trainer`, eager (its CUDA
graph is :func:`srope.lab.graphed.graphed_optimizer_step`): every parameter group's learning
rate, the loss of the batch, backward, gradient clipping, the optimiser's step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group's learning rate: ``lr`` times the group's ``lr_scale`` (1 if none),
    filled into the group's tensor where a captured step holds it in one."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_scale", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: Callable[..., torch.Tensor], *,
                   grad_clip: float | None = None) -> Callable[..., torch.Tensor]:  # fmt: skip
    """The plain step ``step(step, lr, *batch)``: every group's learning rate, ``loss(*batch)``,
    backward, clipping, the optimiser's step; returns the loss detached."""

    def step(_: int, lr: float, *batch: Any) -> torch.Tensor:
        set_learning_rate(optimizer, lr)
        value = loss(*batch)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return value.detach()

    return step
