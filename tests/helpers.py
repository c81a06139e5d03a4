"""Shared test helpers: error metrics, seeded inputs and an independent naive rotation."""

from __future__ import annotations

import math

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMS error ‖a−b‖/‖b‖ (fla's get_err_ratio), computed in float64; NaN never passes."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert not torch.isnan(actual).any(), "NaN in the result"
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    denom = expected.norm()
    return float((actual - expected).norm() / denom) if denom > 0 else float((actual - expected).norm())


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed_gen: torch.Generator, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=seed_gen, dtype=torch.float64)).to(dtype)


def naive_selective_rope(q, k, phi, temperature, offset=None, cu_seqlens=None):
    """Token-by-token, pair-by-pair rotation with explicit 2×2 matrices (float64, slow)."""
    batch, length, heads, dim = q.shape
    key_heads, pairs = k.shape[2], phi.shape[3]
    group = heads // key_heads
    temp = temperature.double().expand(key_heads, pairs) if temperature.dim() == 1 else temperature.double()
    starts = [0] if cu_seqlens is None else cu_seqlens.tolist()[:-1]
    q_out, k_out = q.double().clone(), k.double().clone()
    for b in range(batch):
        phase = torch.zeros(key_heads, pairs, dtype=torch.float64)
        seq = -1
        for t in range(length):
            if cu_seqlens is None and t == 0 or cu_seqlens is not None and t in starts:
                seq = b if cu_seqlens is None else max(i for i, s in enumerate(starts) if s == t)
                phase = offset[seq].double().clone() if offset is not None else torch.zeros_like(phase)
            phase = phase + phi[b, t].double()
            for head in range(heads):
                for j in range(pairs):
                    a = float(temp[head // group, j] * phase[head // group, j])
                    c, s = math.cos(a), math.sin(a)
                    x, y = q[b, t, head, j].item(), q[b, t, head, j + pairs].item()
                    q_out[b, t, head, j], q_out[b, t, head, j + pairs] = c * x - s * y, s * x + c * y
            for head in range(key_heads):
                for j in range(pairs):
                    a = float(temp[head, j] * phase[head, j])
                    c, s = math.cos(a), math.sin(a)
                    x, y = k[b, t, head, j].item(), k[b, t, head, j + pairs].item()
                    k_out[b, t, head, j], k_out[b, t, head, j + pairs] = c * x - s * y, s * x + c * y
    return q_out, k_out
