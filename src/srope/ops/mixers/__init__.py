"""The host mixers' kernels as functions on tensors.

``gla`` (gated linear attention), ``gated_delta_rule`` (Gated DeltaNet / DeltaNet),
``forgetting_attention`` (FoX) and ``softmax_attention``. Tensors are ``[B, T, H, D]``;
recurrent states are ``[N, H, K, V]``; packed batches use ``cu_seqlens``.

On CUDA they call flash-linear-attention 0.6.0 (imported lazily; PyTorch SDPA for plain
softmax attention); everywhere else, and where fla cannot run a call, chunked PyTorch
paths that are float64-capable and held to token-by-token references in the tests.
"""

from srope.ops.mixers._common import MIXER_BACKENDS, fla_available, fla_gated_backward_is_broken
from srope.ops.mixers.attention import forgetting_attention, softmax_attention
from srope.ops.mixers.delta_rule import gated_delta_rule
from srope.ops.mixers.gla import gla

__all__ = [
    "MIXER_BACKENDS",
    "fla_available",
    "fla_gated_backward_is_broken",
    "forgetting_attention",
    "gated_delta_rule",
    "gla",
    "softmax_attention",
]
