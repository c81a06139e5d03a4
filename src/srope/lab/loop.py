"""The lab's training loop: one optimiser step after another, shared by the synthetic tasks'
runner and the demo.

Each step sets every parameter group's learning rate (the schedule's value times the
group's ``lr_scale``, 1 if it has none), computes the loss of the batch, back-propagates,
clips the gradient norm and steps the optimiser. What differs between its users comes in
as functions: the batches, the loss, the schedule, and what happens before and after a
step (noise levels, averages, logging, checkpoints, stopping rules).

``srope train`` runs its own step (:mod:`srope.lab.train.trainer`): micro-batches, DDP and
FSDP2, and the whole step (optimiser included) captured as one CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[int, Any, Any]],
    *,
    loss: Callable[[Any, Any], torch.Tensor],
    lr_at: Callable[[int], float],
    grad_clip: float | None = None,
    before: Callable[[int], None] | None = None,
    after: Callable[[int, torch.Tensor], Any] | None = None,
) -> Any:
    """Train on ``batches`` of ``(step, x, y)``; ``loss(x, y)`` is the scalar to minimise.

    ``before(step)`` runs first in every step; ``after(step, loss)`` (the loss detached) runs
    last, and a truthy return value ends the loop and is returned (else None)."""
    for step, x, y in batches:
        if before is not None:
            before(step)
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        value = loss(x, y)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if after is not None and (stop := after(step, value.detach())):
            return stop
    return None
