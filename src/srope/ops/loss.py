"""The language-model loss from the final hidden states: ``Σ CE(hidden · Wᵀ, targets)``.

On CUDA with flash-linear-attention installed and gradients on, fla's fused linear
cross-entropy computes it chunk by chunk over tokens, with the input and weight gradients
formed during the forward, so the ``[tokens, vocab]`` logits never exist in full (at
8 × 4096 tokens and a 32k vocabulary they are 4 GiB in float32). Elsewhere: the head's
logits, upcast to float32, and ``F.cross_entropy``. Both take the logits in the hidden
states' dtype (bf16 under autocast) and accumulate in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def _fused():
    try:
        from fla.modules.fused_linear_cross_entropy import fused_linear_cross_entropy_loss
    except Exception:  # ImportError, or fla failing to initialise on this machine
        return None
    return fused_linear_cross_entropy_loss


_FUSED = None


@torch.compiler.disable  # fla's chunked loop of Triton kernels; a compiled model calls it as it is
def _fused_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", enabled=False):  # the weight is cast to the hidden states' dtype, as autocast's linear does
        return _FUSED(hidden.flatten(0, 1), targets.flatten(), weight.to(hidden.dtype), reduction="sum", ignore_index=IGNORE_INDEX)


def summed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, fused: bool | None = None) -> torch.Tensor:
    """Summed next-token loss of ``targets [B, T]`` (aligned with ``hidden [B, T, D]``;
    ``IGNORE_INDEX`` skipped) under the head ``weight [V, D]``. ``fused=None`` chooses the
    fused kernel where it applies (CUDA, fla, gradients on); ``True`` insists."""
    global _FUSED
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets must be [B, T] = {tuple(hidden.shape[:2])}, got {tuple(targets.shape)}")
    if fused is not False and hidden.is_cuda and torch.is_grad_enabled():
        if _FUSED is None:
            _FUSED = _fused() or False
        if _FUSED:
            return _fused_sum(hidden, weight, targets)
        if fused:
            raise ValueError("fused=True needs flash-linear-attention (pip install 'srope[cuda]')")
    elif fused:
        raise ValueError("fused=True needs CUDA tensors and gradients enabled")
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
