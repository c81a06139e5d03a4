"""The language-model loss from the final hidden states: ``Σ CE(hidden · Wᵀ, targets)``.

On CUDA with flash-linear-attention installed and gradients on, the head's logits (bf16
under autocast) go to fla's fused cross-entropy kernel, which computes the loss in float32
without a float32 copy of the logits and writes their gradient in place of them in the
backward, as fla's own models train (at 8 × 4096 tokens and a 32k vocabulary the float32
copy and its gradient are 8 GiB). Elsewhere: the logits upcast to float32 and
``F.cross_entropy``. Both accumulate in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def _fused():
    try:
        from fla.modules.fused_cross_entropy import cross_entropy_loss
    except Exception:  # ImportError, or fla failing to initialise on this machine
        return None
    return cross_entropy_loss


_FUSED = None


def summed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, fused: bool | None = None) -> torch.Tensor:
    """Summed next-token loss of ``targets [B, T]`` (aligned with ``hidden [B, T, D]``;
    ``IGNORE_INDEX`` skipped) under the head ``weight [V, D]``. ``fused=None`` chooses the
    fused kernel where it applies (CUDA, fla, gradients on); ``True`` insists."""
    global _FUSED
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets must be [B, T] = {tuple(hidden.shape[:2])}, got {tuple(targets.shape)}")
    logits = F.linear(hidden, weight).flatten(0, 1)
    if fused is not False and hidden.is_cuda and torch.is_grad_enabled():
        if _FUSED is None:
            _FUSED = _fused() or False
        if _FUSED:
            return _FUSED(logits, targets.flatten(), ignore_index=IGNORE_INDEX, inplace_backward=True)[0].sum()
        if fused:
            raise ValueError("fused=True needs flash-linear-attention (pip install 'srope[cuda]')")
    elif fused:
        raise ValueError("fused=True needs CUDA tensors and gradients enabled")
    return F.cross_entropy(logits.float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
