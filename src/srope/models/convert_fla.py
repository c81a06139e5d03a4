"""flash-linear-attention 0.6.0 ``GLAForCausalLM`` checkpoints as srope GLA models.

fla's GLA layer has no rotary encoding (NoPE); a converted model is NoPE unless another
encoding is asked for: ``rope`` (no parameters) or ``selective_rope`` (its parameters freshly
initialised, to be fine-tuned). The names and shapes below follow fla 0.6.0's
``fla/models/gla/modeling_gla.py`` (``GLABlock``: ``attn_norm``, ``attn``, ``mlp_norm``,
``mlp``), ``fla/layers/gla.py`` (``q/k/v/g/o_proj``, ``gk_proj`` = two linear maps, the
second with a bias, ``{q,k,v}_conv1d`` depthwise convs, ``g_norm_swish_gate`` when the norm
and the swish gate are fused, else ``g_norm``) and ``configuration_gla.py``. A model of fla
patched with srope's series (``integrations/fla``, ``use_selective_rope``) keeps its Selective
RoPE: ``SelectiveRotaryEmbedding``'s parameters carry the names of srope's ``SelectiveRoPE``
(``attn.rotary.X`` -> ``mixer.position.X``) and its options are srope's of the same names.

Every fla tensor must find its srope place with its shape, and every srope tensor must come
from the checkpoint except a new encoding's: otherwise the conversion stops and lists them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from srope.models.configuration import SRopeConfig, _hf_config_keys

# fla key (per layer after "model.layers.N.") -> srope key
_LAYER_KEYS = {
    "attn_norm.weight": "mixer_norm.weight",
    **{f"attn.{name}.weight": f"mixer.{name}.weight" for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj")},
    "attn.gk_proj.0.weight": "mixer.gk_proj.0.weight",
    "attn.gk_proj.1.weight": "mixer.gk_proj.1.weight",
    "attn.gk_proj.1.bias": "mixer.gk_proj.1.bias",
    **{f"attn.{name}_conv1d.weight": f"mixer.convs.convs.{i}.weight" for i, name in enumerate("qkv")},
    "attn.g_norm_swish_gate.weight": "mixer.g_norm.norm.weight",
    "attn.g_norm.weight": "mixer.g_norm.norm.weight",
    "mlp_norm.weight": "mlp_norm.weight",
    **{f"mlp.{name}.weight": f"mlp.{name}.weight" for name in ("gate_proj", "up_proj", "down_proj")},
}
# fla key prefix (per layer) -> srope's: the rest of the name is the same on both sides
_LAYER_PREFIXES = {"attn.rotary.": "mixer.position."}
_MODEL_KEYS = {"model.embeddings.weight": "model.embeddings.weight", "model.norm.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")

# fla config fields copied as they are
_COPIED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "num_kv_heads", "expand_k", "expand_v", "use_short_conv",
           "conv_size", "use_output_gate", "norm_eps", "initializer_range", "max_position_embeddings", "tie_word_embeddings",
           "use_cache", "pad_token_id", "bos_token_id", "eos_token_id")  # fmt: skip
# read below: the MLP width (fla_mlp_size) and whether the output norm has a weight
_READ = ("hidden_ratio", "intermediate_size", "elementwise_affine", "use_selective_rope", "selective_rope")
# fields that choose kernels or that fla 0.6.0's GLA layers never read: the same model either way
_IGNORED = ("attn_mode", "fuse_norm", "fuse_swiglu", "fuse_cross_entropy", "fuse_linear_cross_entropy", "use_gk", "use_gv")
# fields srope represents only at these values (attn: fla's hybrid softmax-attention layers; use_l2warp: a loss term)
_REQUIRED = {"feature_map": None, "clamp_min": None, "hidden_act": "swish", "attn": None, "attnres_block_size": None, "use_l2warp": False}


def fla_mlp_size(config: dict) -> int:
    """fla's GatedMLP width: ``intermediate_size``, else ``hidden·ratio·2/3`` rounded up to a multiple of 256."""
    if config.get("intermediate_size") is not None:
        return config["intermediate_size"]
    ratio = 4 if config.get("hidden_ratio") is None else config["hidden_ratio"]
    return 256 * -(-int(config["hidden_size"] * ratio * 2 / 3) // 256)


def srope_config(fla: dict, position: Any = "nope") -> SRopeConfig:
    """The ``SRopeConfig`` of fla's GLA ``config.json`` (a dict), with the encoding ``position``."""
    if fla.get("model_type") != "gla":
        raise ValueError(f"not an fla GLA config: model_type is {fla.get('model_type')!r}, expected 'gla'")
    unknown = sorted(set(fla) - {*_COPIED, *_READ, *_IGNORED, *_REQUIRED} - _hf_config_keys())
    if unknown:
        raise ValueError(f"fla config field(s) srope does not know: {unknown}")
    refused = [f"{key}={fla[key]!r} (srope: {value!r})" for key, value in _REQUIRED.items() if key in fla and fla[key] != value]
    if refused:
        raise ValueError(f"fla config field(s) srope cannot represent: {', '.join(refused)}")
    copied = {key: fla[key] for key in _COPIED if key in fla}
    # fla's GLA layer defaults, not in its config
    return SRopeConfig(mixer="gla", position=_position(fla, position), gate_logit_normalizer=16.0, gate_low_rank_dim=16, tie_decay_pairs=False,
                       intermediate_size=fla_mlp_size(fla), **copied)  # fmt: skip


def _position(fla: dict, position: Any) -> Any:
    """``position``, or for the patched fla's ``use_selective_rope`` srope's Selective RoPE with fla's options."""
    if not fla.get("use_selective_rope"):
        return position
    if position != "nope":
        raise ValueError(f"the fla model has its own Selective RoPE (use_selective_rope): it is kept; leave the position at its default, not {position!r}")
    if fla.get("num_kv_heads") not in (None, fla.get("num_heads", 4)):
        # fla's layer rotates the key heads after repeating them to num_heads; srope's rotates the num_kv_heads heads
        raise ValueError("fla config use_selective_rope with num_kv_heads != num_heads: srope cannot represent it")
    return {"type": "selective_rope", **(fla.get("selective_rope") or {})}


def srope_key(fla_key: str) -> str | None:
    """srope's name of the fla tensor ``fla_key`` (None: no place for it)."""
    if fla_key in _MODEL_KEYS:
        return _MODEL_KEYS[fla_key]
    match = _LAYER.fullmatch(fla_key)
    if not match:
        return None
    layer, name = match.groups()
    if name in _LAYER_KEYS:
        return f"model.layers.{layer}.{_LAYER_KEYS[name]}"
    for prefix, ours in _LAYER_PREFIXES.items():
        if name.startswith(prefix):
            return f"model.layers.{layer}.{ours}{name[len(prefix):]}"
    return None


def convert_state_dict(fla_state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fla's tensors under srope's names, checked against ``model`` (an srope GLA model):
    every fla tensor mapped with its shape, every srope tensor given except a new encoding's
    (an fla Selective RoPE's are given)."""
    unmapped = sorted(key for key in fla_state if srope_key(key) is None)
    if unmapped:
        raise ValueError(f"{len(unmapped)} fla tensor(s) have no place in srope's GLA model: {unmapped}")
    expected = model.state_dict()
    converted, bad = {}, []
    for key, tensor in fla_state.items():
        name = srope_key(key)
        if name not in expected or expected[name].shape != tensor.shape:
            bad.append(f"{key} {tuple(tensor.shape)} -> {name} {tuple(expected[name].shape) if name in expected else 'absent'}")
        converted[name] = tensor
    if bad:
        raise ValueError(f"fla tensor(s) that do not fit srope's model of this config: {bad}")
    tied = getattr(model.config, "tie_word_embeddings", False)
    new_encoding = not any(".position." in name for name in converted)
    missing = sorted(k for k in expected if k not in converted and not (new_encoding and ".position." in k) and not (tied and k == "lm_head.weight"))
    if missing:
        raise ValueError(f"the fla checkpoint lacks tensor(s) srope's model needs: {missing}")
    return converted


def read_fla_folder(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``config.json`` and the safetensors weights (one file or shards with an index) of an fla model folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {folder} (an fla GLAForCausalLM folder, as save_pretrained writes it)")
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors (or model.safetensors.index.json) in {folder}; only safetensors weights are read")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(folder / name))
    return config, state


def load_fla(folder: str | Path, position: Any = "nope", seed: int = 0):
    """An ``SRopeForCausalLM`` holding the fla GLA model in ``folder``, in the checkpoint's dtype;
    a new encoding's parameters are initialised from ``seed``."""
    from srope.models.modeling import SRopeForCausalLM

    fla_config, fla_state = read_fla_folder(folder)
    config = srope_config(fla_config, position)
    if fla_config.get("elementwise_affine", True) is not True:  # fla's output norm has no weight: srope's is ones
        width = int(config.hidden_size * config.expand_v) // config.num_heads
        for i in range(config.num_hidden_layers):
            fla_state.setdefault(f"model.layers.{i}.attn.g_norm.weight", torch.ones(width, dtype=next(iter(fla_state.values())).dtype))
    torch.manual_seed(seed)
    model = SRopeForCausalLM(config)
    converted = convert_state_dict(fla_state, model)
    dtypes = {t.dtype for t in converted.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())
    model.load_state_dict(converted, strict=False)
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def convert_fla(folder: str | Path, out: str | Path, position: Any = "nope", seed: int = 0) -> Path:
    """``srope convert --from-fla FOLDER OUT``: the converted model saved in ``out`` (with the
    tokenizer files of ``folder``, when it has them)."""
    import shutil

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new output folder")
    model = load_fla(folder, position, seed)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(folder) / name).is_file():
            shutil.copy2(Path(folder) / name, out / name)
    return out
