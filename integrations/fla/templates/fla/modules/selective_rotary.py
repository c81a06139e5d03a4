# @header

"""Selective RoPE as a module: the angle generator (from the hidden states x) and the rotation.

Per token and rotation pair the phase increment is

    phi_t = gate_t * (act(conv(W x_hat))_t + exp(b)),    x_hat = x l2-normalised per head chunk,

and q_t, k_t are rotated by ``temperature * sum_{s <= t} phi_s`` (`fla.ops.selective_rope`). Unlike `RotaryEmbedding`,
the angles depend on the input, so the module takes the layer's hidden states x besides q and k, and it carries a state
across calls: the short convolution's window and the phase so far.
"""

import math

import torch
import torch.nn as nn

from fla.modules.causal_conv1d import ShortConvolution
from fla.ops.selective_rope import chunk_selective_rope, fused_recurrent_selective_rope
from fla.ops.selective_rope.generator import _kernels, conv_head_gate, normalized_head_projection

PROJECTIONS = ('full-rank', 'low-rank')
GATES = (None, 'standard', 'low-rank', 'per-channel')

# @srope srope.modules.spectra SPECTRA temperature_spectrum


class SelectiveRotaryEmbedding(nn.Module):
    r"""
    Selective RoPE (Movahedi et al., ICLR 2026): an input-dependent rotary embedding.

    Args:
        hidden_size (int):
            size of the hidden states x the angles come from.
        num_heads (int):
            number of key heads HK (query heads share them in groups).
        head_dim (int):
            q/k head size D.
        rotary_dim (Optional[int]):
            channels rotated, even, `<= head_dim`. Default: `head_dim`.
        projection (str):
            `'full-rank'` (per head, `hidden_size / HK -> R`) or `'low-rank'` (`hidden_size -> rank -> HK * R`).
            Default: `'full-rank'`.
        projection_rank (int):
            rank of the low-rank projection. Default: 16.
        weight_norm (bool):
            full-rank only: unit-norm weight per output times a learned per-head gain. Default: `True`.
        conv_size (int):
            width of the causal depthwise convolution over the increments. Default: 4.
        conv_activation (Optional[str]):
            `'silu'` or `None`. Default: `'silu'`.
        gate (Optional[str]):
            phase gate `sigmoid(...)` of x_hat: `'standard'` (`hidden_size -> HK`), `'low-rank'`, `'per-channel'` or
            `None`. Default: `'standard'`.
        gate_rank (int):
            rank of the low-rank and per-channel gates. Default: 16.
        bias (bool):
            add a learned positive `exp(b)` per head and pair. Default: `False`.
        spectrum (str):
            temperatures: `'rope'`, `'rfa'`, `'rfa-float32'` (rfa as the authors' code rounds it in float32, for
            reproducing its runs) or `'uniform'`. Default: `'rope'`.
        theta (float):
            base of the rope spectrum. Default: 500000.
        epsilon (float):
            epsilon of the rfa spectra. Default: 1e-4.
        max_temperature (float):
            the largest temperature. Default: 1.0.
        norm_eps (float):
            epsilon of the l2 normalisation. Default: 1e-6.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        rotary_dim: int | None = None,
        projection: str = 'full-rank',
        projection_rank: int = 16,
        weight_norm: bool = True,
        conv_size: int = 4,
        conv_activation: str | None = 'silu',
        gate: str | None = 'standard',
        gate_rank: int = 16,
        bias: bool = False,
        spectrum: str = 'rope',
        theta: float = 500000.0,
        epsilon: float = 1e-4,
        max_temperature: float = 1.0,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if num_heads < 1 or hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be a positive multiple of num_heads ({num_heads})")
        if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be even with 2 <= rotary_dim <= head_dim={head_dim}, got {rotary_dim}")
        if projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
        if conv_activation not in (None, 'silu'):
            raise ValueError(f"conv_activation must be 'silu' or None, got {conv_activation!r}")
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.pairs = rotary_dim // 2
        self.projection, self.gate_type, self.norm_eps = projection, gate, norm_eps
        self.weight_norm = weight_norm and projection == 'full-rank'
        # recomputed from these in float64 on every call: a bf16 cast of the model never quantises the spectrum
        self.spectrum_args = dict(kind=spectrum, pairs=self.pairs, theta=theta, epsilon=epsilon, max_value=max_temperature)
        temperature_spectrum(**self.spectrum_args)  # validates
        # per (device, dtype), in a plain dict that .to() / .half() never reach: a copy from the CPU on every call
        # would wait for the GPU to drain its queue
        self._temperatures = {}

        channels = num_heads * self.pairs
        if projection == 'full-rank':
            self.proj_weight = nn.Parameter(torch.empty(num_heads, hidden_size // num_heads, self.pairs))
            self.proj_gain = nn.Parameter(torch.ones(num_heads)) if self.weight_norm else None
        else:
            self.proj = nn.Sequential(nn.Linear(hidden_size, projection_rank, bias=False),
                                      nn.Linear(projection_rank, channels, bias=False))
        self.conv = ShortConvolution(hidden_size=channels, kernel_size=conv_size, bias=False, activation=conv_activation)
        if gate == 'standard':
            self.gate = nn.Linear(hidden_size, num_heads)
        elif gate is not None:
            out = channels if gate == 'per-channel' else num_heads
            self.gate = nn.Sequential(nn.Linear(hidden_size, gate_rank, bias=False), nn.Linear(gate_rank, out))
        else:
            self.gate = None
        self.bias = nn.Parameter(torch.zeros(num_heads, self.pairs)) if bias else None
        for param in (self.bias, getattr(self, 'proj_gain', None)):
            if param is not None:
                param._no_weight_decay = True
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        if self.projection == 'full-rank':
            for head in range(self.num_heads):
                nn.init.kaiming_uniform_(self.proj_weight[head].T, a=math.sqrt(5))
            if self.proj_gain is not None:
                nn.init.ones_(self.proj_gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, pairs={self.pairs}, "
                f"projection={self.projection}, gate={self.gate_type}, bias={self.bias is not None}, {self.spectrum_args}")

    def temperature(self, device, dtype=torch.float32) -> torch.Tensor:
        key = (torch.device(device), dtype)
        if key not in self._temperatures:
            with torch.inference_mode(False):  # a normal tensor even under inference_mode: training saves it for backward
                self._temperatures[key] = temperature_spectrum(**self.spectrum_args).to(device=key[0], dtype=dtype)
        return self._temperatures[key]

    def first_layers(self) -> tuple[torch.Tensor, list[int]]:
        """Every linear map acting on x_hat as one per-head float32 weight `[HK, hidden_size / HK, M]`, and the widths of
        its parts: the projection's (R, or the low-rank projection's first layer), then the gate's first layer."""
        if self.projection == 'full-rank':
            weight = self.proj_weight.float()
            if self.weight_norm:
                weight = self.proj_gain.float()[:, None, None] * weight / weight.norm(dim=1, keepdim=True)
        else:
            weight = _per_head(self.proj[0].weight, self.num_heads)
        blocks = [weight]
        if self.gate is not None:
            blocks.append(_per_head((self.gate if self.gate_type == 'standard' else self.gate[0]).weight, self.num_heads))
        return torch.cat(blocks, -1), [block.shape[-1] for block in blocks]

    def increments(self, x, conv_state=None, output_final_state=False, cu_seqlens=None):
        """phi `[B, T, HK, R]` in float32 (autocast off: the increments are summed over the whole sequence) and the
        convolution's new window."""
        device = x.device.type
        autocast = torch.is_autocast_enabled(device)
        # under autocast the projection's backward runs its products in autocast's dtype, as autocast runs the others
        grad_dtype = torch.get_autocast_dtype(device) if autocast and torch.is_grad_enabled() else None
        with torch.autocast(device, enabled=False):
            chunks = x.float().unflatten(-1, (self.num_heads, -1))
            weight, sizes = self.first_layers()
            # the convolution, its activation, the bias and the standard gate in one fused kernel, for whole rows
            fused = (self.projection == 'full-rank' and self.gate_type == 'standard' and _kernels(chunks)
                     and cu_seqlens is None and conv_state is None and not output_final_state)
            # x_hat = chunks / |chunks| is never built: every map acting on it is linear, so one product per head takes
            # them all from the raw chunks, scaled by the inverse norm; a map of the whole x_hat is the sum of its
            # per-head shares. With a gradient under autocast the backward keeps x in autocast's dtype (`cast`).
            parts = normalized_head_projection(chunks, weight, self.norm_eps, grad_dtype, cast=grad_dtype,
                                               split=sizes[0] if fused else None)
            parts = parts[0] if grad_dtype is not None else parts
            parts = parts if fused else parts.split(sizes, -1)
            u = parts[0].flatten(-2) if self.projection == 'full-rank' else _linear(self.proj[1], parts[0].sum(-2))
            if fused:
                e = None if self.bias is None else torch.exp(self.bias.float())
                taps = self.conv.weight.float().squeeze(1)  # [HK * R, K], the current token last
                phi = conv_head_gate(u, taps, None, parts[1].flatten(0, -3), self.gate.bias.float(), e, self.conv.activation)
                return phi.view(*u.shape[:-1], self.num_heads, self.pairs), None
            phi, conv_state = self.conv(x=u, cache=conv_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
            phi = phi.float().unflatten(-1, (self.num_heads, self.pairs))
            if self.bias is not None:
                phi = phi + torch.exp(self.bias.float())
            if self.gate is not None:
                shares = parts[1].sum(-2)
                logits = shares + self.gate.bias.float() if self.gate_type == 'standard' else _linear(self.gate[1], shares)
                gate = torch.sigmoid(logits)
                per_channel = self.gate_type == 'per-channel'
                phi = phi * (gate.unflatten(-1, (self.num_heads, self.pairs)) if per_channel else gate[..., None])
        return phi, conv_state

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        x: torch.Tensor,
        cu_seqlens: torch.LongTensor | None = None,
        initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
        output_final_state: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        r"""
        Args:
            q (torch.Tensor): `[B, T, H, D]`; k (torch.Tensor): `[B, T, HK, D]`.
            x (torch.Tensor): the hidden states `[B, T, hidden_size]` the angles come from (unpadded with `cu_seqlens`).
            cu_seqlens (torch.LongTensor): `[N+1]` packed sequence boundaries (B == 1). Default: `None`.
            initial_state (tuple): `(conv_state [N, HK * R, conv_size], phase [N, HK, R] float64)` from a previous call.
            output_final_state (bool): return the new state. Default: `False`.

        Returns:
            q, k rotated and the new state (or `None`).
        """
        if x.shape[:2] != q.shape[:2] or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must be [B, T, {self.hidden_size}] with q's B, T; got x {tuple(x.shape)}, q {tuple(q.shape)}")
        if k.shape[2] != self.num_heads or k.shape[3] != self.head_dim:
            raise ValueError(f"k must be [B, T, {self.num_heads}, {self.head_dim}], got {tuple(k.shape)}")
        conv_state, phase = (None, None) if initial_state is None else initial_state
        phi, conv_state = self.increments(x, conv_state, output_final_state, cu_seqlens)
        temperature = self.temperature(q.device, torch.float64 if q.dtype == torch.float64 else torch.float32)
        if phase is not None and not torch.is_grad_enabled():
            q, k, phase = fused_recurrent_selective_rope(q, k, phi, temperature, phase, output_final_state, cu_seqlens)
        else:
            q, k, phase = chunk_selective_rope(q, k, phi, temperature, phase, output_final_state, cu_seqlens)
        return q, k, (conv_state, phase) if output_final_state else None


def _per_head(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A map of the whole x_hat, `[out, hidden_size]`, as per-head float32 shares `[heads, hidden_size / heads, out]`."""
    return weight.float().t().unflatten(0, (heads, -1))


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A `Linear` or a `Sequential` of them in x's dtype, whatever the parameters' dtype (bf16 models keep float32 phases)."""
    for layer in module if isinstance(module, nn.Sequential) else (module,):
        x = nn.functional.linear(x, layer.weight.to(x.dtype), None if layer.bias is None else layer.bias.to(x.dtype))
    return x
