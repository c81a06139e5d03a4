"""The one interface every position encoding implements, and every host layer calls.

A host layer projects q and k from its own input and hands them to its encoding, with the
block input x the angles may come from, in one call::

    q, k = q_proj(x), k_proj(x)                          # the host's own maps
    q, k, state = layer.position(q, k, x, attention_mask=mask, state=state, use_cache=True)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from srope.ops.checks import check_cu_seqlens


class PositionEncoding(nn.Module):
    """Base class of NoPE, RoPE and SelectiveRoPE.

    ``forward(q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False,
    layout=None, x_cast=None) -> (q, k, state)``

    - ``q [B, T, H, D]``, ``k [B, T, Hk, D]`` (``H % Hk == 0``): rotated and returned in their dtypes.
    - ``x [B, T, hidden]``: the block input the angles come from (NoPE and RoPE read nothing
      of it and accept None; an encoding whose angles depend on it sets ``needs_input``).
    - ``attention_mask [B, T]`` (1 = real token, left or right padding): padded positions
      advance no phase and no position, and are invisible to the angle generator's conv.
    - ``cu_seqlens [N+1]`` (``B == 1``): packed sequences; everything restarts per sequence.
    - ``state``: what a previous call returned with ``use_cache=True`` (per row, or per packed
      sequence); the call continues those sequences. Without ``use_cache`` the returned state is None.
    - ``layout``: the batch's :class:`~srope.ops.layout.RowLayout` when the caller built it
      once for several layers.
    - ``x_cast``: the host's own copy of x in autocast's dtype, when it made one for its maps
      (:meth:`host_input`). An encoding whose backward needs x may keep that copy instead of x
      (Selective RoPE's generator does: one copy of x held, not two).

    ``host_input(x)``, called by the host before its own maps, is what those maps read: x, or
    under autocast x cast once; an encoding may make that copy itself (Selective RoPE writes it
    in the same pass that projects x for its angles).
    """

    needs_input = False  # whether the angles depend on x's values (else x may be None)

    def forward(self, q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None, x_cast=None):
        self.check_call(q, k, x, attention_mask, cu_seqlens, x_cast)
        if state is not None:
            raise TypeError(f"{type(self).__name__} carries no state (it returns None), got {type(state).__name__}")
        return q, k, None

    def host_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the host layer's own linear maps read: under autocast a float32 x cast once to
        autocast's dtype, shared by every map (autocast alone casts an x that is not a leaf once
        per map, forward and backward); else a view of x. Either way the maps' gradients add up
        there first and reach x as one, beside the encoding's."""
        device = x.device.type
        if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
            return x.to(torch.get_autocast_dtype(device))
        return x.view_as(x)

    def check_call(self, q, k, x, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None, x_cast=None) -> int:
        """Validate the arguments of a call; return N, the number of sequences."""
        for name, value in (("q", q), ("k", k)):
            if not isinstance(value, torch.Tensor) or value.dim() != 4:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{name} must be a [B, T, heads, head_dim] tensor, got {shape}")
        if not (q.is_floating_point() and k.is_floating_point()):
            raise TypeError(f"q and k must be floating point, got {q.dtype} and {k.dtype}")
        if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1] or q.shape[2] % max(k.shape[2], 1):
            raise ValueError(f"q [B, T, H, D] and k [B, T, Hk, D] need the same [B, T] and D, and H a multiple of Hk, got {tuple(q.shape)} and {tuple(k.shape)}")
        batch, length = q.shape[:2]
        if x is None:
            if self.needs_input:
                raise ValueError(f"{type(self).__name__} needs the block input x [B, T, hidden] to compute its angles")
        elif not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[:2]) != (batch, length):
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be the block input [B, T, hidden] = [{batch}, {length}, hidden], got {shape}")
        if x_cast is not None and (x is None or not isinstance(x_cast, torch.Tensor) or x_cast.shape != x.shape):
            shape = tuple(x_cast.shape) if isinstance(x_cast, torch.Tensor) else type(x_cast).__name__
            raise ValueError(f"x_cast must be the host's copy of x {None if x is None else tuple(x.shape)}, got {shape}")
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
