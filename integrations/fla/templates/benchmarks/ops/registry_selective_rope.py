# @header

"""Benchmark entry of `chunk_selective_rope`: import this module next to `registry.py` (one line there) to register it."""

import torch

from benchmarks.ops.registry import OpConfig, TensorSpec, register_op, shape_BTHD


def shape_BTHR(B, T, H, D, **kw):
    return (B, T, H, D // 2)


def shape_R(B, T, H, D, **kw):
    return (D // 2,)


def rope_spectrum(t):
    R = t.shape[-1]
    return 500000.0 ** -(torch.arange(R, dtype=torch.float32, device=t.device) / R)


register_op(OpConfig(
    name='chunk_selective_rope',
    import_path='fla.ops.selective_rope',
    inputs={
        'q': TensorSpec(shape_BTHD),
        'k': TensorSpec(shape_BTHD),
        'phi': TensorSpec(shape_BTHR, dtype='float32', transform=lambda t: 0.5 + 0.5 * t),
        'temperature': TensorSpec(shape_R, requires_grad=False, dtype='float32', transform=rope_spectrum),
    },
    category='rotary',
))
