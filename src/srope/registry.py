"""What the library knows by name, one registry per kind: position encodings, mixers (the host
layers) and model presets. The synthetic tasks have theirs in :mod:`srope.lab.tasks.registry`.

Every list of these names in srope reads its registry: the ``srope`` command's choices, config
validation, report labels, benchmarks. This module imports nothing but the standard library, so
the command refuses a misspelt name before torch loads. An entry names the code it registers
by an import string (``"package.module:Attribute"``), imported on first use by :func:`load`,
or holds the object itself (a class defined anywhere: your package, a notebook, a test)::

    from srope.modules import PositionEncoding
    from srope.registry import register_position

    @register_position("scaled", label="Scaled")
    class Scaled(PositionEncoding):
        ...

after which ``srope train --position scaled``, ``SRopeConfig(position="scaled")`` and the
reports know it. docs/extending.md has the whole recipe. The built-ins are registered at the
end of this file, in the order the command lists them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Entry = TypeVar("Entry")


def load(ref: Any) -> Any:
    """``ref`` imported when it is an import string (``"package.module"`` or
    ``"package.module:attribute"``), else ``ref`` itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    value = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        value = getattr(value, part)
    return value


class Registry(Mapping[str, Entry], Generic[Entry]):
    """Name -> entry, in registration order: ``registry[name]``, ``name in registry``,
    ``list(registry)`` (the names)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, entry: Entry, *, replace: bool = False) -> Entry:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a {self.kind} name must be a non-empty string without surrounding spaces, got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered (replace=True replaces it)")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> Entry:
        """Remove ``name`` (a test's own entry, say) and return its entry."""
        return self._entries.pop(name)

    def __getitem__(self, name: str) -> Entry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<{self.kind} registry: {', '.join(self._entries)}>"


# --------------------------------------------------------------------------- position encodings


@dataclass(frozen=True)
class PositionEntry:
    """``build``: the :class:`srope.modules.PositionEncoding` subclass (or an import string of
    it). Its constructor gets those of ``hidden_size``, ``num_heads`` (the key heads) and
    ``head_dim`` it names, plus the config's options; ``label``: its name in reports and plots."""

    name: str
    label: str
    build: Any

    def cls(self) -> type:
        return load(self.build)


positions: Registry[PositionEntry] = Registry("position encoding")


def register_position(name: str, *, label: str, build: Any = None, replace: bool = False):
    """Register a position encoding; without ``build``, a class decorator that registers the class."""
    if build is None:
        return lambda cls: register_position(name, label=label, build=cls, replace=replace).build
    return positions.register(name, PositionEntry(name, label, build), replace=replace)


# --------------------------------------------------------------------------- mixers (host layers)


@dataclass(frozen=True)
class MixerEntry:
    """``layer``: the host layer class (or an import string of it), built by its
    ``from_config(config)`` classmethod from an :class:`srope.models.SRopeConfig`;
    ``defaults``: the config options whose default depends on the host (fla's layers);
    ``recurrent``: its decoding state has a fixed size (one-token decoding is replayed from
    a CUDA graph, :mod:`srope.models.graphed_decode`)."""

    name: str
    layer: Any
    defaults: dict = field(default_factory=dict)
    recurrent: bool = False

    def cls(self) -> type:
        return load(self.layer)


mixers: Registry[MixerEntry] = Registry("mixer")


def register_mixer(name: str, *, layer: Any = None, defaults: dict | None = None, recurrent: bool = False, replace: bool = False):
    """Register a host layer; without ``layer``, a class decorator that registers the class."""
    if layer is None:
        return lambda cls: register_mixer(name, layer=cls, defaults=defaults, recurrent=recurrent, replace=replace).layer
    return mixers.register(name, MixerEntry(name, layer, dict(defaults or {}), recurrent), replace=replace)


# --------------------------------------------------------------------------- model presets


@dataclass(frozen=True)
class TrainingDefaults:
    context_length: int
    global_batch_size: int  # sequences per optimiser step
    learning_rate: float


@dataclass(frozen=True)
class Preset:
    """A named model configuration (``config``: :class:`srope.models.SRopeConfig` options) with
    its training defaults (``srope train --preset NAME``)."""

    name: str
    description: str
    config: dict[str, Any]
    training: TrainingDefaults
    notes: str = field(default="")


model_presets: Registry[Preset] = Registry("model preset")


def register_model_preset(preset: Preset, *, replace: bool = False) -> Preset:
    return model_presets.register(preset.name, preset, replace=replace)


# --------------------------------------------------------------------------- the built-ins

register_position("nope", label="NoPE", build="srope.modules.base:NoPE")
register_position("rope", label="RoPE", build="srope.modules.rope:RoPE")
register_position("selective_rope", label="Selective RoPE", build="srope.modules.selective_rope:SelectiveRoPE")

register_mixer("gla", layer="srope.layers.gla:GatedLinearAttention", defaults={"use_short_conv": False, "use_output_gate": True}, recurrent=True)
register_mixer("gated_deltanet", layer="srope.layers.gated_deltanet:GatedDeltaNet", defaults={"use_short_conv": True, "use_output_gate": True},
               recurrent=True)  # fmt: skip
register_mixer("forgetting_attn", layer="srope.layers.attention:ForgettingAttention", defaults={"use_short_conv": False, "use_output_gate": False})
register_mixer("attention", layer="srope.layers.attention:Attention", defaults={"use_short_conv": False, "use_output_gate": False})

# The 370M/1.3B presets follow the authors' released LM configs (their §5.1 settings) and fla's
# layer layouts; their training defaults are the paper's recipe (Table 5): context 4096, a global
# batch of 128 × 4096 tokens (inferred from 66,758 steps ≈ 35B tokens), AdamW peak lr 1e-3 (the
# middle of the paper's grid; sweep with ``srope sweep-lr``). The tiny presets are for tests and
# quick CPU runs (the README's first hour); ``srope demo`` builds its own one-layer GLA
# (``srope.lab.demo``). ``srope models`` lists them with their sizes.
_LM = TrainingDefaults(context_length=4096, global_batch_size=128, learning_rate=1e-3)
_TINY = TrainingDefaults(context_length=256, global_batch_size=16, learning_rate=3e-3)
_TINY_SIZE = dict(vocab_size=32000, hidden_size=64, num_hidden_layers=2, num_heads=2)
for _preset in [
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
]:
    register_model_preset(_preset)
del _preset
