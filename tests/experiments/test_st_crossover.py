"""experiments/st_crossover.py: the parts that run without the authors' release — the name
mapping onto our model, the token relabelling, the state conversion, the chunked GLA
reference and the command line."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# The release model's state dict at the protocol (GLA, Selective RoPE arm, 9-entry vocabulary):
# names and shapes as selective_rope.models.gla.modeling.GLAForCausalLM (d12e825) builds them.
RELEASE_STATE = {
    "model.embeddings.weight": (9, 384), "model.layers.0.attn_norm.weight": (384,), "model.layers.0.attn.q_proj.weight": (384, 384),
    "model.layers.0.attn.k_proj.weight": (384, 384), "model.layers.0.attn.v_proj.weight": (384, 384),
    "model.layers.0.attn.g_proj.weight": (384, 384), "model.layers.0.attn.q_conv1d.weight": (384, 1, 4),
    "model.layers.0.attn.k_conv1d.weight": (384, 1, 4), "model.layers.0.attn.v_conv1d.weight": (384, 1, 4),
    "model.layers.0.attn.gk_proj.0.weight": (16, 384), "model.layers.0.attn.gk_proj.1.weight": (384, 16),
    "model.layers.0.attn.gk_proj.1.bias": (384,), "model.layers.0.attn.o_proj.weight": (384, 384),
    "model.layers.0.attn.g_norm_swish_gate.weight": (32,), "model.layers.0.attn.rotary.phi_bias": (1, 1, 12, 16),
    "model.layers.0.attn.rotary.temperature": (1, 1, 1, 16), "model.layers.0.attn.rotary.phi_proj.0.weight": (32, 384),
    "model.layers.0.attn.rotary.phi_proj.1.weight": (192, 32), "model.layers.0.attn.rotary.phi_conv1d.weight": (192, 1, 4),
    "model.layers.0.mlp_norm.weight": (384,), "model.layers.0.mlp.gate_proj.weight": (1024, 384),
    "model.layers.0.mlp.up_proj.weight": (1024, 384), "model.layers.0.mlp.down_proj.weight": (384, 1024), "model.norm.weight": (384,),
    "lm_head.weight": (9, 384),
}  # fmt: skip


def _ours(module, arm: str):
    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import state_tracking
    from srope.lab.tasks.training import model_request

    _, cfg = module.our_config(0, arm, "float32")
    setting = state_tracking.settings(cfg)[0]
    return srope_model_factory(model_request("state_tracking", cfg, setting))


@pytest.mark.parametrize("arm", ["selective_rope", "nope"])
def test_release_names_map_onto_our_model(experiment, arm):
    module = experiment("st_crossover")
    names = {k: v for k, v in RELEASE_STATE.items() if arm == "selective_rope" or ".rotary." not in k}
    state = {k: torch.randn(shape) for k, shape in names.items()}
    converted = module.release_state_to_ours(state, module.token_permutation(2, 9))
    ours = _ours(module, arm).state_dict()
    assert set(converted) == set(ours)
    assert all(converted[k].shape == ours[k].shape for k in ours)


def test_token_permutation_undoes_release_ids(experiment):
    module = experiment("st_crossover")
    perm = module.token_permutation(2, 9)
    assert perm.tolist() == [0, 1, 3, 2, 4, 5, 6, 7, 8]
    ours = np.array([[2, 0, 1, 1, 0], [2, 1, 1, 0, 0]])  # our BOS is 2
    assert (perm[module.vs_authors.release_ids(ours, 2)] == ours).all()


def test_state_conversion_moves_rows_and_drops_temperature(experiment):
    module = experiment("st_crossover")
    perm = module.token_permutation(2, 9)
    emb = torch.arange(9.0)[:, None].expand(9, 4).clone()
    state = {"model.embeddings.weight": emb, "model.layers.0.attn.rotary.phi_bias": torch.arange(6.0).reshape(1, 1, 2, 3),
             "model.layers.0.attn.rotary.temperature": torch.ones(1, 1, 1, 3)}  # fmt: skip
    out = module.release_state_to_ours(state, perm)
    assert set(out) == {"model.embeddings.weight", "model.layers.0.mixer.position.bias"}
    # our row i holds the release's row of the same token: our BOS (2) is the release's [BOS] (3)
    assert out["model.embeddings.weight"][:, 0].tolist() == [0, 1, 3, 2, 4, 5, 6, 7, 8]
    assert out["model.layers.0.mixer.position.bias"].shape == (2, 3)


def _recurrent_gla(q, k, v, g):
    B, T, H, K = q.shape
    h = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        h = h * g[:, t].exp()[..., None] + k[:, t, ..., None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * K**-0.5, h))
    return torch.stack(out, 1), h


@pytest.mark.parametrize("T", [1, 16, 37])
def test_chunk_gla_reference_matches_the_recurrence(experiment, T):
    module = experiment("st_crossover")
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, T, 3, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    g = F.logsigmoid(torch.randn(2, T, 3, 8, generator=gen, dtype=torch.float64)) / 16
    want, want_state = _recurrent_gla(q, k, v, g)
    got, state = module.chunk_gla_reference(q, k, v, g, True, chunk=16)
    assert got.dtype == torch.float64
    assert module.rel_err(got, want) < 1e-12 and module.rel_err(state, want_state) < 1e-12
    got32, _ = module.chunk_gla_reference(q.float(), k.float(), v.float(), g.float())
    assert got32.dtype == torch.float32 and module.rel_err(got32, want) < 1e-5


def test_first_above_and_arguments(experiment):
    module = experiment("st_crossover")
    assert module.first_above([0.0, 1e-7, 2e-6, 1e-2], 1e-6) == 3
    assert module.first_above([0.0, 1e-7], 1e-6) is None
    args = module.parse_args(["--release", "r", "--out", "o"])
    assert args.arms == ["nope", "selective_rope"] and args.precision == ["float32", "bf16"] and args.loss_float32
    with pytest.raises(SystemExit):
        module.parse_args(["--release", "r", "--out", "o", "--steps", "0"])
