"""Gated Linear Attention (Yang et al., 2024) with a pluggable position encoding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from srope.layers.common import GatedRMSNorm, LayerState, MixerLayer, QKVConvolutions, expand_heads
from srope.ops.checks import compute_dtype, is_finite_number
from srope.ops.layout import RowLayout
from srope.ops.mixers import gla


class GatedLinearAttention(MixerLayer):
    """GLA: ``S_t = diag(α_t) S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t``, with q and k rotated
    by the position encoding first (fla's layer structure).

    Args:
        hidden_size, num_heads, num_kv_heads (GQA; default num_heads).
        expand_k, expand_v: key / value width as a fraction of hidden_size.
        use_short_conv, conv_size: SiLU short convs on q, k, v.
        use_output_gate: ``rmsnorm(o) · swish(g)`` output gate (else plain RMSNorm).
        gate_logit_normalizer, gate_low_rank_dim: decay ``logsigmoid(W₂W₁x) / normalizer``.
        tie_decay_pairs: share the decay of the two channels of every rotation pair, which
            makes GLA + Selective RoPE exactly the complex ``Λ_t R_t`` recurrence (off, as in
            the paper).
        position: the position-encoding config (``"nope"``, ``{"type": "rope", ...}``, ...).
    """

    @classmethod
    def from_config(cls, config) -> "GatedLinearAttention":
        """The layer an :class:`srope.models.SRopeConfig` describes (its ``position`` included)."""
        return cls(
            hidden_size=config.hidden_size, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, expand_k=config.expand_k,
            expand_v=config.expand_v, use_short_conv=config.use_short_conv, conv_size=config.conv_size, use_output_gate=config.use_output_gate,
            gate_logit_normalizer=config.gate_logit_normalizer, gate_low_rank_dim=config.gate_low_rank_dim, norm_eps=config.norm_eps,
            tie_decay_pairs=config.tie_decay_pairs, position=config.position,
        )

    def __init__(
        self,
        hidden_size: int = 1024,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        use_short_conv: bool = False,
        conv_size: int = 4,
        use_output_gate: bool = True,
        gate_logit_normalizer: float = 16.0,
        gate_low_rank_dim: int = 16,
        norm_eps: float = 1e-5,
        tie_decay_pairs: bool = False,
        position=None,
    ):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        key_dim, value_dim = int(hidden_size * expand_k), int(hidden_size * expand_v)
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if key_dim < 1 or value_dim < 1:
            raise ValueError(f"hidden_size·expand_k = {key_dim} and hidden_size·expand_v = {value_dim} must be >= 1")
        if not is_finite_number(gate_logit_normalizer):
            raise ValueError(f"gate_logit_normalizer must be a finite number > 0 (the decay is logsigmoid(.) / it), got {gate_logit_normalizer!r}")
        if key_dim % num_heads or value_dim % num_heads:
            raise ValueError(
                f"key_dim = hidden_size·expand_k = {key_dim} and value_dim = hidden_size·expand_v = {value_dim} "
                f"must be divisible by num_heads = {num_heads}"
            )
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        super().__init__(hidden_size, position, key_heads=num_kv_heads, head_dim=self.head_k_dim)
        self.gate_logit_normalizer = gate_logit_normalizer
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_k_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_v_dim, bias=False)
        self.convs = (
            QKVConvolutions((key_dim, num_kv_heads * self.head_k_dim, num_kv_heads * self.head_v_dim), conv_size)
            if use_short_conv
            else None
        )
        # With tied pairs the decay is projected once per pair and shared by its two channels.
        self.tied_pairs = (getattr(self.position, "pairs", None) or self.head_k_dim // 2) if tie_decay_pairs else 0
        decay_width = self.head_k_dim - self.tied_pairs
        self.gk_proj = nn.Sequential(
            nn.Linear(hidden_size, gate_low_rank_dim, bias=False), nn.Linear(gate_low_rank_dim, num_kv_heads * decay_width)
        )
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False) if use_output_gate else None
        self.g_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, Hk, K]`` log decay (≤ 0) per key channel."""
        g = F.logsigmoid(self.gk_proj(x).to(compute_dtype(x.dtype))) / self.gate_logit_normalizer
        g = g.unflatten(-1, (self.num_kv_heads, -1))
        if self.tied_pairs:
            pairs = self.tied_pairs
            g = torch.cat([g[..., :pairs], g[..., :pairs], g[..., pairs:]], dim=-1)
        return g

    def forward(self, x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None):
        self.check_input(x, attention_mask, cu_seqlens, state)
        layout = RowLayout.of(*x.shape[:2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device, given=layout)
        x_in = self.position.host_input(x)
        q, k, v, conv_state = self.project_qkv(
            x_in, layout, state, (self.num_heads, self.num_kv_heads, self.num_kv_heads), (self.head_k_dim, self.head_k_dim, self.head_v_dim),
            want_state=use_cache,
        )
        q, k, position_state = self.encode_positions(
            q, k, x, x_in, attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout
        )
        g = self.log_decay(x_in)
        real = self.real_tokens(x, attention_mask)
        if real is not None:  # padded tokens neither write to nor decay the state
            k, v, g = (t * real[..., None].to(t.dtype) for t in (k, v, g))  # 0/1: exact in any dtype
        o, recurrent = gla(
            q, expand_heads(k, self.num_heads), expand_heads(v, self.num_heads), expand_heads(g, self.num_heads),
            initial_state=None if state is None else state.recurrent, output_final_state=use_cache, cu_seqlens=cu_seqlens,
        )
        gate = None if self.g_proj is None else self.g_proj(x_in).unflatten(-1, (self.num_heads, self.head_v_dim))
        out = self.o_proj(self.g_norm(o, gate).flatten(-2))
        new_state = LayerState(conv=conv_state, position=position_state, recurrent=recurrent) if use_cache else None
        return out, new_state
