# @header

"""The Selective RoPE angle generator's fused kernels, used by `fla.modules.SelectiveRotaryEmbedding` on GPUs.

- `normalized_head_projection`: every linear map of the per-head l2-normalised hidden states x_hat (the projection and
  the gate's first layer) in one pass over x; x_hat is never built. The forward is float32-accurate on tensor cores
  (split float16 operands); under autocast the backward's two products run in autocast's dtype and read a copy of x in
  that dtype, written by the forward on its way (half the bytes of keeping float32 x for the backward).
- `conv_head_gate`: the short convolution, its activation, the bias and the per-head phase gate, one kernel forward and
  two backward, for whole rows (no `cu_seqlens`, no carried convolution state); elsewhere the module runs fla's
  `ShortConvolution` and the gate in PyTorch.

In float32 both equal the PyTorch expressions they replace to float32 rounding; under autocast the projection's
backward rounds its products and its copy of x to autocast's dtype (srope's tests check both against float64).
"""

import contextlib

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from fla.ops.selective_rope.chunk import cdiv, interpreting, next_power_of_2, pdl
from fla.ops.selective_rope.kernels import await_predecessor


def _kernels(x: torch.Tensor) -> bool:
    """Whether the fused kernels run for x: on GPUs, and on the CPU under Triton's interpreter (tests)."""
    return x.is_cuda or interpreting()


# @srope srope.ops._triton on_device
# @srope srope.ops.generator.projection_kernels _dz_columns _load_weight _store_weight_grad _add_weight_grads _input_grad_step backward_kernel BACKWARD_TILE SLAB MAX_SLABS slab_tokens _columns part_strides _unit_columns _backward_op _parts projection_backward split_weight_kernel _chunk_products _store_columns forward_kernel FORWARD_TILE NORM_PASS INTERPRETED_FORWARD column_blocks _forward_op projection_forward
# @srope srope.ops.generator.projection TORCH_SLAB _weight_grad _head_products _NormalizedHeadProjection normalized_head_projection
# @srope srope.ops.generator.gate BLOCK_N INTERPRET_BLOCK_N CONV_BWD_TILE MAX_ELEMENTS ACTIVATIONS _gate _gate_grad _launch _conv_fwd_block_n _conv_bwd_block_n _meta _check _check_size _check_device _conv conv_gate_fwd_kernel _conv_gate_grad conv_gate_bwd_kernel conv_taps_bwd_kernel _conv_gate_op:_conv_gate_fwd _conv_gate_bwd_op _conv_gate_setup _conv_gate_backward conv_head_gate


class ConvHeadGateFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, *inputs):
        output = _conv_gate_fwd(*inputs)
        _conv_gate_setup(ctx, inputs, output)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, dphi):
        return _conv_gate_backward(ctx, dphi)


def _conv_gate_op(*inputs):
    return ConvHeadGateFunction.apply(*inputs)
