"""The lab's one training loop: :class:`Trainer`.

Every model the lab trains goes through it: ``srope train`` (:class:`srope.lab.train.trainer.LMTrainer`),
each synthetic task's run (:class:`srope.lab.tasks.training.TaskTrainer`) and the demo
(:func:`srope.lab.demo.training.train_model`, a plain :class:`Trainer` with hooks). A
:class:`Trainer` owns

- the optimiser: AdamW (:func:`srope.lab.train.optim.adamw`) over the parameter groups it is
  given; a group's ``lr_scale`` multiplies the schedule's rate for that group;
- the schedule: ``lr_at(step)``, a function of the step alone (:mod:`srope.lab.schedule`);
- the step: :meth:`train_step` gets ``(step, lr, *batch)``. The plain step (``loss`` given) is
  the loss of the batch, backward, gradient clipping and the optimiser's step, eagerly
  (:mod:`srope.lab.step`) or, with ``cuda_graph`` on a CUDA device, captured as one CUDA graph
  (:mod:`srope.lab.graphed`). A
  subclass brings its own (``srope train``: micro-batches, DDP/FSDP2, torch.compile, the NaN
  guard);
- the loop, :meth:`fit`: for every ``(step, *batch)`` it calls :meth:`before_step`, the step
  with the schedule's rate, then :meth:`after_step`, whose truthy value ends the loop and is
  returned. Both run the hooks (:class:`Hook`) in order; subclasses put their evaluation,
  logging, checkpoints and stopping rules there;
- checkpoints: :meth:`save` and :meth:`resume` write and read the model, the optimiser and
  torch's RNG states with the caller's own state beside them (:mod:`srope.lab.train.checkpoint`),
  for an exact resume.

What a recipe does to the model while it trains (the demo's phase noise per curriculum stage,
its weight average) is a hook, not code in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from srope.lab.graphed import graphed_optimizer_step
from srope.lab.step import optimizer_step
from srope.lab.train.checkpoint import load_checkpoint, remove_unfinished, save_checkpoint, usable_checkpoint
from srope.lab.train.distributed import World
from srope.lab.train.optim import adamw

CUDA_GRAPH = ("off", "auto", "on")


class Hook:
    """Something done around every step of a :class:`Trainer`. ``after_step`` may end the loop by
    returning a truthy value; ``end`` runs once :meth:`Trainer.fit` has ended (however it ended)."""

    def before_step(self, trainer: Trainer, step: int) -> None:
        pass

    def after_step(self, trainer: Trainer, step: int, result: Any) -> Any:
        return None

    def end(self, trainer: Trainer) -> None:
        pass


class Trainer:
    """A model, the AdamW optimiser over ``params`` (tensors or parameter groups), the schedule
    ``lr_at`` and the step, run by :meth:`fit`.

    ``loss(*batch)`` (a scalar to minimise) makes the plain step, with ``grad_clip`` (None: no
    clipping); ``cuda_graph`` (``off``, ``auto``, ``on``) captures it on a CUDA ``device``
    (``on``: a failed capture raises instead of training on eagerly), one graph per value of
    ``graph_key(step)`` where it is given. Without ``loss`` a subclass
    overrides :meth:`train_step`. ``fused`` as :func:`~srope.lab.train.optim.adamw`'s.
    """

    def __init__(self, model: nn.Module, params: Iterable, *, lr: float, lr_at: Callable[[int], float] | None = None,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0, fused: bool | None = None,
                 loss: Callable[..., torch.Tensor] | None = None, grad_clip: float | None = None, cuda_graph: str = "off",
                 graph_key: Callable[[int], Hashable] | None = None, device: torch.device | str | None = None,
                 hooks: Iterable[Hook] = ()):  # fmt: skip
        if cuda_graph not in CUDA_GRAPH:
            raise ValueError(f"cuda_graph must be one of {CUDA_GRAPH}, got {cuda_graph!r}")
        self.model = model
        self.optimizer = adamw(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
        self.schedule = lr_at
        self.hooks = list(hooks)
        self.step_fn = None if loss is None else self._plain_step(loss, grad_clip, cuda_graph, graph_key, torch.device(device or "cpu"))

    def _plain_step(self, loss, grad_clip, cuda_graph: str, graph_key, device: torch.device):
        if cuda_graph != "off" and device.type == "cuda":
            return graphed_optimizer_step(self.model, self.optimizer, loss, grad_clip=grad_clip, strict=cuda_graph == "on", key=graph_key)
        return optimizer_step(self.model, self.optimizer, loss, grad_clip=grad_clip)

    @property
    def graph_steps(self) -> int:
        """The steps replayed from a CUDA graph so far (0 unless the plain step was captured)."""
        return getattr(self.step_fn, "replayed", 0)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based), before each group's ``lr_scale``."""
        if self.schedule is None:
            raise NotImplementedError(f"{type(self).__name__} needs lr_at: pass one or override the method")
        return self.schedule(step)

    def train_step(self, step: int, lr: float, *batch: Any) -> Any:
        """One optimiser step on ``batch`` at learning rate ``lr``; returns what :meth:`after_step` gets."""
        if self.step_fn is None:
            raise NotImplementedError(f"{type(self).__name__} has no step: pass loss= or override train_step")
        return self.step_fn(step, lr, *batch)

    def before_step(self, step: int) -> None:
        for hook in self.hooks:
            hook.before_step(self, step)

    def after_step(self, step: int, result: Any) -> Any:
        for hook in self.hooks:
            if stop := hook.after_step(self, step, result):
                return stop
        return None

    def fit(self, batches: Iterable[tuple]) -> Any:
        """Train on every ``(step, *batch)`` of ``batches``; return the truthy value that ended the
        loop early, else None."""
        try:
            for step, *batch in batches:
                self.before_step(step)
                result = self.train_step(step, self.lr_at(step), *batch)
                if stop := self.after_step(step, result):
                    return stop
            return None
        finally:
            for hook in self.hooks:
                hook.end(self)

    def save(self, folder: Path, step: int, state: dict, world: World | None = None) -> Path:
        """A checkpoint of step ``step`` in ``folder/checkpoints``: the model, the optimiser, torch's
        RNG states and ``state`` (the caller's: data position, counters)."""
        return save_checkpoint(folder, step, self.model, self.optimizer, state, world or World())

    def resume(self, folder: Path, world: World | None = None, *, say: Callable[[str], None] = print, **load) -> dict | None:
        """Load the latest usable checkpoint of ``folder`` into the model and the optimiser (torch's
        RNG states too) and return its state (with ``"step"``), or None where there is none.
        Checkpoints whose writing never finished are removed first (by the main process).
        ``load``: :func:`srope.lab.train.checkpoint.load_checkpoint`'s ``fields`` and ``strict_optimizer``."""
        world = world or World()
        if world.is_main:
            for stale in remove_unfinished(folder):
                say(f"removed {stale} (a checkpoint whose writing never finished)")
        latest = usable_checkpoint(folder)
        if latest is None:
            return None
        return {"path": latest, **load_checkpoint(latest, self.model, self.optimizer, world, **load)}
