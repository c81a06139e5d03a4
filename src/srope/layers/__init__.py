"""Host token mixers. Each takes its position encoding through the one interface of
:class:`srope.modules.PositionEncoding`: q and k are rotated before the kernel, the angles
come from the block input."""

from srope.layers.attention import Attention, ForgettingAttention
from srope.layers.common import LayerState
from srope.layers.gated_deltanet import GatedDeltaNet
from srope.layers.gla import GatedLinearAttention

__all__ = ["Attention", "ForgettingAttention", "GatedDeltaNet", "GatedLinearAttention", "LayerState"]
