"""LoRA (the ``peft`` library) on the hosts' q/k/v/o maps and on Selective RoPE's generator maps:
it trains, it changes the output, and the generator calls its wrapped maps (the fused routes
read ``.weight`` and would skip the adapter)."""

from __future__ import annotations

import copy

import pytest
import torch

from srope.ops.layout import RowLayout
from tests.helpers import rel_err
from tests.models import test_models
from tests.models.test_models import POSITIONS, tokens

peft = pytest.importorskip("peft")

LOW_RANK = POSITIONS["selective_rope"] | {"projection": "low-rank", "projection_rank": 4, "gate": "per-channel", "gate_rank": 3}
HOST_MAPS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GENERATOR_MAPS = ["proj.0", "proj.1", "gate.0", "gate.1"]  # low-rank ω map and gate (a standard gate is "gate")


def tiny_model(mixer, position, **options):
    """test_models' tiny model with the position spec ``position``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(test_models.POSITIONS, "spec", position)
        return test_models.tiny_model(mixer, "spec", **options)


def _lora(model, targets):
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
    return peft.get_peft_model(copy.deepcopy(model), config)


def _randomise_lora_b(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3)


def _increments(model, ids):
    """φ of the first layer's Selective RoPE for the block input of ``ids``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer = base.model.layers[0]
    x = layer.mixer_norm(base.model.embeddings(ids))
    return layer.mixer.position.phase_increments(x, RowLayout(*x.shape[:2]))[0]


@pytest.mark.parametrize("mixer", ["gla", "attention"])
def test_lora_trains_and_changes_the_output(mixer):
    base = tiny_model(mixer, LOW_RANK, dtype=torch.float64).train()
    ids = tokens(2, 9, seed=1)
    model = _lora(base, HOST_MAPS + GENERATOR_MAPS)
    wrapped = {name.rsplit(".base_layer", 1)[0] for name, _ in model.named_modules() if name.endswith(".base_layer")}
    for target in HOST_MAPS + ["position.proj.0", "position.proj.1", "position.gate.0", "position.gate.1"]:
        assert any(name.endswith(f"layers.0.mixer.{target}") for name in wrapped), target
    assert rel_err(model(ids).logits, base(ids).logits) < 1e-12  # LoRA B starts at zero (the routes round apart)

    lora = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in name for name in lora)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if name in lora and not torch.equal(p, lora[name])}
    assert {name for name in lora if "lora_B" in name} <= changed  # (A has no gradient while B is zero)
    assert any(".position." in name for name in changed)

    _randomise_lora_b(model)
    assert rel_err(model(ids).logits, base(ids).logits) > 1e-3


@pytest.mark.parametrize("position,targets", [(LOW_RANK, GENERATOR_MAPS), (POSITIONS["selective_rope"], ["gate"])], ids=["low-rank", "full-rank-gate"])
def test_lora_on_the_generator_changes_the_angles_exactly(position, targets):
    """The adapted generator's φ equals the plain generator's with the LoRA merged into its weights."""
    base = tiny_model("gla", position, dtype=torch.float64)
    ids = tokens(2, 9, seed=2)
    model = _lora(base, targets)
    _randomise_lora_b(model)
    assert model.get_base_model().model.layers[0].mixer.position.adapted()
    adapted = _increments(model, ids)
    assert rel_err(adapted, _increments(base, ids)) > 1e-3  # the adapter is not bypassed
    merged = model.merge_and_unload()
    assert not merged.model.layers[0].mixer.position.adapted()
    assert rel_err(adapted, _increments(merged, ids)) < 1e-12


def test_adapted_model_decodes_token_by_token_as_its_full_forward():
    base = tiny_model("gla", LOW_RANK, dtype=torch.float64)
    model = _lora(base, HOST_MAPS + GENERATOR_MAPS).eval()
    _randomise_lora_b(model)
    ids = tokens(2, 7, seed=3)
    full = model(ids, use_cache=False).logits
    cache, steps = None, []
    for t in range(ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.past_key_values
        steps.append(out.logits)
    assert rel_err(torch.cat(steps, 1), full) < 1e-10


def test_full_rank_generator_trains_in_full_beside_lora():
    """The full-rank ω map is a per-head weight, no ``nn.Linear`` LoRA could wrap: PEFT's
    ``modules_to_save`` trains a copy of the whole encoding, and the hosts use that copy."""
    base = tiny_model("gla", POSITIONS["selective_rope"], dtype=torch.float64)
    ids = tokens(2, 9, seed=4)
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, target_modules=HOST_MAPS, modules_to_save=["position"]))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert any("modules_to_save" in name and name.endswith("proj_weight") for name in trainable)
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for name, p in model.named_parameters() if "modules_to_save" in name and name.endswith("proj_weight")]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modules_to_save" in name and name.endswith("proj_weight"):
                p.mul_(-1.0)
    assert rel_err(model(ids).logits, base(ids).logits) > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the fused generator kernels)")
def test_adapted_gate_on_cuda_matches_the_fused_route_after_merging():
    base = tiny_model("gla", POSITIONS["selective_rope"]).cuda()
    ids = tokens(2, 70, seed=5).cuda()
    model = _lora(base, ["gate"])
    _randomise_lora_b(model)
    adapted = _increments(model, ids)  # the module route
    assert rel_err(adapted, _increments(base, ids)) > 1e-3
    assert rel_err(adapted, _increments(model.merge_and_unload(), ids)) < 1e-5  # the fused route, LoRA merged in
