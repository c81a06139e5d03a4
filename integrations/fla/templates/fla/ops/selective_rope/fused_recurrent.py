# @header

"""Selective RoPE for decoding: a few tokens per sequence, continuing from the cached phase, without autograd.

The phase is carried in float64 between steps (the state is `[N, HK, R]`), so the angle of token one million is as
accurate as that of token one. This runs the chunk kernels' forward on one short chunk per sequence; the module
(`fla.modules.SelectiveRotaryEmbedding`) computes the increments phi from the hidden states first.
"""

import torch

from fla.ops.selective_rope.chunk import chunk_tables, check_inputs, selective_rope_fwd
from fla.utils import input_guard

DECODE_CHUNK = 16


@input_guard
@torch.no_grad()
def fused_recurrent_selective_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r"""
    Args:
        q (torch.Tensor):
            queries of shape `[B, T, H, D]`, usually `T = 1`.
        k (torch.Tensor):
            keys of shape `[B, T, HK, D]`.
        phi (torch.Tensor):
            phase increments of shape `[B, T, HK, R]`.
        temperature (torch.Tensor):
            frequencies `[R]` or `[HK, R]`.
        initial_state (Optional[torch.Tensor]):
            the cached phase `[N, HK, R]` (float64). Default: `None`.
        output_final_state (Optional[bool]):
            Whether to return the new phase `[N, HK, R]` (float64). Default: `True`.
        cu_seqlens (torch.LongTensor):
            Cumulative sequence lengths of shape `[N+1]` (B must be 1). Default: `None`.

    Returns:
        q_rot, k_rot and the new phase (or `None`); no gradient flows through this op.
    """
    check_inputs(q, k, phi, temperature, initial_state, cu_seqlens)
    cu_chunks = chunk_seq = None
    if cu_seqlens is not None:
        cu_chunks, chunk_seq = chunk_tables(cu_seqlens, q.shape[1], DECODE_CHUNK)
    q_rot, k_rot, final_state, _ = selective_rope_fwd(
        q, k, phi, temperature, initial_state, cu_seqlens, cu_chunks, chunk_seq, DECODE_CHUNK,
    )
    return q_rot, k_rot, final_state if output_final_state else None
