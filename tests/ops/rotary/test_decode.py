"""The fused one-token decode step against the SelectiveRoPE module's torch path."""

from __future__ import annotations

import pytest
import torch

from srope.modules import SelectiveRoPE
from srope.ops.rotary.decode import decode_generator_inputs, selective_rope_decode_step
from tests.helpers import generator, randn, rel_err
from tests.ops.rotary import cuda_checks

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)

CONFIGS = {
    "silu-standard-gate": dict(),
    "no-act-per-channel-gate-bias": dict(conv_activation=None, gate="per-channel", bias=True),
    "low-rank-no-gate-learned-temp": dict(projection="low-rank", gate=None, learnable_temperature=True),
    "first-difference-partial": dict(skip_conv=True, rotary_dim=6, gate="low-rank", bias=True),
    "conv1": dict(conv_size=1, spectrum="rfa"),
}


def make_module(config, seed, hidden=16, heads=2, head_dim=8):
    torch.manual_seed(seed)
    module = SelectiveRoPE(hidden, heads, head_dim, **config)
    with torch.no_grad():  # trained-like parameters: gates far from 0.5, non-zero biases
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    return module


fused_step = cuda_checks.fused_decode_step  # the wiring the module's cached decode path uses
unfused_step = cuda_checks.unfused_step


def decode_inputs(module, dtype, device, batch=3, prefill=5, steps=4, heads=4, key_heads=2):
    g = generator(2)
    x = randn(batch, prefill + steps, 16, seed_gen=g, dtype=dtype).to(device)
    q = randn(batch, prefill + steps, heads, 8, seed_gen=g, dtype=dtype).to(device)
    k = randn(batch, prefill + steps, key_heads, 8, seed_gen=g, dtype=dtype).to(device)
    with torch.no_grad():
        _, _, state = module(q[:, :prefill], k[:, :prefill], x[:, :prefill], use_cache=True)
    return q, k, x, state, range(prefill, prefill + steps)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_steps_match_the_module(name, dtype, device):
    """Prefill 5 tokens with the module, then 4 steps each way, every path carrying its own
    state. The kernel rounds to the generator's dtype where torch does, so even in bf16 the
    two agree to the last bits (the conv's sum may differ by an ulp of its order)."""
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    module = make_module(CONFIGS[name], seed=1).to(device=device, dtype=dtype)
    q, k, x, state, steps = decode_inputs(module, dtype, device)
    torch_state = fused_state = state
    with torch.no_grad():
        for t in steps:
            sl = slice(t, t + 1)
            q_ref, k_ref, torch_state = unfused_step(module, q[:, sl], k[:, sl], x[:, sl], torch_state)
            q_out, k_out, fused_state = fused_step(module, q[:, sl], k[:, sl], x[:, sl], fused_state)
            assert q_out.dtype == dtype and k_out.dtype == dtype
            assert rel_err(q_out, q_ref) < tol and rel_err(k_out, k_ref) < tol, (t, rel_err(q_out, q_ref))
            # u comes from its own kernel for full-rank ω with a standard or no gate: its
            # sums round in another order than torch's bmm.
            assert rel_err(fused_state.conv, torch_state.conv) < 1e-6, t
            assert fused_state.phase.dtype == torch.float64
            assert rel_err(fused_state.phase, torch_state.phase) < tol / 10, (t, rel_err(fused_state.phase, torch_state.phase))


def test_decode_step_equals_the_full_forward(device):
    """Token by token through the kernel == one full forward of the module (float32)."""
    module = make_module(CONFIGS["no-act-per-channel-gate-bias"], seed=3).to(device)
    g = generator(4)
    length = 7
    x = randn(2, length, 16, seed_gen=g, dtype=torch.float32).to(device)
    q = randn(2, length, 2, 8, seed_gen=g, dtype=torch.float32).to(device)
    k = randn(2, length, 2, 8, seed_gen=g, dtype=torch.float32).to(device)
    with torch.no_grad():
        q_full, k_full, final = module(q, k, x, use_cache=True)
        _, _, state = module(q[:, :1], k[:, :1], x[:, :1], use_cache=True)
        outs = []
        for t in range(1, length):
            q_t, k_t, state = fused_step(module, q[:, t : t + 1], k[:, t : t + 1], x[:, t : t + 1], state)
            outs.append((q_t, k_t))
    assert rel_err(torch.cat([o[0] for o in outs], 1), q_full[:, 1:]) < 1e-5
    assert rel_err(torch.cat([o[1] for o in outs], 1), k_full[:, 1:]) < 1e-5
    assert rel_err(state.phase, final.phase) < 1e-6 and rel_err(state.conv, final.conv) < 1e-6


def _args(device, **overrides):
    args = dict(
        q=torch.zeros(2, 1, 4, 8, device=device), k=torch.zeros(2, 1, 2, 8, device=device),
        u=torch.zeros(2, 1, 6, device=device), conv_state=torch.zeros(2, 6, 3, device=device),
        conv_weight=torch.zeros(6, 4, device=device), phase=torch.zeros(2, 2, 3, dtype=torch.float64, device=device),
        temperature=torch.ones(3, device=device),
    )
    args.update(overrides)
    return args


BAD = [
    ("q has T > 1", dict(q=torch.zeros(2, 2, 4, 8)), ValueError, "q must be"),
    ("k heads", dict(k=torch.zeros(2, 1, 3, 8)), ValueError, "k must be"),
    ("phase dtype", dict(phase=torch.zeros(2, 2, 3)), ValueError, "phase must be float64"),
    ("u channels", dict(u=torch.zeros(2, 1, 5)), ValueError, "u must be"),
    ("state width", dict(conv_state=torch.zeros(2, 6, 2)), ValueError, "conv_state must be"),
    ("temperature", dict(temperature=torch.ones(4)), ValueError, "temperature must be"),
    ("bias", dict(bias=torch.zeros(3, 2)), ValueError, "bias must be"),
    ("gate", dict(gate=torch.zeros(2, 1, 3)), ValueError, "gate must be"),
    ("activation", dict(activation="gelu"), ValueError, "activation must be one of"),
    ("not a tensor", dict(u=[0.0]), TypeError, "u must be a torch.Tensor"),
    ("u and x", dict(x=torch.zeros(2, 1, 16), first_layers=torch.zeros(2, 8, 3), eps=1e-6), ValueError, "either u .* or x"),
    ("x without first layers", dict(u=None, x=torch.zeros(2, 1, 16), eps=1e-6), ValueError, "with x, give first_layers"),
    ("x with a gate", dict(u=None, x=torch.zeros(2, 1, 16), first_layers=torch.zeros(2, 8, 3), eps=1e-6, gate=torch.zeros(2, 1, 2)),
     ValueError, "instead of gate"),
    ("x hidden", dict(u=None, x=torch.zeros(2, 1, 15), first_layers=torch.zeros(2, 8, 3), eps=1e-6), ValueError, "x must be"),
    ("x count", dict(u=None, x=torch.zeros(3, 1, 16), first_layers=torch.zeros(2, 8, 3), eps=1e-6), ValueError, "N = 2"),
    ("first layers' width", dict(u=None, x=torch.zeros(2, 1, 16), first_layers=torch.zeros(2, 8, 4), eps=1e-6), ValueError,
     "weight's last dimension must be R = 3"),
]


@pytest.mark.parametrize("name,overrides,error,match", BAD, ids=[b[0] for b in BAD])
def test_decode_step_bad_inputs(name, overrides, error, match, device):
    overrides = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in overrides.items()}
    with pytest.raises(error, match=match):
        selective_rope_decode_step(**_args(device, **overrides))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("gate", ["standard", None])
@pytest.mark.parametrize("hidden,heads,rotary,conv", [(24, 2, 6, 4), (64, 4, 8, 3)])
def test_one_kernel_step_equals_inputs_then_step(dtype, gate, hidden, heads, rotary, conv, device):
    """The step that computes u and the gate from x in its own kernel gives what the
    inputs kernel followed by the step gives: the same sums and roundings (bitwise under the
    interpreter; compiled, a sum's order may follow the kernel's layout)."""
    torch.manual_seed(11)
    module = SelectiveRoPE(hidden, heads, 8, rotary_dim=rotary, gate=gate, bias=True, conv_size=conv).to(device=device, dtype=dtype)
    g = generator(12)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 0.5)
        x = randn(3, 1, hidden, seed_gen=g, dtype=dtype).to(device) * 2
        x[1] = 0  # x̂ = 0 through ε
        q = randn(3, 1, 2 * heads, 8, seed_gen=g, dtype=dtype).to(device)
        k = randn(3, 1, heads, 8, seed_gen=g, dtype=dtype).to(device)
        state = (randn(3, heads * module.pairs, conv - 1, seed_gen=g, dtype=dtype).to(device),
                 randn(3, heads, module.pairs, seed_gen=g, dtype=torch.float64).to(device) * 50)
        weight, _ = module._first_layers(dtype)
        gate_bias = None if gate is None else module.gate.bias
        common = (state[0], module.conv.kernel(), state[1], module.temperature(dtype, device))
        options = dict(conv_bias=module.conv.bias, activation=module.conv.activation, bias=module.bias)
        u, gate_value = decode_generator_inputs(x, weight, module.pairs, gate_bias, module.norm_eps)
        two = selective_rope_decode_step(q, k, u, *common, gate=gate_value, **options)
        one = selective_rope_decode_step(q, k, None, *common, x=x, first_layers=weight, gate_bias=gate_bias, eps=module.norm_eps, **options)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    for a, b in zip(one, two, strict=True):
        assert a.dtype == b.dtype and (torch.equal(a, b) if device == "cpu" else rel_err(a, b) < tol)


def test_long_decode_with_bias_in_a_bf16_cast_model_tracks_prefill(device):
    """200 fused steps of a bf16-cast module with a bias keep the phase of one prefill
    (exp(b) must be rounded the same way in the kernel and in the module)."""
    module = make_module(CONFIGS["no-act-per-channel-gate-bias"], seed=3).to(device=device, dtype=torch.bfloat16)
    q, k, x, state, _ = decode_inputs(module, torch.bfloat16, device, batch=2, prefill=1, steps=200)
    with torch.no_grad():
        _, _, full = module(q, k, x, use_cache=True)
        for t in range(1, 201):
            sl = slice(t, t + 1)
            _, _, state = fused_step(module, q[:, sl], k[:, sl], x[:, sl], state)
    assert (state.phase - full.phase).abs().max().item() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("gate", ["standard", None])
@pytest.mark.parametrize("hidden,heads,rotary", [(24, 2, 6), (64, 4, 8)])
def test_decode_generator_inputs_match_the_module(dtype, gate, hidden, heads, rotary, device):
    """The one-kernel generator inputs (ℓ2 norm per head chunk, ω map, per-head gate) of
    one token per sequence against the module's torch path; odd head chunks and pairs, and
    chunks longer than one loop slice."""
    torch.manual_seed(7)
    module = SelectiveRoPE(hidden, heads, 8, rotary_dim=rotary, gate=gate).to(device=device, dtype=dtype)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 0.5)
        x = randn(5, 1, hidden, seed_gen=generator(8), dtype=dtype).to(device) * 3
        x[0] = 0  # a zero token: x̂ = 0 through ε
        u_ref, gate_ref = module.generator_inputs(x)
        weight, _ = module._first_layers(dtype)
        gate_bias = None if gate is None else module.gate.bias
        u, g = decode_generator_inputs(x, weight, module.pairs, gate_bias, module.norm_eps)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert u.dtype == dtype and rel_err(u, u_ref.reshape(u.shape)) < tol
    assert (g is None) == (gate is None)
    if gate is not None:
        assert rel_err(g, gate_ref.reshape(g.shape)) < tol


BAD_INPUTS = [
    ("weight dtype", dict(weight=torch.zeros(2, 8, 5, dtype=torch.bfloat16)), "weight must be float32/float64"),
    ("weight width", dict(weight=torch.zeros(2, 8, 4)), "weight's last dimension must be R \\+ Hk = 5"),
    ("x hidden", dict(x=torch.zeros(3, 1, 15)), "x must be"),
    ("gate bias", dict(gate_bias=torch.zeros(3)), "gate_bias must be"),
]


@pytest.mark.parametrize("name,overrides,match", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_decode_generator_inputs_bad_inputs(name, overrides, match, device):
    args = dict(x=torch.zeros(3, 1, 16), weight=torch.zeros(2, 8, 5), pairs=3, gate_bias=torch.zeros(2), eps=1e-6) | overrides
    args = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in args.items()}
    with pytest.raises(ValueError, match=match):
        decode_generator_inputs(**args)
