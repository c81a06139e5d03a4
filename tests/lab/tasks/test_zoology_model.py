"""Zoology's MQAR model and the release numerics (init, precision) the release presets use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from srope.lab.cli import srope_model_factory
from srope.lab.tasks import numerics
from srope.lab.tasks.common import ModelRequest
from srope.lab.tasks.runner import resolve_preset, run_synthetic
from srope.lab.tasks.zoology_model import BaseConv, ZoologyConfig, ZoologyLM
from srope.layers import GatedLinearAttention


def _model(position="nope", **changes) -> ZoologyLM:
    torch.manual_seed(0)
    return ZoologyLM(ZoologyConfig.from_dict({"vocab_size": 50, "hidden_size": 32, **changes}), position=position)


def test_layers_alternate_as_zoology_hybrid_takes_them():
    model = _model(num_hidden_layers=4)
    kinds = [type(block.mixer) for block in model.model.layers]
    assert kinds == [BaseConv, GatedLinearAttention, BaseConv, GatedLinearAttention]
    assert model.lm_head.weight is model.model.embeddings.weight
    assert model.model.layers[0].dropout1.p == 0.1 and model.model.layers[1].dropout1.p == 0.0
    assert all(isinstance(m, nn.LayerNorm) for b in model.model.layers for m in (b.norm1, b.norm2))


def test_forward_is_zoologys_residual_stream_with_the_identity_state_mixer():
    """Zoology's model.py written out step by step with the model's own parts: every block adds
    LayerNorm(residual) to the stream after its mixer (the identity state mixer)."""
    model = _model(position={"type": "selective_rope", "projection": "low-rank", "projection_rank": 8}).eval()
    x = torch.randint(0, 50, (2, 13))
    body = model.model
    residual = body.embeddings(x)
    h = residual
    for i, block in enumerate(body.layers):
        residual = h if i == 0 else h + residual
        mixed = block.mixer(block.norm1(residual))
        mixed = mixed if isinstance(block.mixer, BaseConv) else mixed[0]
        residual = mixed + residual
        h = block.norm2(residual)
    expected = model.lm_head(body.ln_f(h + residual))
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_base_conv_is_causal_and_gated():
    torch.manual_seed(1)
    conv = BaseConv(6, 3)
    u = torch.randn(2, 9, 6)
    y = conv(u)
    taps = conv.conv.weight[:, 0]  # [C, 3], the current token last
    padded = torch.nn.functional.pad(u, (0, 0, 2, 0))
    short = sum(padded[:, j : j + 9] * taps[:, j] for j in range(3)) + conv.conv.bias
    torch.testing.assert_close(y, short * conv.projection(u) + u)
    u2 = u.clone()
    u2[:, 5:] = torch.randn(2, 4, 6)
    torch.testing.assert_close(conv(u2)[:, :5], y[:, :5])


def test_zoology_init_and_dropout():
    model = _model(hidden_size=256, vocab_size=2000)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.numel() > 5000]
    assert linears and all(abs(float(m.weight.detach().std()) - 0.02) < 0.002 for m in linears)
    assert all(m.bias is None or not m.bias.any() for m in model.modules() if isinstance(m, nn.Linear))
    conv = model.model.layers[0].mixer.conv
    assert float(conv.weight.detach().std()) > 0.1  # PyTorch's default (fan-in 3), which Zoology's init leaves alone
    x = torch.randint(0, 2000, (2, 7))
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model.eval()(x))  # the embedding dropout


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="unknown Zoology model option"):
        ZoologyConfig.from_dict({"hidden": 3})
    with pytest.raises(ValueError, match="layers"):
        ZoologyConfig.from_dict({"layers": ["mamba"]})
    with pytest.raises(ValueError, match="embed_dropout"):
        ZoologyConfig.from_dict({"embed_dropout": 1.5})
    with pytest.raises(ValueError, match="hosts the gla mixer only"):
        resolve_preset("mqar", "release", {"mixer": "attention"})
    with pytest.raises(ValueError, match="precision"):
        resolve_preset("copying", "release", {"precision": "fp8"})
    with pytest.raises(ValueError, match="init"):
        resolve_preset("copying", "release", {"init": "xavier"})


def test_the_factory_builds_zoology_for_the_mqar_release_preset():
    cfg = resolve_preset("mqar", "release")
    request = ModelRequest(task="mqar", setting="s", vocab_size=8192, max_len=64, mixer="gla", model={**cfg.model, "hidden_size": 64},
                           position={"type": "rope", "theta": 500000.0}, architecture=cfg.architecture)
    model = srope_model_factory(request)
    assert isinstance(model, ZoologyLM) and model.model.layers[1].mixer.num_heads == 2
    assert sum(p.numel() for p in model.parameters()) < 8192 * 64 + 60_000  # tied: one vocabulary matrix


def test_release_init_reaches_every_linear_map_and_conv():
    cfg = resolve_preset("state_tracking", "release")
    request = ModelRequest(task="state_tracking", setting="S2", vocab_size=9, max_len=20, mixer="gla", model=dict(cfg.model),
                           position={"type": "selective_rope", **cfg.position["selective_rope"]})
    torch.manual_seed(0)
    model = srope_model_factory(request)
    numerics.initialise(model, "release")
    weights = [m.weight for m in model.modules() if hasattr(m, "weight") and m.weight is not None and m.weight.dim() >= 2]
    convs = [m for m in model.modules() if type(m).__name__ == "ShortConvolution"]
    assert convs, "the GLA's q/k/v convs and the generator's conv"
    for m in convs:
        assert abs(float(m.weight.detach().std()) - 0.02) < 0.01
    assert all(float(w.detach().std()) < 0.03 for w in weights)
    stored = numerics.store(model, "bf16")
    assert {p.dtype for p in stored.parameters()} == {torch.bfloat16}


def test_release_presets_train_on_the_cpu(tmp_path):
    """A few steps of each release preset through the runner the CLI uses: bf16 weights for
    state tracking, Zoology's float32 model for MQAR; finite losses, a score."""
    runs = {
        ("state_tracking", "release"): {"train_size": 128, "eval_size": 32, "train_len": 6, "eval_len": 9, "epochs": 1, "batch_size": 64, "seeds": [0]},
        ("mqar", "release"): {"configs": ["64x4"], "d_models": [32], "vocab": 128, "train_examples": 128, "test_examples": 32, "epochs": 1,
                              "lrs": [1e-3], "batch_size": 32, "position_type": "selective_rope"},
        ("copying", "release"): {"context_len": 30, "max_len": 6, "steps": 3, "batch_size": 4, "eval_lengths": "2-8", "eval_examples": 8,
                                 "seeds": [0], "model.hidden_size": 32, "model.num_heads": 2, "position.bias": True, "position.gate": "standard"},
    }
    for (task, preset), overrides in runs.items():
        results = run_synthetic(task, srope_model_factory, out=tmp_path / f"{task}-{preset}", preset=preset, overrides=overrides, progress=False)
        run = results["runs"][0]
        assert 0.0 <= run["score"] <= 1.0 and run["final"] and all(h["train_loss"] is not None for h in run["history"])
