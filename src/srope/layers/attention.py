"""Softmax attention and the Forgetting Transformer (Lin et al., 2025), with a pluggable
position encoding and a KV cache of rotated keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from srope.layers.common import LayerState, MixerLayer
from srope.ops.checks import compute_dtype
from srope.ops.mixers import forgetting_attention, softmax_attention


class Attention(MixerLayer):
    """Causal softmax attention; with ``forget_gate`` the logits get FoX's data-dependent
    decay ``Σ_{κ=j+1}^{i} log f_κ``, ``f = sigmoid(W_f x + b)`` per query head.

    Args:
        hidden_size, num_heads, num_kv_heads (GQA), head_dim (default hidden_size / num_heads).
        qkv_bias: biases on the q/k/v projections.
        qk_norm: RMSNorm of q and k per head, applied before the rotation.
        use_output_gate: ``o · sigmoid(W_g x)`` before the output projection.
        forget_gate: FoX's forget gate.
        position: the position-encoding config.
    """

    @classmethod
    def from_config(cls, config) -> "Attention":
        """The layer an :class:`srope.models.SRopeConfig` describes (its ``position`` included)."""
        return cls(
            hidden_size=config.hidden_size, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
            qkv_bias=config.qkv_bias, qk_norm=config.qk_norm, use_output_gate=config.use_output_gate, norm_eps=config.norm_eps,
            position=config.position,
        )

    def __init__(
        self,
        hidden_size: int = 1024,
        num_heads: int = 16,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        use_output_gate: bool = False,
        forget_gate: bool = False,
        norm_eps: float = 1e-5,
        position=None,
    ):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = hidden_size // num_heads
        super().__init__(hidden_size, position, key_heads=num_kv_heads, head_dim=head_dim)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.q_norm = nn.RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.f_proj = nn.Linear(hidden_size, num_heads, bias=True) if forget_gate else None
        self.g_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False) if use_output_gate else None
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None):
        self.check_input(x, attention_mask, cu_seqlens, state)
        if use_cache and cu_seqlens is not None:
            raise ValueError("a KV cache of packed sequences (cu_seqlens) is not supported; pad the batch and pass attention_mask")
        batch, length, _ = x.shape
        x_in = self.position.host_input(x)
        q = self.q_proj(x_in).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x_in).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x_in).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, position_state = self.encode_positions(
            q, k, x, x_in, attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout
        )
        log_forget = None
        if self.f_proj is not None:
            log_forget = F.logsigmoid(self.f_proj(x_in).to(compute_dtype(x.dtype)))
            if attention_mask is not None:  # padded tokens do not decay
                log_forget = log_forget * (attention_mask != 0)[..., None]
        key_mask = None if attention_mask is None else attention_mask != 0
        if state is not None and state.keys is not None:
            past = state.keys.shape[1]
            if key_mask is not None or state.key_mask is not None:
                old = state.key_mask if state.key_mask is not None else torch.ones(batch, past, dtype=torch.bool, device=x.device)
                new = key_mask if key_mask is not None else torch.ones(batch, length, dtype=torch.bool, device=x.device)
                key_mask = torch.cat([old, new], dim=1)
            k, v = torch.cat([state.keys, k], dim=1), torch.cat([state.values, v], dim=1)
            if log_forget is not None:
                log_forget = torch.cat([state.log_forget, log_forget], dim=1)
        if log_forget is None:
            o = softmax_attention(q, k, v, cu_seqlens=cu_seqlens, key_mask=key_mask)
        else:
            o = forgetting_attention(q, k, v, log_forget, cu_seqlens=cu_seqlens, key_mask=key_mask)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x_in).unflatten(-1, (self.num_heads, self.head_dim)))
        out = self.o_proj(o.to(x.dtype).flatten(-2))
        new_state = None
        if use_cache:
            new_state = LayerState(position=position_state, keys=k, values=v, key_mask=key_mask, log_forget=log_forget)
        return out, new_state


class ForgettingAttention(Attention):
    """The Forgetting Transformer's attention (fla's layout: no output gate, no qk-norm by default)."""

    def __init__(self, hidden_size: int = 1024, num_heads: int = 16, **kwargs):
        kwargs.setdefault("forget_gate", True)
        super().__init__(hidden_size, num_heads, **kwargs)
