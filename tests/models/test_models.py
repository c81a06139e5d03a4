"""Every host × position encoding as a Hugging Face causal LM: training, caching, padding,
packing, saving, Auto classes, configs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import srope.models  # noqa: F401  (registers the Auto classes)
from srope.layers import GatedLinearAttention
from srope.models import PRESETS, SRopeConfig, SRopeForCausalLM, preset_config
from srope.models.cache import CACHE_FIELD
from srope.ops.layout import RowLayout
from srope.ops.mixers import naive as mixers_naive
from srope.registry import mixers, positions
from tests.helpers import generator, rel_err

# Every registered host and encoding (srope.registry), the encodings with these tests' options.
OPTIONS = {"rope": {"theta": 10000.0}, "selective_rope": {"bias": True, "gate": "standard", "spectrum": "rope", "theta": 100.0}}
MIXERS = list(mixers)
POSITIONS = {name: {"type": name, **OPTIONS.get(name, {})} for name in positions}
PAIRS = [(m, p) for m in MIXERS for p in POSITIONS]
IDS = [f"{m}-{p}" for m, p in PAIRS]
VOCAB = 61


def tiny_model(mixer, position, seed=0, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    options = dict(mixer=mixer, position=POSITIONS[position], vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=2,
                   initializer_range=0.2,  # large enough that greedy decoding has no near-ties
                   bos_token_id=None, eos_token_id=None)  # generate the full length, never stop early
    if mixer in ("gla", "gated_deltanet"):
        options["use_short_conv"] = True  # exercise the q/k/v conv states too
    model = SRopeForCausalLM(SRopeConfig(**options | overrides)).to(dtype).eval()
    with torch.no_grad():  # trained-like position-encoding weights: gates spread over (0, 1), bias ≠ 0
        for name, param in model.named_parameters():
            if ".position." in name:
                param.add_(torch.randn_like(param) * 0.5)
    return model


def tokens(batch, length, seed):
    return torch.randint(3, VOCAB, (batch, length), generator=generator(seed))  # never the pad id 0


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_forward_backward_and_loss(mixer, position):
    model = tiny_model(mixer, position).train()
    ids = tokens(2, 13, seed=1)
    out = model(ids, labels=ids, use_cache=False)
    assert out.logits.shape == (2, 13, VOCAB) and torch.isfinite(out.loss)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert abs(out.loss.item() - expected.item()) < 1e-6
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    assert not missing, missing


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_token_by_token_equals_full_forward_float64(mixer, position):
    model = tiny_model(mixer, position, dtype=torch.float64)
    ids = tokens(2, 11, seed=2)
    full = model(ids, use_cache=False).logits
    cache, steps = None, []
    for t in range(ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = getattr(out, CACHE_FIELD)
        steps.append(out.logits)
    assert rel_err(torch.cat(steps, 1), full) < 1e-8


def test_intermediate_size_zero_builds_blocks_of_the_mixer_alone():
    """Zoology's MQAR models: each block is h + mixer(norm(h)), no MLP and no second norm."""
    model = tiny_model("gla", "selective_rope", dtype=torch.float64, intermediate_size=0)
    assert not [n for n, _ in model.named_parameters() if "mlp" in n]
    ids = tokens(2, 11, seed=4)
    block, h = model.model.layers[0], model.model.embeddings(ids)
    mixed, _ = block.mixer(block.mixer_norm(h))
    assert torch.equal(block(h)[0], h + mixed)
    full = model(ids, use_cache=False).logits
    cache, steps = None, []
    for t in range(ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = getattr(out, CACHE_FIELD)
        steps.append(out.logits)
    assert rel_err(torch.cat(steps, 1), full) < 1e-8


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_prefill_then_cached_greedy_decode_equals_full_forward(mixer, position):
    model = tiny_model(mixer, position)
    prompt = tokens(2, 9, seed=3)
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 15)
    full = model(generated, use_cache=False).logits
    # Greedy: each new token is the argmax of the full forward at the previous position (up to exact ties).
    chosen = full[:, 8:-1].gather(-1, generated[:, 9:, None])[..., 0]
    assert (full[:, 8:-1].max(-1).values - chosen).max() <= 1e-5
    out = model(prompt, use_cache=True)
    logits, cache = [out.logits], getattr(out, CACHE_FIELD)
    for t in range(9, 15):
        out = model(generated[:, t : t + 1], cache=cache, use_cache=True)
        logits.append(out.logits)
        cache = getattr(out, CACHE_FIELD)
    assert rel_err(torch.cat(logits, 1), full) < 1e-5


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_left_padded_batch_generates_like_rows_alone(mixer, position):
    model = tiny_model(mixer, position)
    lengths = [7, 4, 2]
    rows = [tokens(1, n, seed=10 + i) for i, n in enumerate(lengths)]
    batch = torch.zeros(3, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(batch)
    for i, row in enumerate(rows):
        batch[i, -row.shape[1] :] = row[0]
        mask[i, -row.shape[1] :] = 1
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    together = model.generate(batch, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row, **kwargs)
        assert torch.equal(together.sequences[i, max(lengths) :], alone.sequences[0, row.shape[1] :])
        for step_together, step_alone in zip(together.scores, alone.scores):
            assert (step_together[i] - step_alone[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("mixer", MIXERS)
def test_batch_described_once_per_forward(mixer, monkeypatch):
    """The model builds the padded batch's RowLayout once for all its layers and encodings
    (each one a host sync), and a layer refuses a layout of another batch."""
    model = tiny_model(mixer, "selective_rope")
    built = []
    init = RowLayout.__init__
    monkeypatch.setattr(RowLayout, "__init__", lambda self, *a, **kw: built.append(a) or init(self, *a, **kw))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        model(tokens(2, 9, seed=3), attention_mask=mask, use_cache=False)
    assert len(built) == 1, built
    layer = model.model.layers[0].mixer
    with pytest.raises(ValueError, match="RowLayout of this batch"):
        layer(torch.randn(2, 9, 32), layout=RowLayout(2, 8))


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_packed_batch_equals_documents_one_by_one(mixer, position):
    model = tiny_model(mixer, position)
    bounds = [0, 5, 12, 13, 20]
    ids = tokens(1, 20, seed=4)
    cu = torch.tensor(bounds, dtype=torch.int32)
    packed = model(ids, cu_seqlens=cu, labels=ids, use_cache=False)
    losses = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        one = model(ids[:, s:e], use_cache=False).logits
        assert rel_err(packed.logits[:, s:e], one) < 1e-5
        losses.append(torch.nn.functional.cross_entropy(one[0, :-1], ids[0, s + 1 : e], reduction="sum"))
    count = sum(e - s - 1 for s, e in zip(bounds[:-1], bounds[1:]))
    assert abs(packed.loss.item() - (sum(losses) / count).item()) < 1e-5


@pytest.mark.parametrize("mixer,position", PAIRS, ids=IDS)
def test_save_and_load_reproduce_logits_bitwise(mixer, position, tmp_path):
    model = tiny_model(mixer, position)
    ids = tokens(2, 8, seed=5)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, SRopeForCausalLM)
    assert torch.equal(loaded(ids, use_cache=False).logits, model(ids, use_cache=False).logits)


@pytest.mark.parametrize("mixer", MIXERS)
def test_auto_classes_from_config(mixer):
    config = SRopeConfig(mixer=mixer, position="selective_rope", hidden_size=32, num_heads=2, num_hidden_layers=1, vocab_size=50)
    model = AutoModelForCausalLM.from_config(config)
    assert isinstance(model, SRopeForCausalLM)
    assert isinstance(AutoConfig.for_model("srope", mixer=mixer), SRopeConfig)
    assert model(torch.zeros(1, 3, dtype=torch.long)).logits.shape == (1, 3, 50)


def test_tied_decay_gla_core_is_the_complex_recurrence():
    """With tie_decay_pairs, GLA + Selective RoPE is exactly S_t = S_{t-1}·diag(λ_t e^{iθ_t}) + v_t k̃_tᴴ."""
    torch.manual_seed(0)
    layer = GatedLinearAttention(
        hidden_size=16, num_heads=2, expand_k=1.0, expand_v=0.5, tie_decay_pairs=True,
        position={"type": "selective_rope", "bias": True, "spectrum": "uniform", "max_temperature": 0.7},
    ).double()
    x = torch.randn(2, 15, 16, dtype=torch.float64)
    q = layer.q_proj(x).unflatten(-1, (2, 8))
    k = layer.k_proj(x).unflatten(-1, (2, 8))
    v = layer.v_proj(x).unflatten(-1, (2, 4))
    g = layer.log_decay(x)
    assert torch.equal(g[..., :4], g[..., 4:])  # the two channels of every pair share their decay
    q_rot, k_rot, _ = layer.position(q, k, x)
    real, _ = mixers_naive.gated_linear_attention_recurrence(q_rot, k_rot, v, g, scale=8**-0.5)
    phi, _ = layer.position.phase_increments(x, RowLayout(2, 15))
    theta = layer.position.temperature(torch.float64) * phi
    complex_out = mixers_naive.complex_rotation_recurrence(q * 8**-0.5, k, v, theta, torch.exp(g[..., :4]))
    assert rel_err(real, complex_out) < 1e-10
    # And the layer's own kernel path computes the same core.
    from srope.ops.mixers import gla

    kernel_out, _ = gla(q_rot, k_rot, v, g)
    assert rel_err(kernel_out, real) < 1e-10


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_on_meta_device(name):
    config = preset_config(name, position="selective_rope")
    with torch.device("meta"):
        model = SRopeForCausalLM(config)
    count = sum(p.numel() for p in model.parameters())
    assert count > 0
    if name == "gla-370m":
        assert 3.5e8 < count < 4.1e8, count


@pytest.mark.parametrize("mixer", ["gla", "attention"])
def test_generate_from_inputs_embeds(mixer):
    model = tiny_model(mixer, "selective_rope")
    prompt = tokens(1, 6, seed=6)
    from_ids = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    from_embeds = model.generate(inputs_embeds=model.get_input_embeddings()(prompt), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(from_embeds[:, -4:], from_ids[:, -4:])


def test_cache_only_where_useful_and_empty_input_rejected():
    model = tiny_model("attention", "rope")
    ids = tokens(1, 8, seed=7)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    assert getattr(model(ids, cu_seqlens=cu), CACHE_FIELD) is None  # packed: no cache unless asked
    assert getattr(model.train()(ids), CACHE_FIELD) is None  # training: no cache unless asked
    assert getattr(model.eval()(ids), CACHE_FIELD) is not None
    with pytest.raises(ValueError, match="at least one token"):
        model(ids[:, :0])


BAD_CONFIGS = [
    (dict(mixer="mamba"), "mixer must be one of"),
    (dict(position={"type": "alibi"}), r"unknown position encoding type 'alibi'; expected one of \('nope', 'rope', 'selective_rope'\)"),
    (dict(position={"type": "selective_rope", "use_gate": True}), r"unknown option\(s\) \['use_gate'\]"),
    (dict(hidden_size=30, num_heads=4), "must be divisible by num_heads"),
    (dict(mixer="attention", hidden_size=30, num_heads=4), "must be divisible by num_heads"),
    (dict(num_heads=4, num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(mixer="attention", hidden_size=36, num_heads=4, position="rope"), "even rotary dimension"),
    (dict(position={"type": "rope", "rotary_dim": 5}), "even rotary dimension"),
    (dict(position={"type": "selective_rope", "rotary_dim": 10}), "even rotary dimension"),
    (dict(flux_capacitor=True), r"unknown SRopeConfig option\(s\): \['flux_capacitor'\]"),
    (dict(hidden_size=0), "hidden_size must be a positive integer"),
    (dict(mixer="gated_deltanet", num_kv_heads=1), "no grouped keys"),
    (dict(mixer="gla", head_dim=8), "leave head_dim unset"),
    (dict(gate_logit_normalizer=0), "gate_logit_normalizer must be a positive finite number"),
    (dict(norm_eps=-1.0), "norm_eps must be a positive finite number"),
    (dict(expand_v=0), "expand_v must be a positive finite number"),
    (dict(hidden_ratio=float("inf")), "hidden_ratio must be a positive finite number"),
    (dict(intermediate_size=-1), r"intermediate_size must be a positive integer or None \(0: no MLP\)"),
    (dict(intermediate_size=False), "intermediate_size must be a positive integer"),
    (dict(gate_low_rank_dim=0), "gate_low_rank_dim must be a positive integer"),
    (dict(mixer="attention", head_dim=0), "head_dim must be a positive integer or None"),
    (dict(conv_size=True), "conv_size must be a positive integer"),
]


@pytest.mark.parametrize("options,match", BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_configs_raise(options, match):
    with pytest.raises(ValueError, match=match):
        SRopeConfig(**{"hidden_size": 32, "num_heads": 2, **options})


def test_config_round_trips_through_json(tmp_path):
    config = SRopeConfig(mixer="gated_deltanet", position={"type": "selective_rope", "gate": "per-channel"}, hidden_size=32, num_heads=2)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    strip = lambda d: {k: v for k, v in d.items() if k != "_name_or_path"}  # noqa: E731
    assert strip(loaded.to_dict()) == strip(config.to_dict())


def test_packed_loss_ignores_every_document_start():
    """causal_lm_loss with cu_seqlens (empty documents, a start at 0 and at T included) is
    the mean over each document's own next-token targets."""
    from srope.models.modeling import causal_lm_loss

    bounds = [0, 0, 3, 3, 4, 9, 11, 11]
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(1, 11, 13, generator=gen)
    labels = torch.randint(0, 13, (1, 11), generator=gen)
    labels[0, 6] = -100  # still ignored
    pairs = [(t, t + 1) for s, e in zip(bounds[:-1], bounds[1:]) for t in range(s, e - 1) if labels[0, t + 1] != -100]
    expected = torch.stack([torch.nn.functional.cross_entropy(logits[0, t], labels[0, u]) for t, u in pairs]).mean()
    got = causal_lm_loss(logits, labels, torch.tensor(bounds, dtype=torch.int32))
    assert torch.allclose(got, expected, atol=1e-6), (got, expected)
