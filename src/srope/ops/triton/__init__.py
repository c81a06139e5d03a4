"""Triton kernels of the rotation: Selective RoPE (training/prefill and a fused one-token
decode step) and fixed RoPE. They run on CUDA, or on the CPU under ``TRITON_INTERPRET=1``
(read when this package is first imported, as Triton reads it when kernels are decorated).

- :func:`selective_rope_triton`, :func:`rope_triton`: what :func:`srope.ops.selective_rope`
  and :func:`srope.ops.rope` call for ``backend="triton"`` (and ``"auto"`` on CUDA).
- :func:`selective_rope_decode_step`: generator conv + activation + bias + gate + phase +
  rotation of one token per sequence, for the ``SelectiveRoPE`` module's cached decoding,
  optionally from the token x itself; :func:`decode_generator_inputs`: the generator's
  inputs (ω map, gate) of that token from x in a kernel of their own.

The generator's own kernels: ``projection.py`` (float32 forward and input gradient of its
normalised per-head map) and ``head_gate.py`` (the standard gate around its conv), used by
:mod:`srope.ops.projection` and ``SelectiveRoPE`` on CUDA.

Design and numerics: ``kernels.py``; launches and ``torch.library`` registration: ``ops.py``.
"""

from srope.ops.triton.decode import decode_generator_inputs, selective_rope_decode_step
from srope.ops.triton.ops import rope_triton, selective_rope_triton

__all__ = ["decode_generator_inputs", "rope_triton", "selective_rope_decode_step", "selective_rope_triton"]
