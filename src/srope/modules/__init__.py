"""Position-encoding modules, all behind one interface (:class:`PositionEncoding`)."""

from __future__ import annotations

from typing import Any

from srope.modules.base import Angles, NoPE, PositionEncoding
from srope.modules.conv import FirstDifference, ShortConvolution
from srope.modules.rope import RoPE, RoPEState
from srope.modules.selective_rope import SelectiveRoPE, SelectiveRoPEState
from srope.modules.spectra import SPECTRA, temperature_spectrum

POSITION_TYPES = ("nope", "rope", "selective_rope")


def build_position_encoding(spec: str | dict[str, Any] | None, *, hidden_size: int, num_heads: int, head_dim: int) -> PositionEncoding:
    """Build a position encoding from a config: ``"rope"`` or ``{"type": "rope", "theta": 1e4}``.

    ``num_heads`` is the number of key heads; the remaining keys are the module's
    keyword arguments, and unknown keys are an error.
    """
    spec = {"type": "nope"} if spec is None else {"type": spec} if isinstance(spec, str) else dict(spec)
    kind = spec.pop("type", None)
    if kind == "nope":
        cls, args = NoPE, {}
    elif kind == "rope":
        cls, args = RoPE, {"head_dim": head_dim}
    elif kind == "selective_rope":
        cls, args = SelectiveRoPE, {"hidden_size": hidden_size, "num_heads": num_heads, "head_dim": head_dim}
    else:
        raise ValueError(f"unknown position encoding type {kind!r}; expected one of {POSITION_TYPES}")
    try:
        return cls(**args, **spec)
    except TypeError as err:
        raise ValueError(f"bad options for position encoding {kind!r}: {err}") from None


__all__ = [
    "POSITION_TYPES", "Angles", "FirstDifference", "NoPE", "PositionEncoding", "RoPE", "RoPEState", "SPECTRA",
    "SelectiveRoPE", "SelectiveRoPEState", "ShortConvolution", "build_position_encoding", "temperature_spectrum",
]
