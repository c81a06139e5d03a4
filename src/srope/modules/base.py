"""The one interface every position encoding implements, and every host layer calls."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from srope.ops.checks import check_cu_seqlens


class HostInput(NamedTuple):
    """What :meth:`PositionEncoding.prepare` returns for a block input x."""

    linear: torch.Tensor  # what the host's linear maps read: x, or x cast once for autocast
    source: torch.Tensor  # x itself
    work: Any = None  # the encoding's own work on x, for its forward (Selective RoPE's projection)


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x cast to autocast's dtype if autocast is on and x is float32, else x."""
    device = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


class PositionEncoding(nn.Module):
    """Base class of NoPE, RoPE and SelectiveRoPE.

    ``forward(q, k, x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, prepared=None)
    -> (q, k, state)``

    - ``q [B, T, H, D]``, ``k [B, T, Hk, D]`` (``H % Hk == 0``): the host's queries and keys.
    - ``x [B, T, hidden]``: the block input the angles come from (ignored by NoPE/RoPE).
    - ``attention_mask [B, T]`` (1 = real token, left or right padding): padded positions
      advance no phase and no position, and are invisible to the angle generator's conv.
    - ``cu_seqlens [N+1]`` (``B == 1``): packed sequences; everything restarts per sequence.
    - ``state``: what a previous call returned with ``use_cache=True`` (per row, or per
      packed sequence); the call continues those sequences.
    - ``prepared``: what :meth:`prepare` returned for this x, or None.
    - Returns the rotated q and k (same dtypes) and, with ``use_cache``, the new state.

    A host calls ``prepare(x)`` first and runs its own linear maps on ``.linear``.
    """

    def prepare(self, x: torch.Tensor) -> HostInput:
        """The block input for the host's linear maps, and the encoding's own work on x (none
        here). Under autocast, x (float32) is cast once and the cast is shared by every map:
        autocast alone casts an x that is not a leaf once per map, forward and backward."""
        return HostInput(autocast_input(x), x)

    def check_inputs(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        x: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        prepared: HostInput | None = None,
    ) -> int:
        """Validate the shared arguments; return N, the number of sequences."""
        if prepared is not None and (not isinstance(prepared, HostInput) or prepared.source is not x):
            raise ValueError("prepared must be what this encoding's prepare(x) returned for this x")
        for name, value in (("q", q), ("k", k)):
            if not isinstance(value, torch.Tensor) or value.dim() != 4:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{name} must be a [B, T, heads, head_dim] tensor, got {shape}")
        batch, length = q.shape[:2]
        if x is not None and (not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[:2]) != (batch, length)):
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be the block input [B, T, hidden] = [{batch}, {length}, hidden], got {shape}")
        if attention_mask is not None:
            if cu_seqlens is not None:
                raise ValueError("pass either attention_mask or cu_seqlens, not both")
            if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (batch, length):
                shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
                raise ValueError(f"attention_mask must be [B, T] = [{batch}, {length}] (1 = real token), got {shape}")
        if cu_seqlens is not None:
            return check_cu_seqlens(cu_seqlens, batch, length)
        return batch

    @staticmethod
    def check_state(state: Any, expected: type, fields: dict[str, tuple[int, ...]]) -> None:
        """Check a carried state's type and field shapes."""
        if not isinstance(state, expected):
            raise TypeError(f"state must be a {expected.__name__} returned with use_cache=True, got {type(state).__name__}")
        for name, shape in fields.items():
            value = getattr(state, name)
            if tuple(value.shape) != shape:
                raise ValueError(f"state.{name} must have shape {shape} for this batch, got {tuple(value.shape)}")


class NoPE(PositionEncoding):
    """No position encoding: q and k pass through; the state is always None."""

    def forward(self, q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, prepared=None, layout=None):
        self.check_inputs(q, k, x, attention_mask, cu_seqlens, prepared)
        return q, k, None
