"""Pieces every host layer shares: the carried state, short convs on q/k/v, the gated norm."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import torch
from torch import nn

from srope.modules import PositionEncoding, ShortConvolution, build_position_encoding
from srope.ops.checks import check_cu_seqlens
from srope.ops.fused import rms_norm, rms_norm_gated
from srope.ops.layout import RowLayout


@dataclass
class LayerState:
    """What a layer carries between calls, per sequence (batch dimension first everywhere).

    ``conv``: the q/k/v short-conv states; ``position``: the position encoding's state;
    ``recurrent``: a linear mixer's ``[N, H, K, V]`` state; ``keys``/``values``/``key_mask``/
    ``log_forget``: an attention layer's cache of rotated keys, values, which cached
    positions are real tokens, and the per-position log forget gates (FoX).
    """

    conv: tuple[torch.Tensor, ...] | None = None
    position: Any = None
    recurrent: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    log_forget: torch.Tensor | None = None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LayerState":
        """Apply ``fn`` to every tensor (e.g. ``lambda t: t.index_select(0, beam_idx)``)."""

        def apply(value):
            if isinstance(value, torch.Tensor):
                return fn(value)
            if isinstance(value, tuple):
                return type(value)(*(apply(v) for v in value)) if hasattr(value, "_fields") else tuple(apply(v) for v in value)
            return value

        return replace(self, **{f.name: apply(getattr(self, f.name)) for f in fields(self)})

    def sequences(self) -> int | None:
        """How many sequences the state holds (None if it holds no tensor yet)."""
        found = []
        self.map(lambda t: found.append(t.shape[0]) or t)
        return found[0] if found else None


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat ``[B, T, Hk, ...]`` to ``heads`` heads in contiguous groups (GQA)."""
    return x if x.shape[2] == heads else x.repeat_interleave(heads // x.shape[2], dim=2)


class QKVConvolutions(nn.Module):
    """Optional short causal convs (with SiLU) on the q, k and v projections, as in fla's hosts."""

    def __init__(self, widths: tuple[int, int, int], kernel_size: int):
        super().__init__()
        self.convs = nn.ModuleList(ShortConvolution(width, kernel_size, activation="silu") for width in widths)

    def forward(self, tensors, layout: RowLayout, states=None, want_state: bool = True):
        """The convolved tensors and their final states (None without ``want_state``)."""
        outputs, new_states = [], []
        for i, (conv, x) in enumerate(zip(self.convs, tensors)):
            y, state = conv(x, layout, None if states is None else states[i], want_state=want_state)
            outputs.append(y)
            new_states.append(state)
        return outputs, tuple(new_states) if want_state else None


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (same parameters and state dict) run by :func:`srope.ops.fused.rms_norm`:
    one fla kernel on CUDA. ``norm(x, residual=h)`` returns ``(norm(h + x), h + x)`` with the
    add fused in (where :mod:`srope.backend` allows fla)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual=residual)


class GatedRMSNorm(nn.Module):
    """``rmsnorm(o) · weight · swish(g)`` over the last dimension (fla's FusedRMSNormGated)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.norm = RMSNorm(dim, eps=eps)

    def forward(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        return rms_norm_gated(o, gate, self.norm.weight, self.norm.eps)


class MixerLayer(nn.Module):
    """Base of the host layers: owns the position encoding and the layout of the batch.

    Subclasses implement ``forward(x, *, attention_mask=None, cu_seqlens=None, state=None,
    use_cache=False, layout=None) -> (out, state)`` with ``x [B, T, hidden]`` the normalised
    block input, ``attention_mask [B, T]`` marking the real tokens of this call and ``layout``
    the batch's :class:`RowLayout` when the caller built it once for several layers.
    """

    def __init__(self, hidden_size: int, position: Any, *, key_heads: int, head_dim: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.position: PositionEncoding = build_position_encoding(
            position, hidden_size=hidden_size, num_heads=key_heads, head_dim=head_dim
        )

    def check_input(self, x: torch.Tensor, attention_mask, cu_seqlens, state) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden_size:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__} expects hidden states [B, T, {self.hidden_size}], got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} expects floating-point hidden states, got {x.dtype}")
        if state is not None and not isinstance(state, LayerState):
            raise TypeError(f"state must be a LayerState returned with use_cache=True, got {type(state).__name__}")
        rows = x.shape[0] if cu_seqlens is None else check_cu_seqlens(cu_seqlens, *x.shape[:2])
        held = None if state is None else state.sequences()
        if held is not None:
            if held != rows:
                raise ValueError(f"the state holds {held} sequences, this call has {rows}{' (cu_seqlens)' if cu_seqlens is not None else ''}: "
                                 "pass the state of this batch's sequences (a new batch starts without one)")

    def project_qkv(
        self, x, layout: RowLayout, state, heads: tuple[int, int, int], dims: tuple[int, int, int], activation=None,
        want_state: bool = True,
    ):
        """q, k, v projections, then the short convs when the layer has them (else
        ``activation``), as ``[B, T, heads, dim]``; also returns the convs' new state (None
        without ``want_state``)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if getattr(self, "convs", None) is not None:
            (q, k, v), conv_state = self.convs((q, k, v), layout, None if state is None else state.conv, want_state)
        elif activation is not None:
            q, k, v = activation(q), activation(k), activation(v)
        q, k, v = (t.unflatten(-1, (h, d)) for t, h, d in zip((q, k, v), heads, dims))
        return q, k, v, conv_state

    def encode_positions(self, q, k, x, x_in, *, attention_mask, cu_seqlens, state, use_cache, layout=None):
        """q and k through the layer's position encoding, the one call every encoding takes;
        ``x`` is the block input, ``x_in`` what the layer's own maps read (``self.position.host_input(x)``).
        Returns the rotated q and k and the encoding's new state."""
        return self.position(
            q, k, x, attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=None if state is None else state.position,
            use_cache=use_cache, layout=layout, x_cast=x_in if x_in.dtype != x.dtype else None,
        )

    @staticmethod
    def real_tokens(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """``[B, T, 1]`` float mask of real tokens, or None when every token is real."""
        if attention_mask is None:
            return None
        return (attention_mask != 0).to(x.dtype)[..., None]
