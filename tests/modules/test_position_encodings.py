"""NoPE / RoPE / SelectiveRoPE through their one interface: continuation, packing, padding, dtypes."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch.func import functional_call

from srope.modules import RoPE, RoPEState, SelectiveRoPE, SelectiveRoPEState, build_position_encoding, temperature_spectrum
from tests.helpers import generator, randn, rel_err

HIDDEN, HEADS, KEY_HEADS, HEAD_DIM = 12, 4, 2, 8

CONFIGS = [
    ("nope", {}),
    ("rope", {"theta": 100.0}),
    ("rope", {"rotary_dim": 4}),
    ("selective_rope", {}),
    ("selective_rope", {"projection": "low-rank", "projection_rank": 3, "gate": "per-channel", "gate_rank": 3, "bias": True, "spectrum": "rfa"}),
    ("selective_rope", {"skip_conv": True, "conv_activation": None, "gate": "low-rank", "gate_rank": 2, "bias": True, "spectrum": "uniform"}),
    ("selective_rope", {"rotary_dim": 4, "learnable_temperature": True, "conv_size": 3, "weight_norm": False, "gate": None}),
]
IDS = [f"{kind}-{i}" for i, (kind, _) in enumerate(CONFIGS)]


def make_module(kind, options, seed=0, dtype=torch.float64):
    """A module with trained-like (non-trivial) weights: gates spread over (0, 1), bias ≠ 0, strong conv."""
    module = build_position_encoding({"type": kind, **options}, hidden_size=HIDDEN, num_heads=KEY_HEADS, head_dim=HEAD_DIM)
    g = generator(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            scale = 0.3 if "temperature" in name else 1.5
            param.copy_(randn(*param.shape, seed_gen=g, scale=scale).to(param.dtype))
    return module.to(dtype)


def make_inputs(batch, length, seed, dtype=torch.float64):
    g = generator(seed)
    q = randn(batch, length, HEADS, HEAD_DIM, seed_gen=g, dtype=dtype)
    k = randn(batch, length, KEY_HEADS, HEAD_DIM, seed_gen=g, dtype=dtype)
    x = randn(batch, length, HIDDEN, seed_gen=g, dtype=dtype)
    return q, k, x


def assert_states_close(a, b, tol=1e-12):
    if a is None or b is None:
        assert a is None and b is None
        return
    for field_a, field_b in zip(a, b):
        assert rel_err(field_a, field_b) < tol


@pytest.mark.parametrize("kind,options", CONFIGS, ids=IDS)
@pytest.mark.parametrize("split", [1, 5, 10])
def test_split_and_continue_equals_one_call(kind, options, split):
    module = make_module(kind, options)
    q, k, x = make_inputs(2, 11, seed=1)
    full_q, full_k, full_state = module(q, k, x, use_cache=True)
    a_q, a_k, state = module(q[:, :split], k[:, :split], x[:, :split], use_cache=True)
    b_q, b_k, state = module(q[:, split:], k[:, split:], x[:, split:], state=state, use_cache=True)
    assert rel_err(torch.cat([a_q, b_q], 1), full_q) < 1e-12
    assert rel_err(torch.cat([a_k, b_k], 1), full_k) < 1e-12
    assert_states_close(state, full_state)


@pytest.mark.parametrize("kind,options", CONFIGS, ids=IDS)
def test_token_by_token_decode_equals_prefill(kind, options):
    module = make_module(kind, options, dtype=torch.float32)
    q, k, x = make_inputs(3, 9, seed=2, dtype=torch.float32)
    full_q, full_k, _ = module(q, k, x)
    outputs, state = [], None
    for t in range(9):
        out_q, out_k, state = module(q[:, t : t + 1], k[:, t : t + 1], x[:, t : t + 1], state=state, use_cache=True)
        outputs.append((out_q, out_k))
    assert rel_err(torch.cat([o[0] for o in outputs], 1), full_q) < 1e-5
    assert rel_err(torch.cat([o[1] for o in outputs], 1), full_k) < 1e-5


@pytest.mark.parametrize("kind,options", CONFIGS, ids=IDS)
def test_packed_equals_sequences_one_by_one(kind, options):
    module = make_module(kind, options)
    bounds = [0, 3, 3, 8, 14]
    q, k, x = make_inputs(1, 14, seed=3)
    # Each packed sequence continues from its own state (a previous chunk of 2 tokens).
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    pq, pk, px = make_inputs(len(lengths), 2, seed=4)
    _, _, prev = module(pq, pk, px, use_cache=True)
    cu = torch.tensor(bounds, dtype=torch.int64)
    out_q, out_k, state = module(q, k, x, cu_seqlens=cu, state=prev, use_cache=True)
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        row_prev = None if prev is None else type(prev)(*(f[n : n + 1] for f in prev))
        if s == e:
            assert_states_close(None if state is None else type(state)(*(f[n : n + 1] for f in state)), row_prev)
            continue
        one_q, one_k, one_state = module(q[:, s:e], k[:, s:e], x[:, s:e], state=row_prev, use_cache=True)
        assert rel_err(out_q[:, s:e], one_q) < 1e-12 and rel_err(out_k[:, s:e], one_k) < 1e-12
        assert_states_close(None if state is None else type(state)(*(f[n : n + 1] for f in state)), one_state)


@pytest.mark.parametrize("kind,options", CONFIGS, ids=IDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_rows_alone(kind, options, side):
    """Rows of lengths 9, 5, 2 padded to 9; then 3 decode steps from the padded state."""
    module = make_module(kind, options)
    lengths, length = [9, 5, 2], 9
    q, k, x = make_inputs(3, length + 3, seed=5)
    mask = torch.zeros(3, length, dtype=torch.long)
    real = []
    for row, n in enumerate(lengths):
        cols = torch.arange(length - n, length) if side == "left" else torch.arange(n)
        mask[row, cols] = 1
        real.append(cols)
    # Garbage at padded positions must not matter.
    qp, kp, xp = q[:, :length].clone(), k[:, :length].clone(), x[:, :length].clone()
    for tensor in (qp, kp, xp):
        tensor[mask == 0] = 1e3
    out_q, out_k, state = module(qp, kp, xp, attention_mask=mask, use_cache=True)
    dec_q, _, _ = module(q[:, length:], k[:, length:], x[:, length:], state=state, use_cache=True)
    for row, cols in enumerate(real):
        one = slice(row, row + 1)
        alone_q, alone_k, alone_state = module(qp[one, cols], kp[one, cols], xp[one, cols], use_cache=True)
        assert rel_err(out_q[one, cols], alone_q) < 1e-12 and rel_err(out_k[one, cols], alone_k) < 1e-12
        alone_dec, _, _ = module(q[one, length:], k[one, length:], x[one, length:], state=alone_state)
        assert rel_err(dec_q[one], alone_dec) < 1e-12


def test_selective_rope_depends_on_input_and_only_on_relative_phase():
    module = make_module("selective_rope", {"bias": True})
    q, k, x = make_inputs(1, 10, seed=6)
    out_q, out_k, _ = module(q, k, x)
    scores = torch.einsum("bthd,bshd->bhts", out_q[:, :, ::2], out_k)
    # A shifted starting phase rotates every token equally: all q·k scores are unchanged.
    pairs = module.pairs
    shifted = SelectiveRoPEState(torch.zeros(1, KEY_HEADS * pairs, 3, dtype=torch.float64), torch.full((1, KEY_HEADS, pairs), 7.3, dtype=torch.float64))
    sq, sk, _ = module(q, k, x, state=shifted)
    assert rel_err(sq, out_q) > 1e-2  # the absolute rotation did change
    assert rel_err(torch.einsum("bthd,bshd->bhts", sq[:, :, ::2], sk), scores) < 1e-12
    # Another block input gives other angles.
    other_q, _, _ = module(q, k, x.flip(1))
    assert rel_err(other_q, out_q) > 1e-2


def test_rope_module_matches_selective_rope_with_unit_steps():
    from srope.ops import selective_rope
    from srope.ops.rotary import naive as reference

    q, k, _ = make_inputs(2, 17, seed=7)
    module = RoPE(HEAD_DIM, theta=500.0)
    rot_q, rot_k, _ = module(q, k)
    temperature = reference.rope_inverse_frequencies(HEAD_DIM, 500.0)
    ones = torch.ones(2, 17, KEY_HEADS, HEAD_DIM // 2, dtype=torch.float64)
    ref_q, ref_k, _ = selective_rope(q, k, ones, temperature, offset=-torch.ones(2, KEY_HEADS, HEAD_DIM // 2, dtype=torch.float64))
    assert rel_err(rot_q, ref_q) < 1e-13 and rel_err(rot_k, ref_k) < 1e-13


def test_bf16_cast_keeps_float32_spectra():
    module = SelectiveRoPE(HIDDEN, KEY_HEADS, HEAD_DIM * 8, spectrum="rope", theta=500000.0)
    exact = temperature_spectrum("rope", HEAD_DIM * 4, theta=500000.0)
    module = module.to(torch.bfloat16)
    assert torch.equal(module.temperature(torch.float32), exact.float())
    assert torch.equal(module.temperature(torch.float64), exact)
    assert not torch.equal(exact.bfloat16().float(), exact.float())  # a bf16 buffer would have been caught
    assert all(p.dtype == torch.bfloat16 for p in module.parameters())
    q = torch.randn(2, 5, KEY_HEADS, HEAD_DIM * 8, dtype=torch.bfloat16)
    out_q, _, state = module(q, q, torch.randn(2, 5, HIDDEN, dtype=torch.bfloat16), use_cache=True)
    assert out_q.dtype == torch.bfloat16 and state.phase.dtype == torch.float64


@pytest.mark.parametrize(
    "kind,pairs,kwargs,expected",
    [
        ("rope", 4, dict(theta=10000.0, max_value=0.5), lambda j: 0.5 * 10000.0 ** (-2 * j / 8)),
        ("uniform", 3, dict(max_value=2.0), lambda j: 2.0 + 0 * j),
        ("rfa", 5, dict(epsilon=0.1, max_value=1.0), lambda j: torch.tan(j * 0.9 * math.pi / 4 / 2) / math.tan(0.9 * math.pi / 2)),
    ],
)
def test_spectra_equal_their_formulas(kind, pairs, kwargs, expected):
    j = torch.arange(pairs, dtype=torch.float64)
    values = temperature_spectrum(kind, pairs, **kwargs)
    assert rel_err(values, expected(j)) < 1e-14
    module = SelectiveRoPE(HIDDEN, KEY_HEADS, 2 * pairs, spectrum=kind, **{"max_temperature" if k == "max_value" else k: v for k, v in kwargs.items()})
    assert torch.equal(module.temperature(torch.float64), values)


@pytest.mark.parametrize("pairs", [3, 8, 16, 32])
def test_the_release_float32_rfa_spectrum_keeps_its_rounding(pairs):
    """``rfa-float32`` is the release's float32 arithmetic, not the exact spectrum: at epsilon 1e-4 (its copying
    setting) 1 + cos(phi) near pi rounds so that every pair but the first and last is 1.099 times the exact value;
    the values are float32 numbers (exact in float32), and the module uses them as they are."""
    exact = temperature_spectrum("rfa", pairs, epsilon=1e-4, max_value=0.25)
    release = temperature_spectrum("rfa-float32", pairs, epsilon=1e-4, max_value=0.25)
    assert release.dtype == torch.float64 and torch.equal(release.float().double(), release)
    assert release[0] == exact[0] == 0 and release[-1] == exact[-1] == 0.25
    inner = release[1:-1] / exact[1:-1]
    assert ((inner - 1.0990).abs() < 1e-4).all(), inner
    loose = temperature_spectrum("rfa-float32", pairs, epsilon=0.1, max_value=0.25)  # far from pi: float32 rounding only
    assert rel_err(loose, temperature_spectrum("rfa", pairs, epsilon=0.1, max_value=0.25)) < 1e-6
    module = SelectiveRoPE(HIDDEN, KEY_HEADS, 2 * pairs, spectrum="rfa-float32", epsilon=1e-4, max_temperature=0.25)
    assert torch.equal(module.temperature(torch.float32), release.float())
    with pytest.raises(ValueError, match="not finite at epsilon=5e-05"):  # the release's formula gives NaN there
        SelectiveRoPE(HIDDEN, KEY_HEADS, 2 * pairs, spectrum="rfa-float32", epsilon=5e-5)


@pytest.mark.parametrize("route", ["torch", pytest.param("triton", marks=pytest.mark.kernels)])
def test_training_after_an_inference_mode_call(route, device):
    """The spectrum is cached per device and dtype on first use; when that use is under
    ``torch.inference_mode`` (evaluation, generation) the cached tensor must still be one that a
    later training step can save for its backward (the kernel route's op saves it)."""
    import srope

    module = SelectiveRoPE(HIDDEN, KEY_HEADS, HEAD_DIM).to(device)
    q, k, x = (t.to(device) for t in (torch.randn(1, 7, HEADS, HEAD_DIM), torch.randn(1, 7, KEY_HEADS, HEAD_DIM), torch.randn(1, 7, HIDDEN)))
    with srope.backend.use(route):
        with torch.inference_mode():
            module(q, k, x)
        q_rot, k_rot, _ = module(q.requires_grad_(), k, x)
        (q_rot.sum() + k_rot.sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


RELEASE = os.environ.get("SROPE_AUTHORS_RELEASE", "")  # a checkout of the authors' release, outside this tree


@pytest.mark.skipif(not RELEASE or not os.path.isfile(os.path.join(RELEASE, "src", "selective_rope", "modules", "rotary.py")),
                    reason="set SROPE_AUTHORS_RELEASE to a checkout of timurcarstensen/selective-rope")
def test_the_release_float32_rfa_spectrum_is_the_releases_bitwise():
    """Against the release's own ``rotary_temperature`` (read from the checkout, never copied here)."""
    import ast

    path = os.path.join(RELEASE, "src", "selective_rope", "modules", "rotary.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    source = next(ast.get_source_segment(open(path, encoding="utf-8").read(), node) for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name == "rotary_temperature")
    namespace = {"torch": torch, "Literal": __import__("typing").Literal}
    exec(source, namespace)
    for pairs in (2, 8, 16, 32, 64):
        theirs = namespace["rotary_temperature"]("rfa", 0.9999, 2 * pairs, 0.25).reshape(-1)
        assert torch.equal(temperature_spectrum("rfa-float32", pairs, epsilon=1e-4, max_value=0.25).float(), theirs), pairs


def test_gradients_reach_every_parameter_and_input():
    module = make_module("selective_rope", CONFIGS[4][1] | {"learnable_temperature": True})
    q, k, x = (t.requires_grad_() for t in make_inputs(2, 6, seed=8))
    out_q, out_k, _ = module(q, k, x)
    (out_q.square().sum() + out_k.pow(3).sum()).backward()
    for name, tensor in [*module.named_parameters(), ("q", q), ("k", k), ("x", x)]:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0, name


def explicit_increments(module: SelectiveRoPE, x: torch.Tensor) -> torch.Tensor:
    """φ written out from the formula with x̂ built explicitly (no causal mixing beyond the
    conv, which runs as a plain zero-padded depthwise conv1d)."""
    chunks = x.unflatten(-1, (module.num_heads, -1))
    x_hat = (chunks / torch.sqrt(chunks.square().sum(-1, keepdim=True) + module.norm_eps)).flatten(-2)
    if module.projection == "full-rank":
        weight = module.proj_weight
        if module.weight_norm:
            weight = module.proj_gain[:, None, None] * weight / weight.norm(dim=1, keepdim=True)
        u = torch.einsum("bthi,hir->bthr", x_hat.unflatten(-1, (module.num_heads, -1)), weight).flatten(-2)
    else:
        u = module.proj[1](module.proj[0](x_hat))
    kernel = module.conv.kernel().to(u.dtype)
    width = kernel.shape[-1]
    conv = torch.nn.functional.conv1d(torch.nn.functional.pad(u.transpose(1, 2), (width - 1, 0)), kernel[:, None, :], groups=u.shape[-1])
    phi = conv.transpose(1, 2)
    if module.conv.activation is not None:
        phi = torch.nn.functional.silu(phi)
    phi = phi.unflatten(-1, (module.num_heads, module.pairs))
    if module.bias is not None:
        phi = phi + torch.exp(module.bias)
    if module.gate is not None:
        gate = torch.sigmoid(module.gate(x_hat))
        phi = phi * (gate.unflatten(-1, (module.num_heads, module.pairs)) if module.gate_type == "per-channel" else gate[..., None])
    return phi


@pytest.mark.parametrize("options", [CONFIGS[3][1], CONFIGS[4][1], CONFIGS[5][1], CONFIGS[6][1],
                                     {"gate": "per-channel", "gate_rank": 2, "bias": True}])
def test_increments_match_the_explicit_formula(options):
    """Forward and backward of the generator (x̂ never built) against the formula, float64."""
    from srope.ops.layout import RowLayout

    module = make_module("selective_rope", options)
    x = make_inputs(2, 7, seed=12)[2].requires_grad_()
    ours = module.phase_increments(x, RowLayout(2, 7))[0]
    ref = explicit_increments(module, x)
    assert rel_err(ours, ref) < 1e-13
    grad = randn(*ours.shape, seed_gen=generator(13))
    params = [p for p in module.parameters() if p.requires_grad]
    for a, b in zip(torch.autograd.grad(ours, [x, *params], grad, allow_unused=True),
                    torch.autograd.grad(ref, [x, *params], grad, allow_unused=True)):
        assert (a is None) == (b is None) and (a is None or rel_err(a, b) < 1e-12)


@pytest.mark.parametrize("options", [{"spectrum": "uniform", "max_temperature": math.pi}, {"learnable_temperature": True, "gate": None}])
def test_phase_noise_only_in_training_with_the_asked_spread(options):
    """phase_noise adds N(0, σ²) radians to every angle step Θ·φ in training mode, nothing
    in eval mode, and no gradient path (the derivative of a linear read-out is unchanged)."""
    from srope.ops.layout import RowLayout

    sigma = 0.1
    clean = make_module("selective_rope", options)
    noisy = make_module("selective_rope", {**options, "phase_noise": sigma})
    x = make_inputs(4, 300, seed=31)[2]
    layout = RowLayout(4, 300)
    noisy.eval()
    assert torch.equal(noisy.phase_increments(x, layout)[0], clean.phase_increments(x, layout)[0])
    noisy.train()
    torch.manual_seed(0)
    phi = noisy.phase_increments(x, layout)[0]
    theta = noisy.temperature(torch.float64)
    steps = (phi - clean.phase_increments(x, layout)[0]) * theta
    assert abs(steps.std().item() / sigma - 1) < 0.03 and abs(steps.mean().item()) < 0.01
    weights = randn(*phi.shape, seed_gen=generator(32))
    params = [p for p in noisy.parameters()]
    ours = torch.autograd.grad((noisy.phase_increments(x, layout)[0] * weights).sum(), params, allow_unused=True)
    ref = torch.autograd.grad((clean.phase_increments(x, layout)[0] * weights).sum(), list(clean.parameters()), allow_unused=True)
    for a, b in zip(ours, ref):
        assert (a is None) == (b is None) and (a is None or rel_err(a, b) < 1e-12)


def test_projection_gain_scales_the_initial_increments():
    """projection_gain g starts the weight-norm gain at g: before the conv, u = g · (unit
    weight · x̂), so the initial pre-conv increments are g times those of gain 1."""
    from srope.ops.layout import RowLayout

    def build(**options):
        torch.manual_seed(5)
        spec = {"type": "selective_rope", "gate": None, "conv_size": 1, "conv_activation": None, **options}
        return build_position_encoding(spec, hidden_size=HIDDEN, num_heads=KEY_HEADS, head_dim=HEAD_DIM).double()

    one, four = build(), build(projection_gain=4.0)
    assert torch.equal(four.proj_gain, torch.full_like(four.proj_gain, 4.0))
    x = make_inputs(2, 7, seed=33)[2]
    assert rel_err(four.generator_inputs(x)[0], 4 * one.generator_inputs(x)[0]) < 1e-15
    four.reset_parameters()
    assert torch.equal(four.proj_gain, torch.full_like(four.proj_gain, 4.0))
    assert four.phase_increments(x, RowLayout(2, 7))[0].shape == (2, 7, KEY_HEADS, four.pairs)


def test_autocast_keeps_the_generator_forward_and_lowers_its_backward_products():
    """Under (CPU) bf16 autocast the increments are the float32 ones bit for bit; the ω map's
    gradients come from bf16 products (close to, not equal to, the float32 gradients)."""
    from srope.ops.layout import RowLayout

    module = make_module("selective_rope", {"gate": "standard", "conv_size": 3}).float()
    x = make_inputs(2, 33, seed=34)[2].float()
    layout = RowLayout(2, 33)
    weights = randn(2, 33, KEY_HEADS, module.pairs, seed_gen=generator(35)).float()
    plain = module.phase_increments(x, layout)[0]
    grad_plain = torch.autograd.grad((plain * weights).sum(), module.proj_weight)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = module.phase_increments(x, layout)[0]
    grad_mixed = torch.autograd.grad((mixed * weights).sum(), module.proj_weight)[0]
    assert mixed.dtype == torch.float32 and torch.equal(mixed, plain)
    assert 1e-5 < rel_err(grad_mixed, grad_plain) < 2e-2


@pytest.mark.parametrize("value", [-0.1, float("inf"), float("nan"), "0.1", True])
def test_bad_phase_noise_raises(value):
    with pytest.raises(ValueError, match="phase_noise must be a finite number >= 0"):
        SelectiveRoPE(HIDDEN, KEY_HEADS, HEAD_DIM, phase_noise=value)


def test_inference_weight_cache_follows_every_parameter_change():
    """Without autograd the generator's first layers are cached; an optimiser step, a
    load_state_dict, an in-place edit and a dtype cast must each be seen, and with
    autograd nothing is cached (the gradient must reach the parameters)."""
    from srope.ops.layout import RowLayout

    module = make_module("selective_rope", {"gate": "per-channel", "gate_rank": 2, "bias": True})
    x = make_inputs(1, 6, seed=21)[2]

    def increments():
        with torch.no_grad():
            return module.phase_increments(x, RowLayout(1, 6))[0]

    def fresh():
        saved, module._first_layer_cache = module._first_layer_cache, None
        with torch.no_grad():
            out = module.phase_increments(x, RowLayout(1, 6))[0]
        module._first_layer_cache = saved
        return out

    before = increments()
    assert module._first_layer_cache is not None and torch.equal(increments(), before)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module.phase_increments(x, RowLayout(1, 6))[0].square().sum().backward()
    optimizer.step()
    after_step = increments()
    assert not torch.equal(after_step, before) and torch.equal(after_step, fresh())
    module.load_state_dict(make_module("selective_rope", {"gate": "per-channel", "gate_rank": 2, "bias": True}, seed=5).state_dict())
    assert torch.equal(increments(), fresh()) and not torch.equal(increments(), after_step)
    with torch.no_grad():
        module.gate[0].weight.mul_(-1)
    assert torch.equal(increments(), fresh())
    module.to(torch.float32)
    x = x.float()
    assert increments().dtype == torch.float32 and torch.equal(increments(), fresh())
    with torch.enable_grad():
        module.phase_increments(x, RowLayout(1, 6))[0].sum().backward()
    assert module._first_layer_cache is None and module.proj_weight.grad is not None


@pytest.mark.parametrize("options", [CONFIGS[3][1], CONFIGS[4][1], CONFIGS[5][1] | {"learnable_temperature": True}])
def test_module_gradcheck_float64(options):
    module = make_module("selective_rope", options)
    q, k, x = make_inputs(1, 5, seed=9)
    names = [name for name, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def fn(q, k, x, *params):
        return functional_call(module, dict(zip(names, params)), (q, k, x))[:2]

    assert torch.autograd.gradcheck(fn, (q.requires_grad_(), k.requires_grad_(), x.requires_grad_(), *params))


BAD_CONFIGS = [
    ({"type": "alibi"}, "unknown position encoding type"),
    ({"type": "rope", "base": 10.0}, "bad options for position encoding 'rope'"),
    ({"type": "rope", "rotary_dim": 3}, "rotary_dim must be even"),
    ({"type": "rope", "rotary_dim": 16}, "rotary_dim must be even"),
    ({"type": "selective_rope", "projection": "dense"}, "projection must be one of"),
    ({"type": "selective_rope", "gate": "sigmoid"}, "gate must be one of"),
    ({"type": "selective_rope", "spectrum": "linear"}, "spectrum must be one of"),
    ({"type": "selective_rope", "theta": 0.5}, "theta >= 1"),
    ({"type": "selective_rope", "spectrum": "rfa", "epsilon": 1.5}, "0 < epsilon < 1"),
    ({"type": "selective_rope", "conv_size": 0}, "conv_size must be a positive integer"),
    ({"type": "selective_rope", "conv_activation": "gelu"}, "activation must be one of"),
    ({"type": "selective_rope", "max_temperature": -1.0}, "max_value must be a positive"),
    ({"type": "selective_rope", "use_gate": True}, "bad options for position encoding 'selective_rope'"),
    ({"type": "selective_rope", "projection_gain": 0.0}, "projection_gain must be a finite number > 0"),
    ({"type": "selective_rope", "projection_gain": float("nan")}, "projection_gain must be a finite number > 0"),
    ({"type": "selective_rope", "projection_gain": 2.0, "weight_norm": False}, "needs projection='full-rank' and weight_norm=True"),
    ({"type": "selective_rope", "projection_gain": 2.0, "projection": "low-rank"}, "needs projection='full-rank' and weight_norm=True"),
    ({"type": "selective_rope", "norm_eps": -1.0}, "norm_eps must be a finite number > 0"),
    ({"type": "selective_rope", "theta": float("inf")}, "finite theta >= 1"),
    ({"type": "rope", "theta": float("inf")}, "theta must be a positive finite number"),
    ({"type": "rope", "theta": True}, "theta must be a positive finite number"),
]


@pytest.mark.parametrize("spec,match", BAD_CONFIGS, ids=[str(s) for s, _ in BAD_CONFIGS])
def test_bad_configs_raise(spec, match):
    with pytest.raises(ValueError, match=match):
        build_position_encoding(spec, hidden_size=HIDDEN, num_heads=KEY_HEADS, head_dim=HEAD_DIM)


def test_hidden_not_divisible_by_heads():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        SelectiveRoPE(10, 3, 8)


BAD_CALLS = [
    (dict(x=None), ValueError, "needs the block input x"),
    (dict(x=torch.zeros(2, 6, 7)), ValueError, "hidden size 12"),
    (dict(x=torch.zeros(2, 5, 12)), ValueError, "x must be the block input"),
    (dict(k=torch.zeros(2, 6, 4, 8)), ValueError, r"k must be \[B, T, 2, 8\]"),
    (dict(attention_mask=torch.ones(2, 5)), ValueError, "attention_mask must be"),
    (dict(attention_mask=torch.ones(1, 6), cu_seqlens=torch.tensor([0, 6])), ValueError, "either attention_mask or cu_seqlens"),
    (dict(state=(torch.zeros(2, 8, 3), torch.zeros(2, 2, 4))), TypeError, "state must be a SelectiveRoPEState"),
    (dict(state=SelectiveRoPEState(torch.zeros(2, 8, 2), torch.zeros(2, 2, 4))), ValueError, "state.conv must have shape"),
    (dict(state=SelectiveRoPEState(torch.zeros(2, 8, 3), torch.zeros(3, 2, 4))), ValueError, "state.phase must have shape"),
    (dict(q=torch.zeros(2, 6, 32)), ValueError, "q must be a"),
    (dict(x_cast=torch.zeros(2, 5, 12)), ValueError, "x_cast must be the host's copy of x"),
]


@pytest.mark.parametrize("overrides,error,match", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_bad_calls_raise(overrides, error, match):
    module = SelectiveRoPE(HIDDEN, KEY_HEADS, HEAD_DIM)
    args = dict(q=torch.zeros(2, 6, HEADS, HEAD_DIM), k=torch.zeros(2, 6, KEY_HEADS, HEAD_DIM), x=torch.zeros(2, 6, HIDDEN))
    args |= overrides
    with pytest.raises(error, match=match):
        module(args.pop("q"), args.pop("k"), args.pop("x"), **args)


@pytest.mark.parametrize("kind", ["nope", "rope", "selective_rope"])
def test_qk_that_do_not_pair_are_refused_by_every_encoding(kind):
    module = build_position_encoding(kind, hidden_size=HIDDEN, num_heads=KEY_HEADS, head_dim=HEAD_DIM)
    x, k = torch.zeros(2, 6, HIDDEN), torch.zeros(2, 6, KEY_HEADS, HEAD_DIM)
    with pytest.raises(TypeError, match="must be floating point"):
        module(torch.zeros(2, 6, HEADS, HEAD_DIM, dtype=torch.long), k.long(), x)
    with pytest.raises(ValueError, match=r"need the same \[B, T\] and D, and H a multiple of Hk"):
        module(torch.zeros(2, 6, HEADS + 1, HEAD_DIM), k, x)


def test_nope_carries_no_state():
    q, k, x = make_inputs(2, 6, seed=7, dtype=torch.float32)
    with pytest.raises(TypeError, match="NoPE carries no state"):
        build_position_encoding("nope", hidden_size=HIDDEN, num_heads=KEY_HEADS, head_dim=HEAD_DIM)(q, k, x, state=object())


def test_an_empty_call_gives_empty_outputs_and_keeps_the_state():
    """T = 0 through the angle generator's conv (which conv1d alone refuses)."""
    module = SelectiveRoPE(HIDDEN, KEY_HEADS, HEAD_DIM, conv_size=4)
    q, k, x = torch.randn(2, 5, HEADS, HEAD_DIM), torch.randn(2, 5, KEY_HEADS, HEAD_DIM), torch.randn(2, 5, HIDDEN)
    _, _, state = module(q, k, x, use_cache=True)
    q0, k0, after = module(q[:, :0], k[:, :0], x[:, :0], state=state, use_cache=True)
    assert q0.shape == (2, 0, HEADS, HEAD_DIM) and k0.shape == (2, 0, KEY_HEADS, HEAD_DIM)
    assert all(torch.equal(a, b) for a, b in zip(after, state))


def test_rope_state_checked():
    module = RoPE(HEAD_DIM)
    q = torch.zeros(2, 3, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="state.position must have shape"):
        module(q, q, state=RoPEState(torch.zeros(3, dtype=torch.long)))
    with pytest.raises(TypeError, match="integer token counts"):
        module(q, q, state=RoPEState(torch.full((2,), 2.5)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the projection kernel's cast)")])])
@pytest.mark.parametrize("kind,options", CONFIGS, ids=IDS)
def test_the_hosts_cast_is_shared(kind, options, device):
    """Under autocast the host's maps read ``position.host_input(x)``: x cast once (bitwise
    autocast's cast), handed back to the encoding as ``x_cast``. Selective RoPE writes that copy
    in its projection's pass over x, keeps the projection for the forward that follows, and its
    backward adds the maps' gradient into dx. The rotated q and k are those of the plain cast
    without sharing (bitwise on the CPU; on CUDA within 1e-4, see below), and x's gradient through
    both the host's map and the rotation equal up to one rounding: the normalisation's -r²(dy·y)·x
    term then reads x rounded to bf16, as its products do."""
    from srope.modules import PositionEncoding

    module = make_module(kind, options, dtype=torch.float32).to(device)
    q, k, x = (t.to(device) for t in make_inputs(2, 37, seed=8, dtype=torch.float32))
    x.requires_grad_()
    host_weight = randn(5, HIDDEN, seed_gen=generator(9), dtype=torch.float32).to(device)
    assert module.host_input(x).dtype == x.dtype and torch.equal(module.host_input(x), x)

    def run(shared: bool):
        with torch.autocast(device, dtype=torch.bfloat16):
            x_in = module.host_input(x) if shared else PositionEncoding.host_input(module, x)
            fused = getattr(module, "_pending", None) is not None
            host = torch.nn.functional.linear(x_in, host_weight)
            out_q, out_k, _ = module(q, k, x, x_cast=x_in if shared else None)
            assert getattr(module, "_pending", None) is None  # the forward took it
        loss = host.float().square().sum() + (out_q.float() * q).sum() + (out_k.float() * k).sum()
        return x_in, out_q, out_k, torch.autograd.grad(loss, x)[0], fused

    shared, base = run(True), run(False)
    assert shared[4] == (kind == "selective_rope") and not base[4]
    assert shared[0].dtype == torch.bfloat16 and torch.equal(shared[0], x.detach().bfloat16())
    if device == "cpu":
        assert torch.equal(shared[1], base[1]) and torch.equal(shared[2], base[2])
    else:
        # Not bitwise on an H100 (2026-12-07, all four Selective RoPE configurations): the projection
        # kernel's variant that also writes the cast compiles apart from the one that does not, and
        # (presumably) sums each token's norm in another order, so the angles differ in their last
        # bits. A wrong route would differ by O(1).
        assert rel_err(shared[1], base[1]) < 1e-4 and rel_err(shared[2], base[2]) < 1e-4
    assert rel_err(shared[3], base[3]) < 1e-3


def test_a_pending_projection_serves_only_its_own_x():
    """host_input's projection is for the forward with the same x: a forward with another x
    (or one without host_input before it) projects its own."""
    module = make_module("selective_rope", {}, dtype=torch.float32)
    q, k, x = make_inputs(2, 7, seed=8, dtype=torch.float32)
    other = x + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = module(q, k, other)[:2]
        module.host_input(x)
        got = module(q, k, other)[:2]
    assert module._pending is None
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("kind", ["nope", "rope", "selective_rope"])
def test_x_of_another_shape_is_refused(kind):
    module = make_module(kind, {}, dtype=torch.float32)
    q, k, x = make_inputs(1, 4, seed=10, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"x must be the block input \[B, T, hidden\] = \[1, 4, hidden\]"):
        module(q, k, x[:, :3])
    with pytest.raises(ValueError, match=r"need the same \[B, T\]"):
        module(q, k[:, :3], x)


@pytest.mark.parametrize("batch", ["dense", "padded", "packed"])
@pytest.mark.parametrize("host", ["gla", "gated_deltanet", "attention"])
def test_host_layers_under_autocast_match_the_base_route(monkeypatch, host, batch):
    """A host layer under autocast with Selective RoPE: its output and x's gradient with the
    host's cast shared by the generator equal those with the generator keeping x itself (the
    base route), for dense, left-padded and packed batches: the output bitwise, the gradient up to the rounding of x
    in the normalisation's backward term (see test_the_hosts_cast_is_shared)."""
    from srope.layers import Attention, GatedDeltaNet, GatedLinearAttention

    layers = {"gla": (GatedLinearAttention, dict(num_heads=4, use_short_conv=True)),
              "gated_deltanet": (GatedDeltaNet, dict(num_heads=4, head_dim=16)), "attention": (Attention, dict(num_heads=4))}
    cls, options = layers[host]
    torch.manual_seed(0)
    layer = cls(hidden_size=64, position={"type": "selective_rope"}, **options)
    x = randn(2, 33, 64, seed_gen=generator(11), dtype=torch.float32).requires_grad_()
    kwargs = {}
    if batch == "padded":
        mask = torch.ones(2, 33, dtype=torch.long)
        mask[1, :7] = 0
        kwargs = dict(attention_mask=mask)
    elif batch == "packed":
        x = randn(1, 40, 64, seed_gen=generator(12), dtype=torch.float32).requires_grad_()
        kwargs = dict(cu_seqlens=torch.tensor([0, 9, 9, 31, 40]))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x * 1.0, **kwargs)[0]
        return out, torch.autograd.grad(out.float().square().sum(), x)[0]

    shared = run()
    monkeypatch.setattr(SelectiveRoPE, "shared_projection", lambda self, x, x_cast: None)
    base = run()
    assert torch.equal(shared[0], base[0]) and rel_err(shared[1], base[1]) < 2e-4


def test_the_first_difference_makes_its_taps_on_the_device():
    """Made there, not copied from the host: a CUDA graph cannot capture a host-to-device copy
    (the captured copying step with ``skip_conv`` failed that way)."""
    from srope.modules.conv import FirstDifference

    taps = FirstDifference(3).kernel(torch.device("meta"))
    assert taps.device.type == "meta" and taps.shape == (3, 2)
    assert FirstDifference(3).kernel().tolist() == [[-1.0, 1.0]] * 3
