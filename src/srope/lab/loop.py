"""The lab's training loop: one optimiser step after another, shared by ``srope train``, the
synthetic tasks' runner and the demo.

:func:`train_steps` runs the steps: for each ``(step, *batch)`` it calls ``before(step)``,
then ``step_fn(step, lr_at(step), *batch)``, then ``after(step, result)``, whose truthy
return value ends the loop. What differs between its users comes in as these functions:
the batches, the schedule, the step itself and what happens around it (noise levels,
averages, logging, evaluation, checkpoints, stopping rules).

:func:`optimizer_step` is the plain step of the tasks and the demo: every parameter
group's learning rate (the schedule's value times the group's ``lr_scale``, 1 if it has
none), the loss of the batch, backward, gradient clipping, the optimiser's step.
``srope train`` brings its own (:mod:`srope.lab.train.trainer`): micro-batches, DDP and
FSDP2, a NaN guard before the update, and the whole step captured as one CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

StepFn = Callable[..., Any]


def train_steps(
    batches: Iterable[tuple],
    step_fn: StepFn,
    *,
    lr_at: Callable[[int], float],
    before: Callable[[int], None] | None = None,
    after: Callable[[int, Any], Any] | None = None,
) -> Any:
    """Run ``step_fn(step, lr, *batch)`` for each ``(step, *batch)`` of ``batches``.

    ``before(step)`` runs first in every step; ``after(step, result)`` last, with what the
    step returned, and a truthy return value of it ends the loop and is returned (else None)."""
    for step, *batch in batches:
        if before is not None:
            before(step)
        result = step_fn(step, lr_at(step), *batch)
        if after is not None and (stop := after(step, result)):
            return stop
    return None


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group's learning rate: ``lr`` times the group's ``lr_scale`` (1 if none),
    filled into the group's tensor where a captured step holds it in one."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_scale", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: Callable[..., torch.Tensor], *, grad_clip: float | None = None) -> StepFn:
    """The plain step for :func:`train_steps`: ``loss(*batch)`` is the scalar to minimise;
    the step returns it detached."""

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
