"""Functions on tensors, without parameters."""

from srope.ops.mixers import forgetting_attention, gated_delta_rule, gla, softmax_attention
from srope.ops.rotary import BACKENDS, rope, selective_rope

__all__ = ["BACKENDS", "forgetting_attention", "gated_delta_rule", "gla", "rope", "selective_rope", "softmax_attention"]
