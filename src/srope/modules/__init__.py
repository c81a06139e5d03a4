"""Position-encoding modules, all behind one interface (:class:`PositionEncoding`)."""

from __future__ import annotations

import inspect
from typing import Any

from srope.modules.base import NoPE, PositionEncoding
from srope.modules.conv import FirstDifference, ShortConvolution
from srope.modules.rope import RoPE, RoPEState
from srope.modules.selective_rope import SelectiveRoPE, SelectiveRoPEState
from srope.modules.spectra import SPECTRA, temperature_spectrum
from srope.registry import positions

# What a host hands the encoding it builds, to those constructors that name them (not options of a config).
SIZE_ARGUMENTS = ("hidden_size", "num_heads", "head_dim")


def position_class(kind: Any) -> type:
    """The class of position encoding type ``kind``, a name in :data:`srope.registry.positions`."""
    if not isinstance(kind, str) or kind not in positions:
        raise ValueError(f"unknown position encoding type {kind!r}; expected one of {tuple(positions)}")
    return positions[kind].cls()


def build_position_encoding(spec: str | dict[str, Any] | None, *, hidden_size: int, num_heads: int, head_dim: int) -> PositionEncoding:
    """Build a position encoding from a config: ``"rope"`` or ``{"type": "rope", "theta": 1e4}``.

    The type is a name in :data:`srope.registry.positions`; its class gets those of
    ``hidden_size``, ``num_heads`` (the number of key heads) and ``head_dim`` that its
    constructor names, and the remaining keys as keyword arguments (unknown keys are an error).
    """
    spec = {"type": "nope"} if spec is None else {"type": spec} if isinstance(spec, str) else dict(spec)
    kind = spec.pop("type", None)
    cls = position_class(kind)
    sizes = dict(zip(SIZE_ARGUMENTS, (hidden_size, num_heads, head_dim)))
    takes = inspect.signature(cls.__init__).parameters
    try:
        return cls(**{name: value for name, value in sizes.items() if name in takes}, **spec)
    except TypeError as err:
        raise ValueError(f"bad options for position encoding {kind!r}: {err}") from None


__all__ = [
    "FirstDifference", "NoPE", "PositionEncoding", "RoPE", "RoPEState", "SPECTRA",
    "SelectiveRoPE", "SelectiveRoPEState", "ShortConvolution", "SIZE_ARGUMENTS", "build_position_encoding", "position_class", "temperature_spectrum",
]
