"""The one interface every position encoding implements, and every host layer calls.

A host layer asks its encoding for the angles of its block input first, runs its own linear
maps on ``angles.x`` and hands its queries and keys back to be rotated::

    angles = layer.position.angles(x, attention_mask=mask, state=state)
    q, k = q_proj(angles.x), k_proj(angles.x)            # the host's own maps
    q, k, state = layer.position.rotate(q, k, angles)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from srope.ops.checks import check_cu_seqlens


class Angles(NamedTuple):
    """What :meth:`PositionEncoding.angles` returns for one call: everything
    :meth:`PositionEncoding.rotate` needs, and the input of the host's own linear maps."""

    x: torch.Tensor  # what the host's linear maps read: the block input, cast once under autocast
    rows: tuple[int, int]  # (B, T) of the call: q and k must match
    sequences: int  # N, the number of sequences (B, or the packed sequences of cu_seqlens)
    cu_seqlens: torch.Tensor | None
    state: Any  # the carried state this call continues (None: the sequences start here)
    use_cache: bool  # whether rotate returns the new state
    value: Any = None  # the encoding's own angles (RoPE's positions, Selective RoPE's increments)


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x cast to autocast's dtype if autocast is on and x is float32, else x."""
    device = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


class PositionEncoding(nn.Module):
    """Base class of NoPE, RoPE and SelectiveRoPE.

    ``angles(x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None) -> Angles``

    - ``x [B, T, hidden]``: the block input the angles come from (NoPE and RoPE read only its
      shape and device).
    - ``attention_mask [B, T]`` (1 = real token, left or right padding): padded positions
      advance no phase and no position, and are invisible to the angle generator's conv.
    - ``cu_seqlens [N+1]`` (``B == 1``): packed sequences; everything restarts per sequence.
    - ``state``: what a previous call's :meth:`rotate` returned with ``use_cache=True`` (per
      row, or per packed sequence); the call continues those sequences.
    - ``layout``: the batch's :class:`~srope.ops.layout.RowLayout` when the caller built it
      once for several layers.
    - The host's linear maps read ``angles.x``: under autocast x (float32) is cast once there
      and the cast is shared by every map (autocast alone casts an x that is not a leaf once
      per map, forward and backward).

    ``rotate(q, k, angles) -> (q, k, state)`` with ``q [B, T, H, D]``, ``k [B, T, Hk, D]``
    (``H % Hk == 0``): the rotated q and k (same dtypes) and, with ``use_cache``, the new state.

    ``forward(q, k, x=None, **same options)`` is ``rotate(q, k, angles(x, ...))``.
    """

    needs_input = False  # whether the angles depend on x's values (else only on its shape)

    def angles(self, x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None) -> Angles:
        count = self.check_call(x, attention_mask, cu_seqlens)
        if state is not None:
            raise TypeError(f"{type(self).__name__} carries no state (its rotate returns None), got {type(state).__name__}")
        return Angles(autocast_input(x), tuple(x.shape[:2]), count, cu_seqlens, state, use_cache)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, angles: Angles):
        self.check_rotation(q, k, angles)
        return q, k, None

    def forward(self, q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None):
        if x is None:
            if self.needs_input:
                raise ValueError(f"{type(self).__name__} needs the block input x [B, T, hidden] to compute its angles")
            if not isinstance(q, torch.Tensor) or q.dim() != 4:
                self.check_rotation(q, k, None)
            x = q.new_empty(*q.shape[:2], 0)  # only its shape and device are read
        elif isinstance(q, torch.Tensor) and q.dim() == 4 and (not isinstance(x, torch.Tensor) or x.shape[:2] != q.shape[:2]):
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be the block input [B, T, hidden] = [{q.shape[0]}, {q.shape[1]}, hidden], got {shape}")
        angles = self.angles(x, attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout)
        return self.rotate(q, k, angles)

    def check_call(self, x: torch.Tensor, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> int:
        """Validate the arguments of :meth:`angles`; return N, the number of sequences."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be the block input [B, T, hidden], got {shape}")
        batch, length = x.shape[:2]
        if attention_mask is not None:
            if cu_seqlens is not None:
                raise ValueError("pass either attention_mask or cu_seqlens, not both")
            if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (batch, length):
                shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
                raise ValueError(f"attention_mask must be [B, T] = [{batch}, {length}] (1 = real token), got {shape}")
        if cu_seqlens is not None:
            return check_cu_seqlens(cu_seqlens, batch, length)
        return batch

    def check_rotation(self, q: torch.Tensor, k: torch.Tensor, angles: Angles | None) -> None:
        """Validate the arguments of :meth:`rotate`."""
        for name, value in (("q", q), ("k", k)):
            if not isinstance(value, torch.Tensor) or value.dim() != 4:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{name} must be a [B, T, heads, head_dim] tensor, got {shape}")
        if not (q.is_floating_point() and k.is_floating_point()):
            raise TypeError(f"q and k must be floating point, got {q.dtype} and {k.dtype}")
        if q.shape[-1] != k.shape[-1] or q.shape[2] % max(k.shape[2], 1):
            raise ValueError(f"q [B, T, H, D] and k [B, T, Hk, D] need the same D and H a multiple of Hk, got {tuple(q.shape)} and {tuple(k.shape)}")
        if not isinstance(angles, Angles):
            raise TypeError(f"angles must be what this encoding's angles(x) returned, got {type(angles).__name__}")
        if tuple(q.shape[:2]) != angles.rows or tuple(k.shape[:2]) != angles.rows:
            raise ValueError(
                f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the [B, T] = {list(angles.rows)} "
                "of the x their angles came from"
            )

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
