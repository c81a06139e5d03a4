"""Short causal convolution as a module, aware of padding, packing and decoding."""

from __future__ import annotations

import math

import torch
from torch import nn

from srope.ops.conv import ACTIVATIONS, short_conv
from srope.ops.layout import RowLayout


class ShortConvolution(nn.Module):
    """Depthwise causal convolution of width ``kernel_size`` over ``[B, T, C]``.

    ``forward`` takes the batch's :class:`RowLayout` so that padded tokens are invisible
    and packed sequences restart, and carries ``state [N, C, W-1]`` (the last ``W-1``
    inputs of every sequence) for chunked prefill and decoding. The weight layout is
    ``nn.Conv1d``'s depthwise ``[C, 1, W]``, the current token last. It runs
    :func:`srope.ops.conv.short_conv`, which takes fla's Triton kernel on CUDA where
    :mod:`srope.backend` allows it.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: str | None = None, bias: bool = False):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Conv1d's default initialisation (fan-in = kernel_size for a depthwise conv).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)

    def kernel(self, device: torch.device | None = None) -> torch.Tensor:
        """The ``[C, W]`` taps, the current token last (on the weight's device; ``device`` is
        for taps that have no weight)."""
        return self.weight[:, 0]

    @property
    def state_width(self) -> int:
        return self.kernel_size - 1

    def forward(
        self, x: torch.Tensor, layout: RowLayout, state: torch.Tensor | None = None, activate: bool = True,
        want_state: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(y, final state)``, the state None without ``want_state``; ``activate=False``
        leaves the activation to the caller."""
        activation = self.activation if activate else None
        return short_conv(x, self.kernel(x.device), layout, state, self.bias, activation, want_state=want_state)

    def extra_repr(self) -> str:
        return f"{self.channels}, kernel_size={self.kernel_size}, activation={self.activation}"


class FirstDifference(ShortConvolution):
    """The fixed convolution ``x_t - x_{t-1}``: the ``q_t - q_{t-1}`` of the RFF derivation.

    It has no parameters; its weight is made at call time, so no dtype cast or meta-device
    initialisation can touch it.
    """

    def __init__(self, channels: int, activation: str | None = None):
        super().__init__(channels, kernel_size=2, activation=activation)
        del self.weight

    def kernel(self, device: torch.device | None = None) -> torch.Tensor:
        # made on the device, not copied from the host: a CUDA graph cannot capture that copy
        return (torch.arange(2, device=device, dtype=torch.float32) * 2 - 1).expand(self.channels, 2)

    def reset_parameters(self) -> None:
        pass
