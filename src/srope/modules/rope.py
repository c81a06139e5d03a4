"""Standard rotary position embedding with per-row positions."""

from __future__ import annotations

from typing import NamedTuple

import torch

from srope.modules.base import PositionEncoding
from srope.ops.checks import is_finite_number
from srope.ops.rotary import rope
from srope.ops.rotary.naive import rope_inverse_frequencies


class RoPEState(NamedTuple):
    """Tokens seen so far by every sequence, ``[N]`` int64."""

    position: torch.Tensor


class RoPE(PositionEncoding):
    """RoPE: pairs ``(j, j + R)`` rotate by ``position · θ^{-2j/rotary_dim}``.

    Positions count real tokens from 0 in every row (left padding does not shift them)
    and in every packed sequence; ``state`` carries the count for decoding.

    Args:
        head_dim: q/k head size D.
        rotary_dim: channels rotated, even and ``<= head_dim`` (default: all of D).
        theta: base of the frequencies.
    """

    def __init__(self, head_dim: int, rotary_dim: int | None = None, theta: float = 10000.0):
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if head_dim < 2 or rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be even with 2 <= rotary_dim <= head_dim={head_dim}, got {rotary_dim}")
        if not is_finite_number(theta):
            raise ValueError(f"theta must be a positive finite number, got {theta!r}")
        self.head_dim, self.rotary_dim, self.theta = head_dim, rotary_dim, float(theta)
        self._inv_freq: dict = {}

    @property
    def pairs(self) -> int:
        return self.rotary_dim // 2

    def inv_freq(self, device=None) -> torch.Tensor:
        """The ``[rotary_dim / 2]`` float64 frequencies (computed from the config, never cast;
        cached per device in a plain dict that ``.to()`` cannot reach)."""
        key = torch.device(device) if device is not None else torch.device("cpu")
        if key not in self._inv_freq:
            self._inv_freq[key] = rope_inverse_frequencies(self.rotary_dim, self.theta).to(key)
        return self._inv_freq[key]

    def forward(self, q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None, x_cast=None):
        count = self.check_call(q, k, x, attention_mask, cu_seqlens, x_cast)
        start = torch.zeros(count, dtype=torch.long, device=q.device)
        if state is not None:
            self.check_state(state, RoPEState, {"position": (count,)})
            if state.position.is_floating_point() or state.position.is_complex():
                raise TypeError(f"state.position must hold integer token counts, got {state.position.dtype}")
            start = state.position.to(device=q.device, dtype=torch.long)
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim {self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        positions, seen = self.positions(start, *q.shape[:2], attention_mask, cu_seqlens)
        q, k = rope(q, k, positions, self.inv_freq(q.device))
        return q, k, RoPEState(start + seen) if use_cache else None

    @staticmethod
    def positions(start: torch.Tensor, batch: int, length: int, attention_mask, cu_seqlens) -> tuple[torch.Tensor, torch.Tensor]:
        """Every token's position ``[B, T]`` (real tokens counted from ``start [N]``, per row or
        packed sequence) and the real tokens of every sequence in this call ``[N]``."""
        steps = torch.arange(length, device=start.device)
        if cu_seqlens is not None:
            seq = torch.searchsorted(cu_seqlens[1:].long(), steps, right=True)
            return (start[seq] + steps - cu_seqlens.long()[seq])[None], cu_seqlens[1:].long() - cu_seqlens[:-1].long()
        if attention_mask is not None:
            real = (attention_mask != 0).long()
            return start[:, None] + real.cumsum(dim=1) - 1, real.sum(dim=1)
        return start[:, None] + steps[None].expand(batch, length), torch.full((batch,), length, dtype=torch.long, device=start.device)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, theta={self.theta}"
