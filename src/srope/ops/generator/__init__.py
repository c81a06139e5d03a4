"""The Selective RoPE angle generator's ops on tensors.

- :func:`normalized_head_projection` (``projection.py``): every first layer acting on the
  ℓ2-normalised input, per head, without building x̂; torch route anywhere, Triton kernels
  on CUDA (``projection_kernels.py``).
- ``gate.py``: the standard phase gate around the generator's conv, one Triton kernel each
  way (with the conv inside it for whole rows); ``weights.py``: the weight-normed first
  layers in one kernel each way. :class:`srope.modules.SelectiveRoPE` calls them on CUDA.

The generator's ground truth is the module's torch path (``srope.modules.SelectiveRoPE``
with the fused kernels off), which the tests hold these to in float64.
"""

from srope.ops.generator.projection import normalized_head_projection

__all__ = ["normalized_head_projection"]
