"""``SRopeConfig``: one Hugging Face config for every host × position encoding."""

from __future__ import annotations

import inspect
from typing import Any

from transformers import PretrainedConfig

from srope.modules import SIZE_ARGUMENTS, position_class
from srope.ops.checks import is_finite_number
from srope.registry import mixers


def _hf_config_keys() -> set[str]:
    """Keys transformers itself writes into or accepts in a config."""
    keys = set(inspect.signature(PretrainedConfig.__init__).parameters) | set(PretrainedConfig().to_dict())
    return keys | {"name_or_path", "torch_dtype", "dtype", "auto_map", "_name_or_path", "_attn_implementation", "_commit_hash", "output_attentions", "use_return_dict", "model_type", "transformers_version", "architectures", "kwargs", "self"}


def check_position(position: Any) -> dict[str, Any]:
    """Normalise a position config to a dict and check its type and keys."""
    spec = {"type": "nope"} if position is None else {"type": position} if isinstance(position, str) else dict(position)
    kind = spec.get("type")
    allowed = set(inspect.signature(position_class(kind).__init__).parameters) - {"self", *SIZE_ARGUMENTS}
    unknown = sorted(set(spec) - allowed - {"type"})
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for position type {kind!r}; allowed: {sorted(allowed)}")
    return spec


class SRopeConfig(PretrainedConfig):
    """Configuration of an srope causal LM.

    Args:
        mixer: a name in :data:`srope.registry.mixers`: ``"gla"``, ``"gated_deltanet"``,
            ``"forgetting_attn"`` or ``"attention"``.
        position: ``{"type": "nope" | "rope" | "selective_rope", ...options}`` (a name in
            :data:`srope.registry.positions`; the options of :class:`srope.RoPE` /
            :class:`srope.SelectiveRoPE`), or just the type name.
        hidden_size, num_hidden_layers, num_heads, num_kv_heads (GQA for gla/attention),
        vocab_size, tie_word_embeddings.
        expand_k, expand_v: GLA key/value widths (fractions of hidden); expand_v also sets
            the GDN value head (head_dim · expand_v).
        head_dim: q/k head size of gated_deltanet / attention (default hidden/num_heads).
        use_short_conv, conv_size: SiLU short convs on q/k/v (default per mixer: GDN on).
        use_output_gate: gated output norm (default per mixer: GLA/GDN on, attention off).
        gate_logit_normalizer, gate_low_rank_dim, tie_decay_pairs: GLA's decay.
        use_forget_gate, allow_neg_eigval: GDN (no forget gate = DeltaNet; β ∈ (0, 2)).
        qkv_bias, qk_norm: attention options.
        hidden_ratio, intermediate_size: SwiGLU MLP size (fla's rule when None; 0: blocks
            without an MLP, the mixer alone, as Zoology's MQAR models).
        norm_eps, initializer_range, max_position_embeddings (informational).
    Unknown keyword arguments are an error.
    """

    model_type = "srope"

    def __init__(
        self,
        mixer: str = "gla",
        position: Any = None,
        vocab_size: int = 32000,
        hidden_size: int = 1024,
        num_hidden_layers: int = 24,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        head_dim: int | None = None,
        use_short_conv: bool | None = None,
        conv_size: int = 4,
        use_output_gate: bool | None = None,
        gate_logit_normalizer: float = 16.0,
        gate_low_rank_dim: int = 16,
        tie_decay_pairs: bool = False,
        use_forget_gate: bool = True,
        allow_neg_eigval: bool = False,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        hidden_ratio: float = 4.0,
        intermediate_size: int | None = None,
        norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        max_position_embeddings: int = 4096,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        **kwargs,
    ):
        unknown = sorted(set(kwargs) - _hf_config_keys())
        if unknown:
            raise ValueError(f"unknown SRopeConfig option(s): {unknown}")
        if not isinstance(mixer, str) or mixer not in mixers:
            raise ValueError(f"mixer must be one of {tuple(mixers)}, got {mixer!r}")
        self.mixer = mixer
        self.position = check_position(position)
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.expand_k, self.expand_v, self.head_dim = expand_k, expand_v, head_dim
        defaults = mixers[mixer].defaults
        self.use_short_conv = defaults.get("use_short_conv", False) if use_short_conv is None else use_short_conv
        self.use_output_gate = defaults.get("use_output_gate", False) if use_output_gate is None else use_output_gate
        self.conv_size = conv_size
        self.gate_logit_normalizer, self.gate_low_rank_dim = gate_logit_normalizer, gate_low_rank_dim
        self.tie_decay_pairs = tie_decay_pairs
        self.use_forget_gate, self.allow_neg_eigval = use_forget_gate, allow_neg_eigval
        self.qkv_bias, self.qk_norm = qkv_bias, qk_norm
        self.hidden_ratio, self.intermediate_size = hidden_ratio, intermediate_size
        self.norm_eps, self.initializer_range = norm_eps, initializer_range
        self.max_position_embeddings, self.use_cache = max_position_embeddings, use_cache
        super().__init__(
            pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings, **kwargs,
        )
        self.tie_word_embeddings = tie_word_embeddings
        self.validate_sizes()

    def key_geometry(self) -> tuple[int, int, int]:
        """(query heads, key heads, q/k head size) of this config's mixer."""
        heads = self.num_heads
        kv_heads = heads if self.num_kv_heads is None or self.mixer == "gated_deltanet" else self.num_kv_heads
        if self.mixer == "gla":
            key_dim = int(self.hidden_size * self.expand_k)
            if key_dim % heads:
                raise ValueError(f"hidden_size·expand_k = {key_dim} must be divisible by num_heads = {heads}")
            return heads, kv_heads, key_dim // heads
        if self.head_dim is not None:
            return heads, kv_heads, self.head_dim
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({heads}), or set head_dim")
        return heads, kv_heads, self.hidden_size // heads

    def validate_sizes(self) -> None:
        optional = ("num_kv_heads", "head_dim", "intermediate_size")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "conv_size", "gate_low_rank_dim", *optional):
            value = getattr(self, name)
            if name in optional and value is None:
                continue
            if name == "intermediate_size" and value == 0 and not isinstance(value, bool):
                continue  # no MLP
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                extra = " (0: no MLP)" if name == "intermediate_size" else ""
                raise ValueError(f"{name} must be a positive integer{' or None' if name in optional else ''}{extra}, got {value!r}")
        for name in ("expand_k", "expand_v", "hidden_ratio", "gate_logit_normalizer", "norm_eps"):
            value = getattr(self, name)
            if not is_finite_number(value):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.mixer == "gated_deltanet" and self.num_kv_heads not in (None, self.num_heads):
            raise ValueError("gated_deltanet has no grouped keys: leave num_kv_heads unset (or equal to num_heads)")
        if self.mixer == "gla" and self.head_dim is not None:
            raise ValueError("gla sizes its heads with expand_k / expand_v: leave head_dim unset")
        heads, kv_heads, head_dim = self.key_geometry()
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"num_heads ({heads}) must be a multiple of num_kv_heads ({kv_heads})")
        if self.mixer == "gla" and int(self.hidden_size * self.expand_v) % heads:
            raise ValueError(f"hidden_size·expand_v = {int(self.hidden_size * self.expand_v)} must be divisible by num_heads = {heads}")
        rotary = self.position.get("rotary_dim", head_dim)
        if self.position["type"] != "nope" and (rotary % 2 or rotary < 2 or rotary > head_dim):
            raise ValueError(
                f"rotation needs an even rotary dimension 2 <= rotary_dim <= head_dim; this config has head_dim "
                f"{head_dim} and rotary_dim {rotary} (mixer {self.mixer!r})"
            )
        if self.position["type"] == "selective_rope" and self.hidden_size % kv_heads:
            raise ValueError(f"selective_rope needs hidden_size ({self.hidden_size}) divisible by the key heads ({kv_heads})")

    def mlp_size(self) -> int:
        """SwiGLU inner size (0: no MLP): ``intermediate_size``, else ``hidden·ratio·2/3`` rounded up to a
        multiple of 256 (fla's rule) for hidden sizes from 512, and of 8 below (ours: fla's
        rule would widen a width-64 model's MLP from 176 to 256)."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        size, multiple = int(self.hidden_size * self.hidden_ratio * 2 / 3), 256 if self.hidden_size >= 512 else 8
        return multiple * -(-size // multiple)
