"""Functions on tensors, without parameters."""

from srope.ops.rotary import BACKENDS, rope, selective_rope

__all__ = ["BACKENDS", "rope", "selective_rope"]
