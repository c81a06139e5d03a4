"""Training one demo model: its optimiser and the step loop (:func:`srope.lab.loop.train_steps`)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from srope.lab.demo.config import GROUP, DemoConfig
from srope.lab.demo.data import train_batches
from srope.lab.demo.model import build_model
from srope.lab.loop import optimizer_step, train_steps
from srope.lab.tasks import state_tracking
from srope.lab.tasks.groups import get_group
from srope.lab.train.optim import adamw


def make_optimizer(model: torch.nn.Module, config: DemoConfig) -> torch.optim.AdamW:
    """AdamW over every weight; the position encoding's own parameters in a group of their
    own, decayed only with ``config.position_weight_decay``, at ``position_lr_scale`` times
    the learning rate (each group's ``lr_scale``; :func:`train_model` applies it)."""
    position = [p for name, p in model.named_parameters() if ".position." in name]
    others = [p for name, p in model.named_parameters() if ".position." not in name]
    groups = [{"params": others, "lr_scale": 1.0},
              {"params": position, "weight_decay": config.weight_decay if config.position_weight_decay else 0.0,
               "lr_scale": config.position_lr_scale}]
    return adamw([g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.adam_eps,
                 weight_decay=config.weight_decay, fused=False)


def train_model(kind: str, config: DemoConfig, seed: int, device: str,
                report: Callable[[str, int, float], None] | None = None) -> tuple[torch.nn.Module, np.ndarray]:
    """Train the ``kind`` model on the shared stream; return it and its loss per step.

    ``report(kind, steps_done, loss)`` is called every 10 steps and at the end.
    """
    dev = torch.device(device)
    model = build_model(config, kind, seed).to(dev)
    optimizer = make_optimizer(model, config)
    vocab = state_tracking.vocab_size(get_group(GROUP))
    bf16 = config.bf16_autocast and dev.type == "cuda"
    from srope.modules.selective_rope import SelectiveRoPE

    encodings = [m for m in model.modules() if isinstance(m, SelectiveRoPE)]
    last_stage = len(config.curriculum) - 1
    averaged = [p for name, p in model.named_parameters() if ".position." in name or not config.ema_position_only]
    ema: list[torch.Tensor] | None = None
    losses = []

    def before(step: int) -> None:
        nonlocal ema
        if config.ema_decay is not None and ema is None and config.stage_at(step) == last_stage:
            ema = [p.detach().clone() for p in averaged]  # the weights at the last stage's start
        noise = config.phase_noise_at(step)
        for encoding in encodings if noise is not None else ():
            encoding.phase_noise = noise

    def loss(inputs: np.ndarray, targets: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(inputs.astype(np.int64), device=dev)
        y = torch.as_tensor(targets.astype(np.int64), device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x).logits
        return F.cross_entropy(logits[..., :vocab].float().reshape(-1, vocab), y.reshape(-1), label_smoothing=config.label_smoothing)

    def after(step: int, value: torch.Tensor) -> None:
        if ema is not None:
            with torch.no_grad():
                for average, p in zip(ema, averaged):
                    average.lerp_(p, 1 - config.ema_decay)
        losses.append(value)
        if report is not None and ((step + 1) % 10 == 0 or step + 1 == config.steps):
            report(kind, step + 1, float(value))

    model.train()
    train_steps(train_batches(config, seed), optimizer_step(model, optimizer, loss, grad_clip=config.grad_clip), lr_at=config.lr_at,
                before=before, after=after)
    if ema is not None:
        with torch.no_grad():
            for average, p in zip(ema, averaged):
                p.copy_(average)
    return model, torch.stack(losses).float().cpu().numpy()
