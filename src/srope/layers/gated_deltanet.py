"""Gated DeltaNet (Yang et al., 2025) and DeltaNet, with a pluggable position encoding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from srope.layers.common import GatedRMSNorm, LayerState, MixerLayer, QKVConvolutions
from srope.ops.checks import compute_dtype
from srope.ops.layout import RowLayout
from srope.ops.mixers import gated_delta_rule


class GatedDeltaNet(MixerLayer):
    """``S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ`` on ℓ2-normalised, rotated q and k.

    The rotation comes before the ℓ2 normalisation, which it commutes with. The decay
    ``α_t = exp(−exp(A)·softplus(a_t + dt_bias))`` is a scalar per head, so it commutes with
    the rotation exactly.

    Args:
        hidden_size, num_heads, head_dim (q/k head size), expand_v (value head = head_dim·expand_v).
        use_short_conv, conv_size: SiLU short convs on q, k, v (SiLU alone without them).
        use_output_gate: ``rmsnorm(o) · swish(g)`` output (else plain RMSNorm).
        use_forget_gate: False gives DeltaNet (no decay).
        allow_neg_eigval: β ∈ (0, 2) instead of (0, 1) (negative eigenvalues, for state tracking).
        position: the position-encoding config.
    """

    @classmethod
    def from_config(cls, config) -> "GatedDeltaNet":
        """The layer an :class:`srope.models.SRopeConfig` describes (its ``position`` included)."""
        return cls(
            hidden_size=config.hidden_size, num_heads=config.num_heads, head_dim=config.key_geometry()[2], expand_v=config.expand_v,
            use_short_conv=config.use_short_conv, conv_size=config.conv_size, use_output_gate=config.use_output_gate,
            use_forget_gate=config.use_forget_gate, allow_neg_eigval=config.allow_neg_eigval, norm_eps=config.norm_eps, position=config.position,
        )

    def __init__(
        self,
        hidden_size: int = 1024,
        num_heads: int = 8,
        head_dim: int = 128,
        expand_v: float = 1.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        use_output_gate: bool = True,
        use_forget_gate: bool = True,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-5,
        position=None,
    ):
        value_head = int(head_dim * expand_v)
        if num_heads < 1 or head_dim < 1 or value_head < 1:
            raise ValueError(f"num_heads, head_dim and head_dim·expand_v must be positive, got {num_heads}, {head_dim}, {value_head}")
        super().__init__(hidden_size, position, key_heads=num_heads, head_dim=head_dim)
        self.num_heads, self.head_k_dim, self.head_v_dim = num_heads, head_dim, value_head
        self.allow_neg_eigval = allow_neg_eigval
        key_dim, value_dim = num_heads * head_dim, num_heads * value_head
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.convs = QKVConvolutions((key_dim, key_dim, value_dim), conv_size) if use_short_conv else None
        if use_forget_gate:
            self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)
            self.A_log = nn.Parameter(torch.empty(num_heads))
            self.dt_bias = nn.Parameter(torch.empty(num_heads))
            self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True
        else:
            self.a_proj = self.A_log = self.dt_bias = None
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False) if use_output_gate else None
        self.g_norm = GatedRMSNorm(value_head, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)
        self.reset_decay()

    @torch.no_grad()
    def reset_decay(self) -> None:
        """fla's initialisation: A ~ U(0, 16), dt log-uniform in [1e-3, 0.1] (floored at 1e-4)."""
        if self.A_log is None:
            return
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0, 16).log())
        dt = torch.exp(torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def forward(self, x, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None):
        self.check_input(x, attention_mask, cu_seqlens, state)
        layout = RowLayout.of(*x.shape[:2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device, given=layout)
        x_in = self.position.host_input(x)
        q, k, v, conv_state = self.project_qkv(
            x_in, layout, state, (self.num_heads,) * 3, (self.head_k_dim, self.head_k_dim, self.head_v_dim), activation=F.silu,
            want_state=use_cache,
        )
        q, k, position_state = self.encode_positions(
            q, k, x, x_in, attention_mask=attention_mask, cu_seqlens=cu_seqlens, state=state, use_cache=use_cache, layout=layout
        )
        beta = torch.sigmoid(self.b_proj(x_in).to(compute_dtype(x.dtype)))
        if self.allow_neg_eigval:
            beta = 2 * beta
        log_decay = None
        if self.A_log is not None:
            log_decay = -self.A_log.to(beta.dtype).exp() * F.softplus(self.a_proj(x_in).to(beta.dtype) + self.dt_bias.to(beta.dtype))
        real = self.real_tokens(x, attention_mask)
        if real is not None:  # padded tokens neither write to nor decay the state
            beta = beta * real.to(beta.dtype)
            log_decay = None if log_decay is None else log_decay * real.to(beta.dtype)
        o, recurrent = gated_delta_rule(
            q, k, v, beta, log_decay, qk_l2norm=True,
            initial_state=None if state is None else state.recurrent, output_final_state=use_cache, cu_seqlens=cu_seqlens,
        )
        gate = None if self.g_proj is None else self.g_proj(x_in).unflatten(-1, (self.num_heads, self.head_v_dim))
        out = self.o_proj(self.g_norm(o, gate).flatten(-2))
        new_state = LayerState(conv=conv_state, position=position_state, recurrent=recurrent) if use_cache else None
        return out, new_state
