"""srope: Selective Rotary Position Embedding.

``import srope`` loads nothing heavy; the op and modules import torch when first used, and
``import srope.models`` registers the Hugging Face classes (``model_type = "srope"``) with the
Auto classes, which loading a saved model with ``AutoModelForCausalLM`` needs.
"""

from srope._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "NoPE": "srope.modules",
    "RoPE": "srope.modules",
    "SelectiveRoPE": "srope.modules",
    "build_position_encoding": "srope.modules",
    "rope": "srope.ops",
    "selective_rope": "srope.ops",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = ["NoPE", "RoPE", "SelectiveRoPE", "__version__", "build_position_encoding", "rope", "selective_rope"]
