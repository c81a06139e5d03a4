"""fla 0.6.0 ``GLAForCausalLM`` folders as srope models: every tensor in its place, exact
weights, the same logits as fla's model (a float64 re-derivation of fla's GLA from its tensor
names here; fla itself on the GPU), and refusals that name what does not fit."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

import srope.models  # noqa: F401  (registers the Auto classes)
from srope.lab.cli import main
from srope.models import SRopeForCausalLM
from srope.models.convert_fla import convert_fla, load_fla, srope_key
from tests.helpers import generator, rel_err

VOCAB = 50
# fla GLAConfig fields: its defaults; with GQA, short convs, unfused norm, tied embeddings; without output gate and norm weight
CONFIGS = {
    "plain": dict(hidden_size=32, num_hidden_layers=2, num_heads=2),
    "gqa-conv-tied": dict(hidden_size=32, num_hidden_layers=2, num_heads=4, num_kv_heads=2, use_short_conv=True, conv_size=3, expand_v=2.0,
                          fuse_norm=False, tie_word_embeddings=True, hidden_ratio=2, norm_eps=1e-5),
    "no-gate": dict(hidden_size=32, num_hidden_layers=1, num_heads=2, use_output_gate=False, elementwise_affine=False, intermediate_size=40),
}


def fla_config(**fields) -> dict:
    """A config.json as fla 0.6.0's GLAConfig.save_pretrained writes it (its own fields at their defaults)."""
    defaults = dict(hidden_size=2048, expand_k=0.5, expand_v=1.0, hidden_ratio=4, intermediate_size=None, num_hidden_layers=24, num_heads=4,
                    num_kv_heads=None, feature_map=None, attn_mode="chunk", use_short_conv=False, conv_size=4, use_output_gate=True,
                    clamp_min=None, hidden_act="swish", max_position_embeddings=2048, elementwise_affine=True, norm_eps=1e-6, use_gk=True,
                    use_gv=False, attn=None, use_cache=True, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                    initializer_range=0.02, fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True, fuse_linear_cross_entropy=False,
                    use_l2warp=False, vocab_size=VOCAB, attnres_block_size=None)  # fmt: skip
    return {**defaults, **fields, "model_type": "gla", "architectures": ["GLAForCausalLM"], "transformers_version": "5.17.0", "dtype": "float32"}


def fla_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """fla 0.6.0's tensor names and shapes (GLAForCausalLM / GLABlock / layers.gla.GatedLinearAttention / GatedMLP)."""
    hidden, heads = c["hidden_size"], c["num_heads"]
    groups = heads // (c["num_kv_heads"] or heads)
    key_dim, value_dim = round(hidden * c["expand_k"]), round(hidden * c["expand_v"])
    mlp = c["intermediate_size"] or 256 * math.ceil(int(hidden * (c["hidden_ratio"] or 4) * 2 / 3) / 256)
    shapes = {"model.embeddings.weight": (c["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], hidden)
    for i in range(c["num_hidden_layers"]):
        layer = {
            "attn_norm.weight": (hidden,), "attn.q_proj.weight": (key_dim, hidden), "attn.k_proj.weight": (key_dim // groups, hidden),
            "attn.v_proj.weight": (value_dim // groups, hidden), "attn.gk_proj.0.weight": (16, hidden),
            "attn.gk_proj.1.weight": (key_dim // groups, 16), "attn.gk_proj.1.bias": (key_dim // groups,), "attn.o_proj.weight": (hidden, value_dim),
            "mlp_norm.weight": (hidden,), "mlp.gate_proj.weight": (mlp, hidden), "mlp.up_proj.weight": (mlp, hidden), "mlp.down_proj.weight": (hidden, mlp),
        }  # fmt: skip
        if c["use_output_gate"]:
            layer["attn.g_proj.weight"] = (value_dim, hidden)
        if c["elementwise_affine"]:
            fused = c["use_output_gate"] and c["fuse_norm"] and c["hidden_act"] == "swish"
            layer["attn.g_norm_swish_gate.weight" if fused else "attn.g_norm.weight"] = (value_dim // heads,)
        if c["use_short_conv"]:
            widths = {"q": key_dim, "k": key_dim // groups, "v": value_dim // groups}
            layer |= {f"attn.{name}_conv1d.weight": (width, 1, c["conv_size"]) for name, width in widths.items()}
        if c.get("use_selective_rope"):
            layer |= rotary_shapes(c)
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


def rotary_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """The tensors of the patched fla's SelectiveRotaryEmbedding in a GLA layer (integrations/fla, patch 0002)."""
    o = dict(projection="full-rank", projection_rank=16, weight_norm=True, conv_size=4, gate="standard", gate_rank=16, bias=False)
    o |= c.get("selective_rope") or {}
    hidden, heads = c["hidden_size"], c["num_heads"]
    pairs = (o.get("rotary_dim") or round(hidden * c["expand_k"]) // heads) // 2
    shapes = {"conv.weight": (heads * pairs, 1, o["conv_size"])}
    if o["projection"] == "full-rank":
        shapes |= {"proj_weight": (heads, hidden // heads, pairs)} | ({"proj_gain": (heads,)} if o["weight_norm"] else {})
    else:
        shapes |= {"proj.0.weight": (o["projection_rank"], hidden), "proj.1.weight": (heads * pairs, o["projection_rank"])}
    if o["gate"] == "standard":
        shapes |= {"gate.weight": (heads, hidden), "gate.bias": (heads,)}
    elif o["gate"] is not None:
        out = heads * pairs if o["gate"] == "per-channel" else heads
        shapes |= {"gate.0.weight": (o["gate_rank"], hidden), "gate.1.weight": (out, o["gate_rank"]), "gate.1.bias": (out,)}
    if o["bias"]:
        shapes["bias"] = (heads, pairs)
    return {f"attn.rotary.{name}": shape for name, shape in shapes.items()}


def write_fla(folder, config: dict, seed: int = 0, shards: int = 1, extra: dict | None = None) -> dict[str, torch.Tensor]:
    """An fla model folder with random weights (norm weights near 1); returns its tensors."""
    g = generator(seed)
    state = {}
    for name, shape in fla_shapes(config).items():
        noise = torch.randn(*shape, generator=g)
        state[name] = 1 + 0.1 * noise if name.endswith("norm.weight") or "g_norm" in name else 0.3 * noise
    state |= extra or {}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names = sorted(state)
    if shards == 1:
        save_file(state, folder / "model.safetensors")
    else:
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            save_file({n: state[n] for n in part}, folder / file)
            weight_map |= {n: file for n in part}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return state


def fla_logits(c: dict, st: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """fla's GLA language model in float64, token by token, from its tensor names."""
    st = {k: v.double() for k, v in st.items()}
    eps, heads = c["norm_eps"], c["num_heads"]
    groups = heads // (c["num_kv_heads"] or heads)

    def rms(x, w):
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        return x if w is None else x * w

    def conv(x, w):  # causal depthwise, SiLU
        return F.silu(F.conv1d(x.transpose(1, 2), w, padding=w.shape[-1] - 1, groups=x.shape[-1])[..., : x.shape[1]].transpose(1, 2))

    h = st["model.embeddings.weight"][ids]
    batch, length, _ = h.shape
    for i in range(c["num_hidden_layers"]):
        p = {k.split(f"model.layers.{i}.", 1)[1]: v for k, v in st.items() if k.startswith(f"model.layers.{i}.")}
        x = rms(h, p["attn_norm.weight"])
        q, k, v = (x @ p[f"attn.{n}_proj.weight"].T for n in "qkv")
        if c["use_short_conv"]:
            q, k, v = (conv(t, p[f"attn.{n}_conv1d.weight"]) for t, n in zip((q, k, v), "qkv"))
        gk = (x @ p["attn.gk_proj.0.weight"].T) @ p["attn.gk_proj.1.weight"].T + p["attn.gk_proj.1.bias"]
        q = q.unflatten(-1, (heads, -1))
        k, gk, v = (t.unflatten(-1, (heads // groups, -1)).repeat_interleave(groups, dim=2) for t in (k, gk, v))
        decay = (F.logsigmoid(gk) / 16).exp()
        state = torch.zeros(batch, heads, q.shape[-1], v.shape[-1], dtype=torch.float64)
        outputs = []
        for t in range(length):
            state = decay[:, t, ..., None] * state + k[:, t, ..., None] * v[:, t, :, None, :]
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * q.shape[-1] ** -0.5, state))
        norm_weight = p.get("attn.g_norm_swish_gate.weight", p.get("attn.g_norm.weight"))
        o = rms(torch.stack(outputs, 1), norm_weight)
        if c["use_output_gate"]:
            o = o * F.silu(x @ p["attn.g_proj.weight"].T).unflatten(-1, (heads, -1))
        h = h + o.flatten(-2) @ p["attn.o_proj.weight"].T
        x = rms(h, p["mlp_norm.weight"])
        h = h + (F.silu(x @ p["mlp.gate_proj.weight"].T) * (x @ p["mlp.up_proj.weight"].T)) @ p["mlp.down_proj.weight"].T
    head = st["model.embeddings.weight"] if c["tie_word_embeddings"] else st["lm_head.weight"]
    return rms(h, st["model.norm.weight"]) @ head.T


@pytest.mark.parametrize("name", CONFIGS)
def test_every_tensor_maps_exactly_and_the_logits_are_flas(name, tmp_path):
    config = fla_config(**CONFIGS[name])
    state = write_fla(tmp_path / "fla", config, shards=2 if name == "gqa-conv-tied" else 1)
    out = convert_fla(tmp_path / "fla", tmp_path / "srope")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "srope")
    assert isinstance(model, SRopeForCausalLM) and model.config.position["type"] == "nope"
    converted = model.state_dict()
    for key, tensor in state.items():
        assert torch.equal(converted[srope_key(key)], tensor), key  # the round trip through save_pretrained is exact
    given = {srope_key(key) for key in state}
    assert all(key in given or (key == "lm_head.weight" and config["tie_word_embeddings"]) or "g_norm" in key for key in converted)
    ids = torch.randint(0, VOCAB, (2, 9), generator=generator(1))
    assert rel_err(model.double()(ids).logits, fla_logits(config, state, ids)) < 1e-10
    assert out == tmp_path / "srope"


@pytest.mark.parametrize("position", ["rope", "selective_rope"])
def test_a_new_encoding_is_added_around_the_fla_weights(position, tmp_path):
    config = fla_config(**CONFIGS["plain"])
    state = write_fla(tmp_path / "fla", config)
    model = load_fla(tmp_path / "fla", position=position, seed=3)
    assert model.config.position["type"] == position
    converted = model.state_dict()
    assert all(torch.equal(converted[srope_key(key)], tensor) for key, tensor in state.items())
    fresh = [key for key in converted if ".position." in key]
    assert bool(fresh) == (position == "selective_rope")
    again = load_fla(tmp_path / "fla", position=position, seed=3)
    assert all(torch.equal(again.state_dict()[key], converted[key]) for key in fresh)  # the seed fixes them
    ids = torch.randint(0, VOCAB, (1, 7), generator=generator(2))
    assert torch.isfinite(model(ids, labels=ids).loss)


SELECTIVE = {
    "paper": dict(projection="full-rank", gate="standard", bias=False, spectrum="rope", theta=500000.0, max_temperature=1.0),
    "others": dict(projection="low-rank", gate="per-channel", bias=True, spectrum="rfa", rotary_dim=8, weight_norm=False),
    "no-gate": dict(gate=None, weight_norm=False, conv_size=3),
}


@pytest.mark.parametrize("name", SELECTIVE)
def test_an_fla_selective_rope_is_kept_with_its_weights(name, tmp_path):
    """fla patched by integrations/fla: use_selective_rope's module maps onto srope's SelectiveRoPE
    (attn.rotary.X -> mixer.position.X), its options onto srope's of the same names; nothing is new."""
    config = fla_config(**CONFIGS["plain"], use_selective_rope=True, selective_rope=SELECTIVE[name])
    state = write_fla(tmp_path / "fla", config)
    assert any(".attn.rotary." in key for key in state)
    model = load_fla(tmp_path / "fla", seed=3)
    assert model.config.position == {"type": "selective_rope", **SELECTIVE[name]}
    converted = model.state_dict()
    assert sorted(srope_key(key) for key in state) == sorted(converted)  # one to one
    assert all(torch.equal(converted[srope_key(key)], tensor) for key, tensor in state.items())
    ids = torch.randint(0, VOCAB, (1, 7), generator=generator(2))
    assert torch.isfinite(model(ids, labels=ids).loss)


def test_a_patched_fla_config_with_the_option_off_is_nope(tmp_path):
    write_fla(tmp_path / "fla", fla_config(**CONFIGS["plain"], use_selective_rope=False, selective_rope=None))
    assert load_fla(tmp_path / "fla").config.position["type"] == "nope"


def _refusal(tmp_path, match, fields=None, extra=None, drop=(), change=None, position="nope"):
    write_fla(tmp_path / "fla", fla_config(**CONFIGS["plain"]) | (fields or {}), extra=extra)
    if drop or change:
        from safetensors.torch import load_file

        state = {k: v for k, v in load_file(tmp_path / "fla" / "model.safetensors").items() if k not in drop} | (change or {})
        save_file(state, tmp_path / "fla" / "model.safetensors")
    with pytest.raises(ValueError, match=match):
        load_fla(tmp_path / "fla", position=position)


@pytest.mark.parametrize(
    "match,kwargs",
    [
        (r"have no place .*model\.layers\.0\.attn\.gv_proj\.weight", dict(extra={"model.layers.0.attn.gv_proj.weight": torch.zeros(2, 32)})),
        (r"lacks .*model\.layers\.1\.mixer\.o_proj\.weight", dict(drop=("model.layers.1.attn.o_proj.weight",))),
        (r"do not fit .*attn\.k_proj\.weight \(32, 16\)", dict(change={"model.layers.0.attn.k_proj.weight": torch.zeros(32, 16)})),
        (r"cannot represent: feature_map='relu'", dict(fields={"feature_map": "relu"})),
        (r"cannot represent: .*attn=", dict(fields={"attn": {"layers": [1], "num_heads": 2}})),
        (r"cannot represent: clamp_min=-1", dict(fields={"clamp_min": -1})),
        (r"does not know: \['window'\]", dict(fields={"window": 8})),
        (r"model_type is 'mamba'", dict(fields={"model_type": "mamba"})),
        (r"own Selective RoPE .* not 'rope'", dict(fields={"use_selective_rope": True}, position="rope")),
        (r"num_kv_heads != num_heads", dict(fields={"use_selective_rope": True, "num_kv_heads": 1})),
        (r"lacks .*model\.layers\.0\.mixer\.position\.gate\.bias", dict(fields={"use_selective_rope": True}, drop=("model.layers.0.attn.rotary.gate.bias",))),
    ],
    ids=["extra-tensor", "missing-tensor", "wrong-shape", "feature-map", "hybrid-attention", "clamp-min", "unknown-field", "not-gla",
         "selective-rope-and-another", "selective-rope-gqa", "selective-rope-missing-tensor"],
)
def test_refusals_name_what_does_not_fit(match, kwargs, tmp_path):
    _refusal(tmp_path, match, **kwargs)


def test_the_command(tmp_path, capsys):
    write_fla(tmp_path / "fla", fla_config(**CONFIGS["plain"]))
    (tmp_path / "fla" / "tokenizer_config.json").write_text("{}")
    assert main(["convert", "--from-fla", str(tmp_path / "fla"), str(tmp_path / "out"), "--position", '{"type": "selective_rope", "bias": true}']) == 0
    assert (tmp_path / "out" / "tokenizer_config.json").exists() and "wrote" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.position == {"type": "selective_rope", "bias": True}
    assert main(["convert", "--from-fla", str(tmp_path / "fla"), str(tmp_path / "out")]) == 2  # not empty
    assert main(["convert", "--from-fla", str(tmp_path / "none"), str(tmp_path / "out2")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("srope convert: error:")]
    assert len(errors) == 2 and "is not empty" in errors[0] and "no config.json" in errors[1]


def _fla_available() -> bool:
    try:
        import fla.models  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (fla's GLA kernels)")
@pytest.mark.skipif(not _fla_available(), reason="needs flash-linear-attention 0.6.0 (pip install 'srope[cuda]')")
@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_flas_own_model_on_the_gpu(name, tmp_path):
    from fla.models import GLAConfig, GLAForCausalLM

    fields = {k: v for k, v in fla_config(**CONFIGS[name]).items() if k not in ("model_type", "architectures", "transformers_version", "dtype")}
    torch.manual_seed(0)
    reference = GLAForCausalLM(GLAConfig(**fields)).cuda().eval()
    reference.save_pretrained(tmp_path / "fla")
    model = load_fla(tmp_path / "fla").cuda().eval()
    ids = torch.randint(0, VOCAB, (2, 100), generator=generator(5)).cuda()  # T > 64: fla's chunk kernel
    with torch.no_grad():
        expected, actual = reference(ids).logits, model(ids).logits
    assert rel_err(actual, expected) < 5e-3  # fla's float32 kernels use TF32 products
