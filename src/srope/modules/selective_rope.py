"""Selective RoPE: the angle generator and the rotation, as one position-encoding module.

Per step and rotation pair the phase increment is (paper §4.1, the authors' release)

    φ_t = g_t ⊙ (act(conv(W_ω x̂))_t + exp(b)),     x̂ = per-head ℓ2-normalised block input,

and q_t, k_t are rotated by ``Θ ⊙ Σ_{s≤t} φ_s`` with Θ a temperature spectrum. Gate and
bias are applied identically in training, prefill and decoding.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from srope import backend
from srope.modules.base import PositionEncoding
from srope.modules.conv import FirstDifference, ShortConvolution
from srope.modules.spectra import SPECTRA, temperature_spectrum
from srope.ops.checks import compute_dtype, is_finite_number
from srope.ops.conv import last_inputs
from srope.ops.generator.projection import normalized_head_projection
from srope.ops.layout import RowLayout
from srope.ops.rotary import selective_rope

PROJECTIONS = ("full-rank", "low-rank")
GATES = (None, "standard", "low-rank", "per-channel")


class SelectiveRoPEState(NamedTuple):
    """Per-sequence decoding state: the generator's conv inputs and the phase so far."""

    conv: torch.Tensor  # [N, Hk·R, W-1], the last W-1 projected inputs
    phase: torch.Tensor  # [N, Hk, R] float64, Φ after the last token (before temperature)


class SelectiveRoPE(PositionEncoding):
    """Input-dependent, learned rotary position encoding.

    Args:
        hidden_size: size of the block input ``x`` the angles come from.
        num_heads: phase heads Hk, the number of key heads (query heads share them in groups).
        head_dim: q/k head size D.
        rotary_dim: channels rotated, ``2R``, even and ``<= head_dim`` (default: all of D).
        projection: ``"full-rank"`` (per head, ``hidden/Hk -> R``; the paper's LM setting)
            or ``"low-rank"`` (``hidden -> rank -> Hk·R``; the authors' default).
        projection_rank: the rank of the low-rank projection (16).
        weight_norm: full-rank only: each output unit's weight has unit ℓ2 norm times a
            learned per-head gain (init 1); with the normalised input, every pre-conv
            increment is a scaled cosine (True).
        projection_gain: initial value of that gain (1.0). A larger gain spreads the angle
            steps that different tokens make at init, so that some rotation pairs start
            with steps far apart (``srope demo`` uses 8; see ``srope/lab/demo/config.py``).
        conv_size: width of the causal depthwise conv over the increments (4).
        skip_conv: replace the learned conv by the first difference ``u_t - u_{t-1}`` (False).
        conv_activation: ``"silu"`` or None, after the conv or the difference ("silu", the
            paper's best LM setting; the authors' default is None).
        gate: phase gate ``sigmoid(...)`` of x̂: ``"standard"`` (one per head, ``hidden -> Hk``),
            ``"low-rank"`` (``hidden -> gate_rank -> Hk``), ``"per-channel"`` (``hidden ->
            gate_rank -> Hk·R``; the authors' "gla") or None ("standard").
        gate_rank: rank of the low-rank and per-channel gates (16).
        bias: add a learned positive ``exp(b)`` (b init 0, one per head and pair) (False).
        spectrum: temperatures Θ: ``"rope"``, ``"rfa"``, ``"rfa-float32"`` (rfa with the
            authors' release's float32 rounding, for reproducing it) or ``"uniform"`` (see
            :mod:`srope.modules.spectra`) ("rope").
        theta: base of the rope spectrum (500000). epsilon: ε of the rfa spectra (1e-4).
        max_temperature: the largest temperature (1.0).
        learnable_temperature: learn Θ (an ``[Hk, R]`` parameter initialised from the
            spectrum); fixed spectra are recomputed from the config in float64 and are never
            quantised by a dtype cast (False).
        norm_eps: ε of the ℓ2 normalisation ``x / sqrt(Σx² + ε)`` (1e-6).
        phase_noise: in training mode only, add N(0, phase_noise²) radians to every
            token's angle step ``Θ·φ`` (per pair, independent; 0 = off, the default). A
            regulariser, not in the paper: a step error too small to cost anything at the
            training length adds up linearly beyond it, and the noise keeps the loss
            sensitive to it (``srope demo`` uses 0.1; see ``srope/lab/demo/config.py``).
    """

    needs_input = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        rotary_dim: int | None = None,
        projection: str = "full-rank",
        projection_rank: int = 16,
        weight_norm: bool = True,
        projection_gain: float = 1.0,
        conv_size: int = 4,
        skip_conv: bool = False,
        conv_activation: str | None = "silu",
        gate: str | None = "standard",
        gate_rank: int = 16,
        bias: bool = False,
        spectrum: str = "rope",
        theta: float = 500000.0,
        epsilon: float = 1e-4,
        max_temperature: float = 1.0,
        learnable_temperature: bool = False,
        norm_eps: float = 1e-6,
        phase_noise: float = 0.0,
    ):
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if num_heads < 1 or hidden_size < 1 or hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be a positive multiple of num_heads ({num_heads})")
        if head_dim < 2 or rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be even with 2 <= rotary_dim <= head_dim={head_dim}, got {rotary_dim}")
        if projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
        if gate == "none":
            gate = None
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
        if not is_finite_number(phase_noise, positive=False):
            raise ValueError(f"phase_noise must be a finite number >= 0 (radians), got {phase_noise!r}")
        if not is_finite_number(projection_gain):
            raise ValueError(f"projection_gain must be a finite number > 0, got {projection_gain!r}")
        if not is_finite_number(norm_eps):
            raise ValueError(f"norm_eps must be a finite number > 0, got {norm_eps!r}")
        if projection_gain != 1.0 and not (weight_norm and projection == "full-rank"):
            raise ValueError("projection_gain is the initial gain of the weight-normed full-rank projection; "
                             f"it needs projection='full-rank' and weight_norm=True, got {projection=!r}, {weight_norm=!r}")
        if spectrum not in SPECTRA:
            raise ValueError(f"spectrum must be one of {SPECTRA}, got {spectrum!r}")
        for name, value in (("projection_rank", projection_rank), ("gate_rank", gate_rank), ("conv_size", conv_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.pairs = rotary_dim // 2
        self.projection, self.gate_type, self.norm_eps = projection, gate, norm_eps
        self.phase_noise = float(phase_noise)
        # host_input's projection of x, until forward reads it: (x, parts), else None
        self._pending: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None
        self.projection_gain = float(projection_gain)
        self.spectrum_kind = spectrum
        self.spectrum_args = dict(theta=theta, epsilon=epsilon, max_value=max_temperature)
        self._temperatures: dict = {}
        self._first_layer_cache = None  # (key, (weight, sizes)), see _first_layers
        temperature_spectrum(spectrum, self.pairs, theta=theta, epsilon=epsilon, max_value=max_temperature)  # validates

        channels, chunk = num_heads * self.pairs, hidden_size // num_heads
        if projection == "full-rank":
            self.proj_weight = nn.Parameter(torch.empty(num_heads, chunk, self.pairs))
            self.proj_gain = nn.Parameter(torch.ones(num_heads)) if weight_norm else None
        else:
            self.proj = nn.Sequential(nn.Linear(hidden_size, projection_rank, bias=False), nn.Linear(projection_rank, channels, bias=False))
        self.weight_norm = weight_norm and projection == "full-rank"
        if skip_conv:
            self.conv = FirstDifference(channels, activation=conv_activation)
        else:
            self.conv = ShortConvolution(channels, conv_size, activation=conv_activation)
        gate_out = channels if gate == "per-channel" else num_heads
        if gate == "standard":
            self.gate = nn.Linear(hidden_size, num_heads)
        elif gate is not None:
            self.gate = nn.Sequential(nn.Linear(hidden_size, gate_rank, bias=False), nn.Linear(gate_rank, gate_out))
        else:
            self.gate = None
        self.bias = nn.Parameter(torch.zeros(num_heads, self.pairs)) if bias else None
        self.learned_temperature = nn.Parameter(torch.empty(num_heads, self.pairs)) if learnable_temperature else None
        for param in (self.bias, self.learned_temperature, getattr(self, "proj_gain", None)):
            if param is not None:
                param._no_weight_decay = True
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re)initialise every parameter: PyTorch's defaults for the linear maps and the conv,
        Kaiming-uniform per head (fan-in hidden/Hk) for the full-rank projection, gain
        ``projection_gain``, bias 0, a learnable temperature at its spectrum."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.projection == "full-rank":
            for head in range(self.num_heads):
                nn.init.kaiming_uniform_(self.proj_weight[head].T, a=math.sqrt(5))
            if self.proj_gain is not None:
                nn.init.constant_(self.proj_gain, self.projection_gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        if self.learned_temperature is not None:
            self.learned_temperature.copy_(self.spectrum().expand(self.num_heads, -1))

    def spectrum(self) -> torch.Tensor:
        """The configured fixed spectrum, ``[R]`` float64, computed from the config on every call
        (no buffer: a dtype cast or a meta-device construction can never reach it)."""
        return temperature_spectrum(self.spectrum_kind, self.pairs, **self.spectrum_args)

    def temperature(self, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """Θ as ``[R]`` (fixed spectrum) or ``[Hk, R]`` (learnable) in ``dtype``."""
        if self.learned_temperature is not None:
            return self.learned_temperature.to(dtype)
        key = (torch.device(device) if device is not None else torch.device("cpu"), dtype)
        if key not in self._temperatures:  # a plain dict: .to()/.half() never reach it
            # a normal tensor even when first asked for under inference_mode: training saves it for backward
            with torch.inference_mode(False):
                self._temperatures[key] = self.spectrum().to(device=key[0], dtype=dtype)
        return self._temperatures[key]

    def projection_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The ω map's first layer per head, ``[Hk, hidden/Hk, R]`` (full-rank, weight-normed
        when configured) or ``[Hk, hidden/Hk, rank]`` (low-rank: this head's share)."""
        if self.projection == "low-rank":
            return _per_head(self.proj[0].weight, self.num_heads).to(dtype)
        weight = self.proj_weight.to(dtype)
        if self.weight_norm:
            weight = self.proj_gain.to(dtype)[:, None, None] * weight / weight.norm(dim=1, keepdim=True)
        return weight

    def _first_layers(self, dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        """Every first layer acting on x̂ as one per-head weight ``[Hk, hidden/Hk, M]`` and
        the split sizes (ω map, then the gate's). Without autograd (inference, decoding) it
        is cached until a parameter changes (tracked by the parameters' version counters,
        which in-place updates such as optimiser steps and ``load_state_dict`` advance, and
        their storage, dtype and device, which ``.to()`` changes)."""
        key = None
        if not torch.is_grad_enabled():
            key = (dtype, backend.get(), tuple((id(p), p._version, p.data_ptr(), p.dtype, p.device) for p in self.parameters()))
            if self._first_layer_cache is not None and self._first_layer_cache[0] == key:
                return self._first_layer_cache[1]
        if self._fuses_weights(dtype):
            from srope.ops.generator.weights import head_weights

            gate = None if self.gate is None else self._gate_first_layer().weight.to(dtype)
            result = (head_weights(self.proj_weight.to(dtype), self.proj_gain.to(dtype), gate), self._first_layer_sizes())
        else:
            blocks = [self.projection_weight(dtype)]
            if self.gate is not None:
                blocks.append(_per_head(self._gate_first_layer().weight, self.num_heads).to(dtype))
            result = (torch.cat(blocks, dim=-1), self._first_layer_sizes())
        self._first_layer_cache = None if key is None else (key, result)
        return result

    def _gate_first_layer(self) -> nn.Linear:
        return self.gate if self.gate_type == "standard" else self.gate[0]

    def _first_layer_sizes(self) -> list[int]:
        """Per head, the output widths of the first layers: the ω map's, then the gate's."""
        sizes = [self.pairs if self.projection == "full-rank" else self.proj[0].out_features]
        return sizes + ([self._gate_first_layer().out_features] if self.gate is not None else [])

    def adapted(self) -> bool:
        """Whether a linear map of the generator (the low-rank ω map's layers, the gate's) is
        no plain ``nn.Linear`` but a wrapper such as a PEFT LoRA layer. Such maps are then
        called as modules (:meth:`_module_inputs`), since the fused routes read their
        ``.weight`` and would silently skip the wrapper."""
        maps = [] if self.projection == "full-rank" else list(self.proj)
        if self.gate is not None:
            maps += list(self.gate) if isinstance(self.gate, nn.Sequential) else [self.gate]
        return any(type(layer) is not nn.Linear for layer in maps)

    def _module_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`generator_inputs` with every ``nn.Module`` map called on x̂ (built here), for
        adapted maps. A module computes in its own parameters' dtype: x̂ is cast to it and
        the result back to max(float32, x.dtype)."""
        dtype = compute_dtype(x.dtype)
        chunks = x.unflatten(-1, (self.num_heads, -1)).to(dtype)
        x_hat = chunks * torch.rsqrt(chunks.square().sum(-1, keepdim=True) + self.norm_eps)
        if self.projection == "full-rank":
            u = torch.einsum("...hi,hir->...hr", x_hat, self.projection_weight(dtype)).flatten(-2)
        else:
            u = _call(self.proj, x_hat.flatten(-2), dtype)
        gate = None if self.gate is None else torch.sigmoid(_call(self.gate, x_hat.flatten(-2), dtype))
        return u, gate

    def _fuses_weights(self, dtype: torch.dtype) -> bool:
        """Whether the weight-normed first layers come from the fused Triton kernel
        (:mod:`srope.ops.generator.weights`; where :mod:`srope.backend` runs srope's kernels)."""
        return self.weight_norm and dtype == torch.float32 and backend.kernels(self.proj_weight)

    def _fuses_gate(self, t: torch.Tensor) -> bool:
        """Whether the standard gate after the conv takes the fused Triton kernel
        (:mod:`srope.ops.generator.gate`) for this float32 tensor (see :mod:`srope.backend`);
        the projection then writes the conv's input and the gate's shares as two tensors."""
        return self.projection == "full-rank" and self.gate_type == "standard" and t.dtype == torch.float32 and backend.kernels(t)

    def project(self, x: torch.Tensor, grad_dtype: torch.dtype | None = None, x_low: torch.Tensor | None = None, cast: bool = False):
        """Every first layer acting on x̂ (x ℓ2-normalised per head chunk), in one
        :func:`normalized_head_projection` (x̂ is never built), as per-head parts
        ``[B, T, Hk, ·]`` in max(float32, x.dtype): the ω map's, then (with a gate) the gate's
        first layer's (:meth:`_first_layer_sizes`). ``grad_dtype`` is the dtype of its backward
        products (float32 inputs only). ``x_low``: x rounded to ``grad_dtype`` (the host's copy,
        :meth:`shared_projection`), which the backward keeps instead of x. ``cast``: also x
        rounded to ``grad_dtype`` (float32 x), written in the same pass over x, returned last
        (:meth:`host_input`)."""
        dtype = compute_dtype(x.dtype)
        weight, sizes = self._first_layers(dtype)
        chunks = x.unflatten(-1, (self.num_heads, -1)).to(dtype)
        grad_dtype = grad_dtype if dtype == torch.float32 else None
        fused = self._fuses_gate(chunks)
        x_low = None if x_low is None else x_low.unflatten(-1, (self.num_heads, -1))
        y = normalized_head_projection(chunks, weight, self.norm_eps, grad_dtype, cast=grad_dtype if cast else None,
                                       split=sizes[0] if fused else None, x_low=x_low)
        y, x_cast = y if cast else (y, None)
        parts = tuple(y) if fused else y.split(sizes, dim=-1)
        return parts if not cast else (*parts, x_cast.flatten(-2))

    def generator_inputs(
        self, x: torch.Tensor, grad_dtype: torch.dtype | None = None, projected: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """From the block input ``x [B, T, hidden]``: the projected increments before the
        conv, ``u = W_ω x̂`` ``[B, T, Hk·R]``, and the phase gate ``sigmoid(...)`` of x̂
        (``[B, T, Hk]``, per-channel ``[B, T, Hk·R]``; None without a gate), in
        max(float32, x.dtype), from :meth:`project` (or its parts ``projected``)."""
        if projected is None and self.adapted():
            return self._module_inputs(x)
        dtype = compute_dtype(x.dtype)
        parts = self.project(x, grad_dtype) if projected is None else projected
        # Maps of the whole (flattened) x̂ are the sums of their per-head shares.
        u = parts[0].flatten(-2) if self.projection == "full-rank" else _linear(self.proj[1], parts[0].sum(-2))
        if self.gate is None:
            return u, None
        gate = parts[1].sum(-2)
        gate = gate + self.gate.bias.to(dtype) if self.gate_type == "standard" else _linear(self.gate[1], gate)
        return u, torch.sigmoid(gate)

    def phase_increments(
        self, x: torch.Tensor, layout: RowLayout, conv_state: torch.Tensor | None = None,
        projected: tuple[torch.Tensor, ...] | None = None, want_state: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """φ ``[B, T, Hk, R]`` from the block input, and the conv's final state (may be None
        without ``want_state``).

        Computed in max(float32, x.dtype) with autocast off: the increments are summed over
        the whole sequence, so bf16 rounding of each would accumulate into the angles. Under
        autocast the backward's two large products (the ω map's input and weight gradients)
        run in autocast's dtype, as autocast runs the rest of the backward. ``projected``:
        :meth:`project`'s parts for x, when :meth:`shared_projection` ran it."""
        device = x.device.type
        grad_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        with torch.autocast(device, enabled=False):
            parts = projected if projected is not None or self.adapted() else self.project(x, grad_dtype)
            if parts is not None and self._fuses_gate(parts[0]):
                from srope.ops.generator.gate import apply_head_gate, conv_head_gate

                u = parts[0].flatten(-2)
                e = None if self.bias is None else torch.exp(self.bias.to(u.dtype))
                gate_bias, shares = self.gate.bias.to(u.dtype), parts[1].flatten(0, -3)
                if layout.identity and conv_state is None:  # whole rows from their start: the conv in the gate's kernels
                    weight = self.conv.kernel(u.device).to(dtype=u.dtype)
                    conv_bias = None if self.conv.bias is None else self.conv.bias.to(u.dtype)
                    phi = conv_head_gate(u, weight, conv_bias, shares, gate_bias, e, self.conv.activation)
                    conv_state = last_inputs(u, layout, self.conv.kernel_size, None) if want_state else None
                else:
                    # (the conv's activation in the gate's kernel: fla's backward of its own
                    # activation recomputes the conv)
                    c, conv_state = self.conv(u, layout, conv_state, activate=False, want_state=want_state)
                    phi = apply_head_gate(c.flatten(0, -2), shares, gate_bias, e, self.conv.activation)
                phi = phi.view(*u.shape[:-1], self.num_heads, self.pairs)
            else:
                u, gate = self.generator_inputs(x, grad_dtype, parts)
                phi, conv_state = self.conv(u, layout, conv_state, want_state=want_state)
                phi = phi.unflatten(-1, (self.num_heads, self.pairs))
                if self.bias is not None:
                    phi = phi + torch.exp(self.bias.to(phi.dtype))
                if gate is not None:
                    phi = phi * (gate.unflatten(-1, (self.num_heads, self.pairs)) if self.gate_type == "per-channel" else gate[..., None])
            if self.training and self.phase_noise > 0:
                theta = self.temperature(phi.dtype, phi.device).detach().abs()
                scale = self.phase_noise / theta.clamp_min(torch.finfo(phi.dtype).tiny)
                phi = phi + scale * torch.randn_like(phi)
        return phi, conv_state

    def decode_step(self, q, k, x, state: SelectiveRoPEState):
        """One token per sequence (q/k ``[N,1,..]``, x ``[N,1,hidden]``) through the fused
        Triton step: the generator's inputs from x (full-rank ω with a standard or no gate),
        conv window, activation, bias, gate, phase and rotation in one launch; other
        configurations compute the inputs with torch first."""
        from srope.ops.rotary.decode import selective_rope_decode_step

        with torch.autocast(x.device.type, enabled=False):
            if self.projection == "full-rank" and self.gate_type in (None, "standard"):
                weight, _ = self._first_layers(compute_dtype(x.dtype))
                gate_bias = None if self.gate is None else self.gate.bias.to(weight.dtype)
                inputs = dict(x=x, first_layers=weight, gate_bias=gate_bias, eps=self.norm_eps)
                u, dtype = None, weight.dtype
            else:
                u, gate = self.generator_inputs(x)
                inputs, dtype = dict(gate=gate), u.dtype
        temperature = self.temperature(compute_dtype(q.dtype, dtype), q.device)
        q, k, conv, phase = selective_rope_decode_step(
            q, k, u, state.conv, self.conv.kernel(q.device), state.phase, temperature,
            conv_bias=self.conv.bias, activation=self.conv.activation, bias=self.bias, **inputs,
        )
        return q, k, SelectiveRoPEState(conv, phase)

    def forward(self, q, k, x=None, *, attention_mask=None, cu_seqlens=None, state=None, use_cache=False, layout=None, x_cast=None):
        """q and k rotated by the phases of x (see :meth:`phase_increments`), and the new state.

        A one-token decoding step on CUDA without autograd takes :meth:`decode_step`, whose
        fused kernel computes the generator and the rotation at once."""
        count = self.check_call(q, k, x, attention_mask, cu_seqlens, x_cast)
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must have hidden size {self.hidden_size}, got {x.shape[-1]}")
        if k.shape[2] != self.num_heads or q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(
                f"k must be [B, T, {self.num_heads}, {self.head_dim}] and q [B, T, H, {self.head_dim}] for this SelectiveRoPE "
                f"(num_heads={self.num_heads}, head_dim={self.head_dim}), got q {tuple(q.shape)}, k {tuple(k.shape)}"
            )
        conv_state = offset = None
        if state is not None:
            width = (count, self.num_heads * self.pairs, self.conv.state_width)
            self.check_state(state, SelectiveRoPEState, {"conv": width, "phase": (count, self.num_heads, self.pairs)})
            if (
                x.shape[1] == 1 and cu_seqlens is None and attention_mask is None
                and not torch.is_grad_enabled() and backend.kernels(x) and not self.adapted()
            ):
                q, k, new_state = self.decode_step(q, k, x, state)
                return q, k, new_state if use_cache else None
            conv_state, offset = state.conv, state.phase
        layout = RowLayout.of(*x.shape[:2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device, given=layout)
        phi, conv_state = self.phase_increments(x, layout, conv_state, self.shared_projection(x, x_cast), want_state=use_cache)
        if attention_mask is not None:
            phi = phi * (attention_mask != 0)[..., None, None]
        temperature = self.temperature(compute_dtype(q.dtype, phi.dtype), q.device)
        q, k, phase = selective_rope(q, k, phi, temperature, offset=offset, cu_seqlens=cu_seqlens, output_final_phase=use_cache)
        return q, k, SelectiveRoPEState(conv_state, phase) if use_cache else None

    def host_input(self, x: torch.Tensor) -> torch.Tensor:
        """The host's copy of x under autocast with gradients, written by the generator's
        projection in its one pass over x (its backward adds the host maps' gradient into dx
        in the same kernel), where a separate cast would read and write x again, forward and
        backward (what that costs: docs/kernels.md). The projection is kept for this
        call's :meth:`forward` with the same x. Elsewhere (no autocast, no gradients, adapted
        maps, ``torch.compile`` tracing) the base class's cast."""
        self._pending = None
        device = x.device.type
        if (
            not (torch.is_grad_enabled() and x.dtype == torch.float32 and torch.is_autocast_enabled(device))
            or torch.get_autocast_dtype(device) not in (torch.float16, torch.bfloat16)
            or self.adapted() or torch.compiler.is_compiling()
        ):
            return super().host_input(x)
        with torch.autocast(device, enabled=False):
            *parts, x_cast = self.project(x, torch.get_autocast_dtype(device), cast=True)
        self._pending = (x, tuple(parts))
        return x_cast

    def shared_projection(self, x: torch.Tensor, x_cast: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
        """Under autocast with gradients, a float32 x and the host's copy ``x_cast`` in autocast's
        dtype: :meth:`project`'s parts, whose backward keeps that copy instead of x (one copy of
        the block input held for the backward, not two); else None (the generator projects x itself)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is x:
            return pending[1]
        device = x.device.type
        if x_cast is None or not (torch.is_grad_enabled() and x.dtype == torch.float32 and torch.is_autocast_enabled(device)):
            return None
        grad_dtype = torch.get_autocast_dtype(device)
        if x_cast.dtype != grad_dtype or self.adapted():
            return None
        with torch.autocast(device, enabled=False):
            return self.project(x, grad_dtype, x_low=x_cast)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"pairs={self.pairs}, projection={self.projection}, gate={self.gate_type}, "
            f"bias={self.bias is not None}, spectrum={self.spectrum_kind} {self.spectrum_args}"
            + (f", phase_noise={self.phase_noise}" if self.phase_noise else "")
        )


def _per_head(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A ``Linear`` weight ``[out, hidden]`` as per-head shares ``[Hk, hidden/Hk, out]``."""
    return weight.unflatten(1, (heads, -1)).permute(1, 2, 0)


def _call(module: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``module(x)`` in the dtype of the module's (first floating-point) parameters, returned in ``dtype``."""
    own = next((p.dtype for p in module.parameters() if p.is_floating_point()), dtype)
    return module(x.to(own)).to(dtype)


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A ``Linear`` or a ``Sequential`` of them, computed in ``x``'s dtype whatever the
    parameters' dtype (a bf16-cast model still makes float32 phases)."""
    for layer in module if isinstance(module, nn.Sequential) else (module,):
        bias = None if layer.bias is None else layer.bias.to(x.dtype)
        x = nn.functional.linear(x, layer.weight.to(x.dtype), bias)
    return x
