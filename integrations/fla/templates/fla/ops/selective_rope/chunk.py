# @header

"""Chunked Selective RoPE (training and prefill): rotate q and k by input-dependent cumulative angles.

Three passes, no atomics (bitwise deterministic): per-chunk sums of phi in float64, a float64 scan of the chunk sums per
sequence (the phase before every chunk), then one program per (chunk, key head) that forms the angles
``wrap(temperature * phase)`` and rotates the key head and its group of query heads. The backward recomputes the
angles from phi and the saved chunk phases, and reads the rotated outputs instead of q and k. Precision and the
float64 phase: see ``kernels.py``.
"""

import functools
import os

import torch

from fla.ops.selective_rope import kernels
from fla.ops.utils.index import prepare_chunk_offsets
from fla.utils import autocast_custom_bwd, autocast_custom_fwd, input_guard

# @srope srope.ops._triton _INTERPRETING interpreting PDL_ENV _pdl_capable pdl cdiv next_power_of_2
# @srope srope.ops.rotary.chunk SCAN_ELEMENTS TILE_ELEMENTS MAX_SUB_T INTERPRET_SUB_T LIGHT_ELEMENTS NO_SPILL FAST_SCAN_DTYPES _interpreted_tile _tile _scan_tile _light_tile _no_spill default_block_t _check_block_t _last_dim_contiguous _bth _meta _selective_meta chunk_tables selective_rope_fwd selective_rope_bwd _selective_setup _selective_backward


class ChunkSelectiveRoPEFunction(torch.autograd.Function):

    @staticmethod
    @input_guard
    @autocast_custom_fwd
    def forward(ctx, q, k, phi, temperature, initial_state, cu_seqlens, cu_chunks, chunk_seq, chunk_size):
        inputs = (q, k, phi, temperature, initial_state, cu_seqlens, cu_chunks, chunk_seq, chunk_size)
        outputs = selective_rope_fwd(*inputs)
        _selective_setup(ctx, inputs, outputs)
        return outputs

    @staticmethod
    @input_guard
    @autocast_custom_bwd
    def backward(ctx, dq, dk, dfinal, dbase):
        return _selective_backward(ctx, dq, dk, dfinal, dbase)


def check_inputs(q, k, phi, temperature, initial_state, cu_seqlens) -> int:
    """Shapes and dtypes of the public ops' inputs; returns the number of sequences N."""
    if q.dim() != 4 or k.dim() != 4 or phi.dim() != 4:
        raise ValueError(f"q, k and phi must be 4-D [B, T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(phi.shape)}")
    B, T, H, D = q.shape
    HK, R = k.shape[2], phi.shape[3]
    if k.shape[:2] != q.shape[:2] or k.shape[3] != D or HK == 0 or H % HK:
        raise ValueError(f"k must be [B, T, HK, D] with H % HK == 0, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if tuple(phi.shape[:3]) != (B, T, HK) or R < 1 or 2 * R > D:
        raise ValueError(f"phi must be [B, T, HK, R] = [{B}, {T}, {HK}, R] with 1 <= R <= D/2, got {tuple(phi.shape)}")
    if tuple(temperature.shape) not in ((R,), (HK, R)):
        raise ValueError(f"temperature must be [R] or [HK, R] with R={R}, got {tuple(temperature.shape)}")
    if q.dtype != k.dtype or not q.is_floating_point() or not phi.is_floating_point():
        raise TypeError(f"q and k must share a floating dtype and phi be floating, got {q.dtype}, {k.dtype}, {phi.dtype}")
    N = B
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`.")
        N = len(cu_seqlens) - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, HK, R):
        raise ValueError(f"initial_state must be [N, HK, R] = [{N}, {HK}, {R}], got {tuple(initial_state.shape)}")
    return N


@torch.compiler.disable
def chunk_selective_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r"""
    Args:
        q (torch.Tensor):
            queries of shape `[B, T, H, D]`.
        k (torch.Tensor):
            keys of shape `[B, T, HK, D]`; GQA is supported: query head `h` uses key head `h // (H // HK)`.
        phi (torch.Tensor):
            phase increments (before the temperature) of shape `[B, T, HK, R]`, `2R <= D`. Channel pairs `(j, j + R)`
            rotate together; channels `[2R, D)` pass through unchanged.
        temperature (torch.Tensor):
            frequency of every pair, `[R]` or `[HK, R]`.
        initial_state (Optional[torch.Tensor]):
            phase before the first token, `[N, HK, R]`, usually float64 (a previous call's final state). Default: `None`.
        output_final_state (Optional[bool]):
            Whether to output the final phase of shape `[N, HK, R]` (float64, no gradient). Default: `False`.
        cu_seqlens (torch.LongTensor):
            Cumulative sequence lengths of shape `[N+1]` used for variable-length training,
            consistent with the FlashAttention API. The phase restarts at every sequence start.
        chunk_indices (torch.LongTensor):
            `prepare_chunk_indices(cu_seqlens, chunk_size)`, when the caller has it already. Default: `None`.
        chunk_size (Optional[int]):
            Tokens per chunk, a power of two; it must be the one `chunk_indices` was made with (64 when that is given
            and this is not). Default: chosen from the shape.

    Returns:
        q_rot (torch.Tensor), k_rot (torch.Tensor) with the dtypes of q and k, and the final phase (or `None`).
        Phases are accumulated in float64 whatever the input dtype; angles are formed in max(float32, input dtype).
    """
    check_inputs(q, k, phi, temperature, initial_state, cu_seqlens)
    if chunk_size is None:
        chunk_size = 64 if chunk_indices is not None else default_block_t(q.shape[0], q.shape[1], k.shape[2], phi.shape[3])
    chunk_size = _check_block_t(chunk_size)
    cu_chunks = chunk_seq = None
    if cu_seqlens is not None:
        if chunk_indices is None:
            cu_chunks, chunk_seq = chunk_tables(cu_seqlens, q.shape[1], chunk_size)
        else:
            cu_chunks = prepare_chunk_offsets(cu_seqlens, chunk_size).to(torch.int32)
            chunk_seq = chunk_indices[:, 0].to(torch.int32)
    q_rot, k_rot, final_state, _ = ChunkSelectiveRoPEFunction.apply(
        q, k, phi, temperature, initial_state, cu_seqlens, cu_chunks, chunk_seq, chunk_size,
    )
    return q_rot, k_rot, final_state if output_final_state else None
