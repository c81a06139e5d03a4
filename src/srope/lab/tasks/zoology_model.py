"""Zoology's language model (Arora et al. 2024), the architecture of its MQAR experiments,
with srope's GLA layer (and any position encoding) as the attention mixer.

Read from Zoology as vendored in the authors' release (``synthetic_tasks/zoology/src/zoology``,
commit d12e825); ``docs/release-presets.md`` cites the lines:

- ``model.py`` ``TransformerBlock``: ``residual += dropout(h)``; ``h = mixer(LayerNorm(residual))``;
  ``residual += dropout(h)``; ``h = state_mixer(LayerNorm(residual))``. The first block's first
  dropout is the embedding dropout (0.1), the others the residual dropout (0). With the state
  mixer ``torch.nn.Identity`` (the MQAR configs) a block therefore adds ``LayerNorm(residual)``
  to the stream: Zoology's "no MLP" is not "the mixer alone".
- ``LMBackbone``: token embedding (no position embedding when ``max_position_embeddings=0``),
  the blocks, ``residual += dropout(h)``, a final LayerNorm; ``LanguageModel`` adds a bias-free
  head tied to the embedding.
- ``mixers/hybrid.py``: layer ``i`` takes ``configs[i % len(configs)]``, so ``add_gla``'s
  ``[BaseConv, GLA]`` with 2 layers is one BaseConv layer followed by one GLA layer.
- ``mixers/base_conv.py``: ``y = conv(u) * Linear(u) + u`` with a depthwise causal
  ``nn.Conv1d`` of width 3 (bias on; ``mixers/convolution.py`` ``ShortConvolution``).
- ``_init_weights``: every ``nn.Linear`` (the GLA's included) N(0, 0.02) with zero bias, every
  ``nn.Embedding`` N(0, 0.02); convolutions keep PyTorch's initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import nn

from srope.layers import GatedLinearAttention

SEQUENCE_MIXERS = ("base_conv", "gla")


@dataclass
class ZoologyConfig:
    """The model half of a Zoology ``ModelConfig`` (``config.py``) plus the GLA mixer's options
    (fla's ``GatedLinearAttention`` defaults, which Zoology's ``add_gla`` leaves alone but for
    ``num_heads=2`` and ``use_short_conv=False``)."""

    vocab_size: int = 8192
    hidden_size: int = 128
    num_hidden_layers: int = 2
    layers: tuple[str, ...] = ("base_conv", "gla")  # Hybrid's configs, taken in turn
    embed_dropout: float = 0.1
    resid_dropout: float = 0.0
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    conv_kernel_size: int = 3
    num_heads: int = 2
    expand_k: float = 0.5
    expand_v: float = 1.0
    use_short_conv: bool = False
    conv_size: int = 4
    use_output_gate: bool = True
    gate_logit_normalizer: float = 16.0
    gate_low_rank_dim: int = 16
    norm_eps: float = 1e-5

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ZoologyConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Zoology model option(s) {unknown}; allowed: {sorted(known)}")
        config = cls(**{k: (tuple(v) if k == "layers" else v) for k, v in values.items()})
        config.check()
        return config

    def check(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "conv_kernel_size", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.layers or any(kind not in SEQUENCE_MIXERS for kind in self.layers):
            raise ValueError(f"layers must list sequence mixers from {SEQUENCE_MIXERS}, got {list(self.layers)}")
        for name in ("embed_dropout", "resid_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")


class BaseConv(nn.Module):
    """Zoology's BaseConv with a short kernel: ``y = conv(u) ⊙ W u + u``."""

    def __init__(self, hidden_size: int, kernel_size: int):
        super().__init__()
        self.projection = nn.Linear(hidden_size, hidden_size)
        self.conv = nn.Conv1d(hidden_size, hidden_size, kernel_size, groups=hidden_size, padding=kernel_size - 1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        length = u.shape[1]
        conv = self.conv(u.transpose(1, 2))[..., :length].transpose(1, 2)
        return conv * self.projection(u) + u


class ZoologyBlock(nn.Module):
    def __init__(self, config: ZoologyConfig, index: int, position: Any):
        super().__init__()
        kind = config.layers[index % len(config.layers)]
        if kind == "base_conv":
            self.mixer = BaseConv(config.hidden_size, config.conv_kernel_size)
        else:
            self.mixer = GatedLinearAttention(
                hidden_size=config.hidden_size, num_heads=config.num_heads, expand_k=config.expand_k, expand_v=config.expand_v,
                use_short_conv=config.use_short_conv, conv_size=config.conv_size, use_output_gate=config.use_output_gate,
                gate_logit_normalizer=config.gate_logit_normalizer, gate_low_rank_dim=config.gate_low_rank_dim, norm_eps=config.norm_eps,
                position=position,
            )
        self.kind = kind
        self.dropout1 = nn.Dropout(config.embed_dropout if index == 0 else config.resid_dropout)
        self.norm1 = nn.LayerNorm(config.hidden_size)
        self.dropout2 = nn.Dropout(config.resid_dropout)
        self.norm2 = nn.LayerNorm(config.hidden_size)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        residual = self.dropout1(h) if residual is None else self.dropout1(h) + residual
        h = self.norm1(residual)
        h = self.mixer(h) if self.kind == "base_conv" else self.mixer(h)[0]
        residual = self.dropout2(h) + residual
        return self.norm2(residual), residual  # the state mixer is the identity


class BodyOutput(NamedTuple):
    last_hidden_state: torch.Tensor


class ZoologyBackbone(nn.Module):
    def __init__(self, config: ZoologyConfig, position: Any):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ZoologyBlock(config, i, position) for i in range(config.num_hidden_layers))
        self.drop_f = nn.Dropout(config.resid_dropout)
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor) -> BodyOutput:
        h, residual = self.embeddings(input_ids), None
        for layer in self.layers:
            h, residual = layer(h, residual)
        return BodyOutput(self.ln_f(self.drop_f(h) + residual))


class ZoologyLM(nn.Module):
    """Zoology's ``LanguageModel``: ``.model`` (the body, returning ``last_hidden_state``) and a
    ``.lm_head`` tied to the embedding, as the synthetic runner's head-at-targets step expects."""

    def __init__(self, config: ZoologyConfig, position: Any = None):
        super().__init__()
        self.config = config
        self.model = ZoologyBackbone(config, position)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Zoology's ``_init_weights`` (non-Mamba blocks): linear maps and embeddings
        N(0, initializer_range), zero biases; no ``out_proj``/``fc2`` to rescale here."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids).last_hidden_state)
