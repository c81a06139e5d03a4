"""srope: Selective Rotary Position Embedding."""

import srope.models  # noqa: F401  (registers model_type "srope" with the transformers Auto classes)
from srope.modules import NoPE, RoPE, SelectiveRoPE, build_position_encoding
from srope.ops import rope, selective_rope

__version__ = "0.1.0"

__all__ = ["NoPE", "RoPE", "SelectiveRoPE", "__version__", "build_position_encoding", "rope", "selective_rope"]
