"""Every host layer calls its position encoding the same way: once per forward, with the q
and k it projected from its own input, the block input x, the batch and the carried state,
and under autocast its own bf16 copy of x as ``x_cast``."""

from __future__ import annotations

import pytest
import torch

from srope.layers import Attention, ForgettingAttention, GatedDeltaNet, GatedLinearAttention
from srope.modules import PositionEncoding
from srope.registry import positions, register_position

HOSTS = {
    "gla": (GatedLinearAttention, dict(num_heads=2, use_short_conv=True)),
    "gated_deltanet": (GatedDeltaNet, dict(num_heads=2, head_dim=8)),
    "forgetting_attn": (ForgettingAttention, dict(num_heads=2)),
    "attention": (Attention, dict(num_heads=2)),
}


class Recording(PositionEncoding):
    """Passes q and k through, keeping what every call received, and counts the calls as its state."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, q, k, x=None, **options):
        state = options.pop("state")
        self.check_call(q, k, x, options.get("attention_mask"), options.get("cu_seqlens"), options.get("x_cast"))
        self.calls.append(dict(q=q, k=k, x=x, state=state, **options))
        return q, k, (0 if state is None else state) + 1 if options["use_cache"] else None


@pytest.fixture(autouse=True)
def recording():
    register_position("recording", label="Recording", build=Recording)
    yield
    positions.unregister("recording")


@pytest.mark.parametrize("host", list(HOSTS))
def test_one_call_per_forward_with_the_block_input(host):
    cls, options = HOSTS[host]
    layer = cls(hidden_size=16, position="recording", **options)
    pe = layer.position
    x = torch.randn(2, 5, 16)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0
    _, state = layer(x, attention_mask=mask, use_cache=True)
    _, state = layer(x[:, :1], state=state, use_cache=True)
    first, step = pe.calls
    assert first["x"] is x and first["attention_mask"] is mask and first["state"] is None and first["x_cast"] is None
    assert first["q"].shape[:2] == first["k"].shape[:2] == (2, 5)
    assert step["x"].shape == (2, 1, 16) and step["state"] == 1 and state.position == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    cast = pe.calls[-1]["x_cast"]
    assert len(pe.calls) == 3 and cast.dtype == torch.bfloat16 and torch.equal(cast, x.bfloat16())
