# @header

"""Plain-PyTorch reference of Selective RoPE: float64-capable, runs on any device, imports only torch.

Tensors are ``[B, T, H, D]``; the rotation is GPT-NeoX half-split (channel ``j`` pairs with ``j + R``), channels
``[2R, D)`` pass through. Token ``t`` of a sequence is rotated by ``temperature * Phi_t`` with
``Phi_t = initial_state + sum_{s <= t} phi_s`` accumulated in float64.
"""

import math

import torch

# @srope srope.ops.checks compute_dtype
# @srope srope.ops.layout sequence_ids
# @srope srope.ops.rotary.naive TWO_PI cumulative_phase wrap_angle rotate rotate_by_angle selective_rope:_selective_rope


def naive_selective_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    phi: torch.Tensor,
    temperature: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r"""
    Args:
        q (torch.Tensor):
            queries of shape `[B, T, H, D]`.
        k (torch.Tensor):
            keys of shape `[B, T, HK, D]`, `H % HK == 0`.
        phi (torch.Tensor):
            phase increments of shape `[B, T, HK, R]`, `2R <= D`.
        temperature (torch.Tensor):
            frequencies of shape `[R]` or `[HK, R]`.
        initial_state (Optional[torch.Tensor]):
            phase before the first token, `[N, HK, R]`. Default: `None`.
        output_final_state (Optional[bool]):
            Whether to return the final phase `[N, HK, R]` (float64). Default: `False`.
        cu_seqlens (torch.LongTensor):
            Cumulative sequence lengths of shape `[N+1]` (B must be 1); the phase restarts at every sequence start.

    Returns:
        q_rot, k_rot (dtypes of q and k) and the final phase (or `None`).
    """
    q_rot, k_rot, final_state = _selective_rope(q, k, phi, temperature, initial_state, cu_seqlens)
    return q_rot, k_rot, final_state if output_final_state else None
