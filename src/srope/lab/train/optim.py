"""The lab's one AdamW constructor and the paper's parameter groups (schedules:
:mod:`srope.lab.schedule`)."""

from __future__ import annotations


import torch
from torch import nn


def no_decay(name: str, param: nn.Parameter) -> bool:
    """Parameters excluded from weight decay.

    - every tensor with fewer than 2 dimensions: norm weights, biases, GDN's ``A_log`` and
      ``dt_bias``, the weight-norm gains of the Selective RoPE projection (``proj_gain``);
    - the Selective RoPE phase bias (``position.bias``) and a learnable temperature
      (``learned_temperature``), whatever their shape;
    - anything tagged ``_no_weight_decay``.
    Matrices (projections, embeddings, the LM head, the per-head projection weights and
    conv taps) are decayed.
    """
    return (
        param.dim() < 2
        or getattr(param, "_no_weight_decay", False)
        or name.endswith("position.bias")
        or name.endswith("learned_temperature")
        or name.endswith("proj_gain")
    )


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed matrices and the ``no_decay`` parameters (with their names)."""
    decay, keep = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (keep if no_decay(name, param) else decay).append((name, param))
    return [
        {"params": [p for _, p in decay], "names": [n for n, _ in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in keep], "names": [n for n, _ in keep], "weight_decay": 0.0},
    ]


def adamw(params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over ``params`` (tensors or groups). ``fused=None`` picks the fused kernel when
    every parameter is on a CUDA device (one kernel per step, the same arithmetic whether or
    not the step is captured; foreach's capturable path rounds its bias corrections
    otherwise), else PyTorch's default; ``False`` keeps PyTorch's default."""
    # a group's parameters may come as a generator, which the check below would use up
    params = [{**item, "params": _tensors(item["params"])} if isinstance(item, dict) else item for item in params]
    if fused is None:
        tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
        fused = bool(tensors) and all(p.is_cuda for p in tensors)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused or None)


def _tensors(params) -> list:
    return [params] if isinstance(params, torch.Tensor) else list(params)


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95), eps: float = 1e-8) -> torch.optim.AdamW:
    """:func:`adamw` over the model's :func:`parameter_groups` (``srope train``'s)."""
    return adamw(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)
