"""The generation cache: every layer's state and the tokens seen, under the field name this
transformers version gives it."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from srope.layers import LayerState


class SRopeCache:
    """Per-layer :class:`LayerState` s plus the number of tokens seen (prompt padding included)."""

    def __init__(self, num_layers: int):
        self.layers: list[LayerState | None] = [None] * num_layers
        self.seen_tokens = 0
        self.embedded_prompt = 0  # prompt tokens given as inputs_embeds, absent from generate's input_ids

    def __len__(self) -> int:
        return len(self.layers)

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self.seen_tokens

    def _map(self, fn) -> None:
        self.layers = [None if state is None else state.map(fn) for state in self.layers]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))


# transformers renamed the cache field of its outputs from `past_key_values` to `cache` (5.2x).
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
