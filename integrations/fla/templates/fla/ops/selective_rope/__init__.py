# @header

from .chunk import chunk_selective_rope
from .fused_recurrent import fused_recurrent_selective_rope
from .naive import naive_selective_rope

__all__ = [
    'chunk_selective_rope',
    'fused_recurrent_selective_rope',
    'naive_selective_rope',
]
