"""The host layers' boundary: what they refuse before any projection runs."""

from __future__ import annotations

import pytest
import torch

from srope.layers import Attention, ForgettingAttention, GatedDeltaNet, GatedLinearAttention

LAYERS = {
    "gla": lambda: GatedLinearAttention(hidden_size=16, num_heads=2, position="selective_rope"),
    "gated_deltanet": lambda: GatedDeltaNet(hidden_size=16, num_heads=2, position="selective_rope", use_short_conv=True),
    "forgetting_attn": lambda: ForgettingAttention(hidden_size=16, num_heads=2, position="rope"),
    "attention": lambda: Attention(hidden_size=16, num_heads=2, position="nope"),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_bad_inputs_are_refused_with_what_was_expected(name):
    layer = LAYERS[name]()
    x = torch.randn(1, 5, 16)
    with pytest.raises(TypeError, match="expects floating-point hidden states"):
        layer(torch.zeros(1, 5, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="cu_seqlens must be a torch.Tensor"):
        layer(x, cu_seqlens=[0, 5])
    with pytest.raises(ValueError, match="cu_seqlens must be contiguous"):
        layer(x, cu_seqlens=torch.tensor([0, 9, 2, 9, 5])[::2])
    _, state = layer(torch.randn(2, 5, 16), use_cache=True)
    with pytest.raises(ValueError, match="the state holds 2 sequences, this call has 1"):
        layer(x[:, :1], state=state, use_cache=True)


@pytest.mark.parametrize("value", [0, -16.0, float("inf"), True])
def test_gla_refuses_a_decay_normaliser_that_is_not_positive(value):
    with pytest.raises(ValueError, match="gate_logit_normalizer must be a finite number > 0"):
        GatedLinearAttention(hidden_size=16, num_heads=2, gate_logit_normalizer=value)
