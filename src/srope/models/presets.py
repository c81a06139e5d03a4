"""Named model configurations with their training defaults.

The 370M/1.3B presets follow the authors' released LM configs (their §5.1 settings) and
fla's layer layouts; their training defaults are the paper's recipe (Table 5): context 4096,
a global batch of 128 × 4096 tokens (inferred from 66,758 steps ≈ 35B tokens), AdamW peak
lr 1e-3 (the middle of the paper's grid; sweep with ``srope sweep-lr``). The tiny presets
are for tests and quick CPU runs (the README's first hour); ``srope demo`` builds its own
one-layer GLA (``srope.lab.demo``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from srope.models.configuration import SRopeConfig


@dataclass(frozen=True)
class TrainingDefaults:
    context_length: int
    global_batch_size: int  # sequences per optimiser step
    learning_rate: float


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: dict[str, Any]
    training: TrainingDefaults
    notes: str = field(default="")


_LM = TrainingDefaults(context_length=4096, global_batch_size=128, learning_rate=1e-3)
_TINY = TrainingDefaults(context_length=256, global_batch_size=16, learning_rate=3e-3)
_TINY_SIZE = dict(vocab_size=32000, hidden_size=64, num_hidden_layers=2, num_heads=2)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in [
        Preset("gla-370m", "GLA, hidden 1024, 24 layers, 4 heads, expand_k 0.5, short conv (the paper's GLA-370M)",
               dict(mixer="gla", hidden_size=1024, num_hidden_layers=24, num_heads=4, expand_k=0.5, expand_v=1.0,
                    use_short_conv=True, vocab_size=32000, tie_word_embeddings=False), _LM),
        Preset("gla-1.3b", "GLA, hidden 2048, 24 layers, 4 heads, short conv (the paper's GLA-1.3B)",
               dict(mixer="gla", hidden_size=2048, num_hidden_layers=24, num_heads=4, expand_k=0.5, expand_v=1.0,
                    use_short_conv=True, vocab_size=32000, tie_word_embeddings=False), _LM),
        Preset("gdn-400m", "Gated DeltaNet, hidden 1024, 24 layers, 8 heads of 128, expand_v 1, short conv",
               dict(mixer="gated_deltanet", hidden_size=1024, num_hidden_layers=24, num_heads=8, head_dim=128,
                    expand_v=1.0, use_short_conv=True, vocab_size=32000, tie_word_embeddings=False), _LM),
        Preset("fox-370m", "Forgetting Transformer, hidden 1024, 24 layers, 16 heads of 64, no output gate, no qk-norm",
               dict(mixer="forgetting_attn", hidden_size=1024, num_hidden_layers=24, num_heads=16,
                    use_output_gate=False, qk_norm=False, vocab_size=32000, tie_word_embeddings=False), _LM),
        Preset("transformer-370m", "softmax Transformer, hidden 1024, 24 layers, 16 heads of 64",
               dict(mixer="attention", hidden_size=1024, num_hidden_layers=24, num_heads=16,
                    vocab_size=32000, tie_word_embeddings=False), _LM),
        Preset("gla-tiny", "tiny GLA for tests and quick CPU runs (srope demo builds its own 1-layer GLA)", dict(mixer="gla", **_TINY_SIZE), _TINY),
        Preset("gdn-tiny", "tiny Gated DeltaNet", dict(mixer="gated_deltanet", **_TINY_SIZE), _TINY),
        Preset("fox-tiny", "tiny Forgetting Transformer", dict(mixer="forgetting_attn", **_TINY_SIZE), _TINY),
        Preset("transformer-tiny", "tiny softmax Transformer", dict(mixer="attention", **_TINY_SIZE), _TINY),
    ]
}


def preset_config(name: str, position: Any = None, **overrides) -> SRopeConfig:
    """The ``SRopeConfig`` of preset ``name`` with ``position`` and any field overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return SRopeConfig(**{**PRESETS[name].config, "position": position, **overrides})
