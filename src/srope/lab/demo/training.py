"""Training one demo model: a :class:`srope.lab.trainer.Trainer` with the demo's optimiser
groups, its schedule (:meth:`DemoConfig.lr_at`) and three hooks: :class:`PhaseNoise` (Selective
RoPE's phase noise of the step's curriculum stage), :class:`WeightAverage` (the moving average
of the weights over the last stage) and :class:`LossRecord` (the loss of every step)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from srope.lab.demo.config import GROUP, DemoConfig
from srope.lab.demo.data import train_batches
from srope.lab.demo.model import build_model
from srope.lab.tasks import state_tracking
from srope.lab.tasks.common import to_device
from srope.lab.tasks.groups import get_group
from srope.lab.trainer import Hook, Trainer


def optimizer_groups(model: torch.nn.Module, config: DemoConfig) -> list[dict]:
    """Every weight; the position encoding's own parameters in a group of their own, decayed
    only with ``config.position_weight_decay``, at ``position_lr_scale`` times the learning
    rate (the group's ``lr_scale``)."""
    position = [p for name, p in model.named_parameters() if ".position." in name]
    others = [p for name, p in model.named_parameters() if ".position." not in name]
    groups = [{"params": others, "lr_scale": 1.0},
              {"params": position, "weight_decay": config.weight_decay if config.position_weight_decay else 0.0,
               "lr_scale": config.position_lr_scale}]
    return [g for g in groups if g["params"]]


def make_trainer(model: torch.nn.Module, config: DemoConfig, device: torch.device, hooks=()) -> Trainer:
    """The demo's :class:`Trainer` for ``model``: AdamW over :func:`optimizer_groups` (PyTorch's
    default kernel on every device), the tagging cross-entropy with label smoothing, clipping."""
    vocab = state_tracking.vocab_size(get_group(GROUP))
    bf16 = config.bf16_autocast and device.type == "cuda"

    def loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # no autocast weight cache: a captured step must cast the weights it updates every replay
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            logits = model(inputs).logits
        return F.cross_entropy(logits[..., :vocab].float().reshape(-1, vocab), targets.reshape(-1), label_smoothing=config.label_smoothing)

    # the graph of a curriculum stage holds its length and Selective RoPE's phase noise, which
    # PhaseNoise sets per stage: one graph per stage
    return Trainer(model, optimizer_groups(model, config), lr=config.lr, lr_at=config.lr_at, betas=config.betas, eps=config.adam_eps,
                   weight_decay=config.weight_decay, fused=False, loss=loss, grad_clip=config.grad_clip, cuda_graph=config.cuda_graph,
                   graph_key=config.stage_at, device=device, hooks=hooks)


def device_batches(config: DemoConfig, seed: int, device: torch.device):
    """:func:`train_batches` as int64 tensors on ``device`` (a captured step copies them into
    the graph's inputs on the device), uploaded without waiting for the device (:func:`to_device`)."""
    for step, inputs, targets in train_batches(config, seed):
        yield step, to_device(inputs.astype(np.int64), device), to_device(targets.astype(np.int64), device)


def make_optimizer(model: torch.nn.Module, config: DemoConfig) -> torch.optim.AdamW:
    """The optimiser a demo model trains with (:func:`make_trainer`'s)."""
    return make_trainer(model, config, next(model.parameters()).device).optimizer


class PhaseNoise(Hook):
    """Before every step, Selective RoPE's ``phase_noise`` of the step's curriculum stage
    (:meth:`DemoConfig.phase_noise_at`); nothing where the config has none."""

    def __init__(self, model: torch.nn.Module, config: DemoConfig):
        from srope.modules.selective_rope import SelectiveRoPE

        self.config = config
        self.encodings = [m for m in model.modules() if isinstance(m, SelectiveRoPE)]

    def before_step(self, trainer: Trainer, step: int) -> None:
        noise = self.config.phase_noise_at(step)
        for encoding in self.encodings if noise is not None else ():
            encoding.phase_noise = noise


class WeightAverage(Hook):
    """The exponential moving average (``config.ema_decay``) of the weights from the last
    curriculum stage's start (the position encoding's only, with ``ema_position_only``), copied
    into the model when training ends."""

    def __init__(self, model: torch.nn.Module, config: DemoConfig):
        self.config, self.last_stage = config, len(config.curriculum) - 1
        self.params = [p for name, p in model.named_parameters() if ".position." in name or not config.ema_position_only]
        self.average: list[torch.Tensor] | None = None

    def before_step(self, trainer: Trainer, step: int) -> None:
        if self.average is None and self.config.stage_at(step) == self.last_stage:
            self.average = [p.detach().clone() for p in self.params]  # the weights at the last stage's start

    @torch.no_grad()
    def after_step(self, trainer: Trainer, step: int, result: torch.Tensor) -> None:
        for average, p in zip(self.average or (), self.params):
            average.lerp_(p, 1 - self.config.ema_decay)

    @torch.no_grad()
    def end(self, trainer: Trainer) -> None:
        for average, p in zip(self.average or (), self.params):
            p.copy_(average)


class LossRecord(Hook):
    """The loss of every step (kept on the device until the end); ``report(kind, steps_done, loss)``
    every 10 steps and at the last."""

    def __init__(self, kind: str, steps: int, report: Callable[[str, int, float], None] | None):
        self.kind, self.steps, self.report = kind, steps, report
        self.losses: list[torch.Tensor] = []

    def after_step(self, trainer: Trainer, step: int, result: torch.Tensor) -> None:
        self.losses.append(result)
        if self.report is not None and ((step + 1) % 10 == 0 or step + 1 == self.steps):
            self.report(self.kind, step + 1, float(result))


def train_model(kind: str, config: DemoConfig, seed: int, device: str,
                report: Callable[[str, int, float], None] | None = None) -> tuple[torch.nn.Module, np.ndarray]:
    """Train the ``kind`` model on the shared stream; return it and its loss per step.

    ``report(kind, steps_done, loss)`` is called every 10 steps and at the end.
    """
    dev = torch.device(device)
    model = build_model(config, kind, seed).to(dev)
    record = LossRecord(kind, config.steps, report)
    hooks = [PhaseNoise(model, config), record]
    if config.ema_decay is not None:
        hooks.insert(0, WeightAverage(model, config))  # its update sees the step's weights before anything else
    trainer = make_trainer(model, config, dev, hooks)
    model.train()
    trainer.fit(device_batches(config, seed, dev))
    return model, torch.stack(record.losses).float().cpu().numpy()
