"""Depthwise causal short convolution with a carried state (plain PyTorch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {None: None, "silu": F.silu, "swish": F.silu}


def causal_conv(
    rows: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution over time.

    ``y_t = Σ_w weight[:, w] · x_{t - (W-1) + w}`` with the ``W-1`` inputs before the first
    token taken from ``state [N, C, W-1]`` (zeros when None).

    Args:
        rows: ``[N, L, C]`` inputs, each row's real tokens first (see ``RowLayout``).
        weight: ``[C, W]``.
        lengths: ``[N]`` real tokens per row (None: all L); the final state holds the
            last ``W-1`` real inputs of each row (reaching into ``state`` when shorter).

    Returns ``(y [N, L, C], final_state [N, C, W-1])``.
    """
    count, length, channels = rows.shape
    width = weight.shape[-1]
    if state is None:
        state = rows.new_zeros(count, channels, width - 1)
    history = torch.cat([state.to(rows.dtype), rows.transpose(1, 2)], dim=2)  # [N, C, W-1+L]
    out = F.conv1d(history, weight[:, None, :].to(device=rows.device, dtype=rows.dtype), None if bias is None else bias.to(rows.dtype), groups=channels).transpose(1, 2)
    if lengths is None:
        final = history[:, :, history.shape[2] - (width - 1) :]
    else:
        take = lengths.view(count, 1, 1).to(torch.long) + torch.arange(width - 1, device=rows.device)
        final = history.gather(2, take.expand(count, channels, width - 1))
    return out, final
