"""The fused per-head phase gate around the generator's conv (srope.ops.triton.head_gate)
against float64 torch, forward and backward, interpreted on the CPU or compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from srope.ops.triton.head_gate import apply_head_gate, conv_head_gate, split_head_gate
from tests.helpers import generator, randn, rel_err

# (tokens, heads, pairs): one block and a partial one, odd sizes, the benchmark's head shape.
SHAPES = [(1, 1, 1), (37, 3, 5), (70, 4, 64), (16, 2, 16)]


def reference_split(y, gate_bias, pairs):
    return y[..., :pairs].flatten(1), torch.sigmoid(y[..., pairs:].sum(1) + gate_bias)


def reference_apply(c, s, e):
    heads = s.shape[1]
    value = c.unflatten(1, (heads, -1))
    return (value if e is None else value + e) * s[..., None]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def check_against_float64(fused, reference, inputs, seed):
    """Outputs and every input's gradient (for fresh random output gradients) of the
    float32 kernels within float32 rounding of float64 torch."""
    ours, exact = leaves(*inputs), leaves(*(t.double() for t in inputs))
    out, out64 = fused(*ours), reference(*exact)
    out, out64 = (out, out64) if isinstance(out, tuple) else ((out,), (out64,))
    gen = generator(seed)
    grads = [randn(*o.shape, seed_gen=gen) for o in out64]
    for o, o64 in zip(out, out64):
        assert o.dtype == torch.float32 and o.shape == o64.shape and rel_err(o, o64) < 1e-6
    torch.autograd.backward(out, [g.to(out[0].device, torch.float32) for g in grads])
    torch.autograd.backward(out64, [g.to(out64[0].device, torch.float64) for g in grads])
    for t, t64 in zip(ours, exact):
        assert t.grad is not None and t.grad.shape == t64.shape and rel_err(t.grad, t64.grad) < 1e-6


@pytest.mark.parametrize("tokens,heads,pairs", SHAPES)
def test_split_matches_float64(tokens, heads, pairs, device):
    gen = generator(tokens + heads)
    y = randn(tokens, heads, pairs + heads, seed_gen=gen, scale=2.0, dtype=torch.float32).to(device)
    gate_bias = randn(heads, seed_gen=gen, dtype=torch.float32).to(device)
    check_against_float64(lambda a, b: split_head_gate(a, b, pairs), lambda a, b: reference_split(a, b, pairs), (y, gate_bias), seed=1)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("tokens,heads,pairs", SHAPES)
def test_apply_matches_float64(tokens, heads, pairs, bias, device):
    gen = generator(tokens * heads)
    c = randn(tokens, heads * pairs, seed_gen=gen, scale=2.0, dtype=torch.float32).to(device)
    s = torch.rand(tokens, heads, generator=gen).to(device)
    e = randn(heads, pairs, seed_gen=gen, dtype=torch.float32).exp().to(device) if bias else None
    if bias:
        check_against_float64(apply_head_gate, reference_apply, (c, s, e), seed=2)
    else:
        check_against_float64(lambda a, b: apply_head_gate(a, b), lambda a, b: reference_apply(a, b, None), (c, s), seed=2)


def test_strided_inputs_and_empty(device):
    """Non-contiguous inputs give the contiguous inputs' results; zero tokens give empty outputs."""
    gen = generator(5)
    y = randn(9, 2, 7, seed_gen=gen, dtype=torch.float32).to(device)
    wide = torch.zeros(9, 2, 14, device=device)
    wide[..., ::2] = y
    gate_bias = torch.zeros(2, device=device)
    assert all(torch.equal(a, b) for a, b in zip(split_head_gate(wide[..., ::2], gate_bias, 5), split_head_gate(y, gate_bias, 5)))
    u, s = split_head_gate(y[:0], gate_bias, 5)
    assert u.shape == (0, 10) and s.shape == (0, 2)
    assert apply_head_gate(u, s).shape == (0, 2, 5)


def test_gradients_deterministic(device):
    """Token reductions (gate bias, e) are per-block partial sums in a fixed order: two
    backward passes give bit-equal gradients."""
    gen = generator(6)
    c, s, e = randn(300, 8, seed_gen=gen, dtype=torch.float32).to(device), torch.rand(300, 2, generator=gen).to(device), randn(2, 4, seed_gen=gen, dtype=torch.float32).to(device)
    grads = []
    for _ in range(2):
        inputs = leaves(c, s, e)
        apply_head_gate(*inputs).square().sum().backward()
        grads.append([t.grad for t in inputs])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


BAD = [
    ("split dtype", lambda d: split_head_gate(torch.zeros(3, 2, 6, dtype=torch.float64, device=d), torch.zeros(2, dtype=torch.float64, device=d), 4), TypeError, "float32"),
    ("split width", lambda d: split_head_gate(torch.zeros(3, 2, 5, device=d), torch.zeros(2, device=d), 4), ValueError, r"pairs \+ H"),
    ("split gate bias", lambda d: split_head_gate(torch.zeros(3, 2, 6, device=d), torch.zeros(3, device=d), 4), ValueError, "gate_bias"),
    ("apply heads", lambda d: apply_head_gate(torch.zeros(3, 7, device=d), torch.zeros(3, 2, device=d)), ValueError, r"H·R"),
    ("apply e", lambda d: apply_head_gate(torch.zeros(3, 8, device=d), torch.zeros(3, 2, device=d), torch.zeros(4, 2, device=d)), ValueError, "e must have shape"),
]


@pytest.mark.parametrize("name,call,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(name, call, error, match, device):
    with pytest.raises(error, match=match):
        call(device)


def test_opcheck(device):
    from srope.ops.triton import head_gate

    gen = generator(7)
    y, gate_bias = randn(5, 2, 5, seed_gen=gen, dtype=torch.float32).to(device), randn(2, seed_gen=gen, dtype=torch.float32).to(device)
    torch.library.opcheck(head_gate._split_op, (y, gate_bias, 3))
    c, s, e = randn(5, 6, seed_gen=gen, dtype=torch.float32).to(device), torch.rand(5, 2, generator=gen).to(device), randn(2, 3, seed_gen=gen, dtype=torch.float32).to(device)
    for bias in (e, None):
        torch.library.opcheck(head_gate._apply_op, (c, s, bias))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("packing", ["dense", "padded", "packed"])
def test_module_fused_gate_matches_float64(monkeypatch, bias, packing, device):
    """SelectiveRoPE with the standard gate through the fused kernels (FUSED_GATE "always":
    the fused conv for dense rows and packed sequences, the conv then the fused gate for
    padded rows) against the same module in float64 through torch: rotated q/k and every
    gradient (parameters, q, k, x); the torch route in float32 agrees as well."""
    from srope.modules import selective_rope as module

    torch.manual_seed(11)
    layer = module.SelectiveRoPE(48, 3, 10, gate="standard", bias=bias, conv_size=3).to(device)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    gen = generator(12)
    batch, length = (1, 23) if packing == "packed" else (2, 13)
    q, k = (randn(batch, length, 3, 10, seed_gen=gen, dtype=torch.float32).to(device) for _ in range(2))
    x = randn(batch, length, 48, seed_gen=gen, dtype=torch.float32).to(device)
    options = {}
    if packing == "padded":
        options["attention_mask"] = torch.tensor([[1] * 13, [0] * 4 + [1] * 9], device=device)
    elif packing == "packed":
        options["cu_seqlens"] = torch.tensor([0, 7, 8, 23], dtype=torch.int32, device=device)
    grads = [randn(batch, length, 3, 10, seed_gen=gen) for _ in range(2)]

    def run(mode, dtype):
        monkeypatch.setattr(module, "FUSED_GATE", mode)
        copy = layer.to(dtype)
        inputs = [t.to(dtype).detach().requires_grad_() for t in (q, k, x)]
        out = copy(*inputs, **options)[:2]
        torch.autograd.backward(out, [g.to(device, dtype) for g in grads])
        result = [*out, *(t.grad for t in inputs), *(p.grad.clone() for p in copy.parameters())]
        copy.zero_grad(set_to_none=True)
        return result

    from srope.ops.triton import head_gate

    taken = []
    for name in ("conv_head_gate", "apply_head_gate"):
        original = getattr(head_gate, name)
        monkeypatch.setattr(head_gate, name, lambda *a, _f=original, _n=name, **k: (taken.append(_n), _f(*a, **k))[1])
    exact = run("never", torch.float64)
    assert taken == []
    fused = run("always", torch.float32)
    # Padded rows take fla's or torch's conv and the fused gate; dense and packed the fused conv.
    assert taken == ["apply_head_gate" if packing == "padded" else "conv_head_gate"]
    unfused = run("never", torch.float32)
    for a, b, c in zip(fused, unfused, exact):
        assert rel_err(a, c) < 1e-5 and rel_err(b, c) < 1e-5


def reference_conv(u, weight, conv_bias, s, e, bounds, silu):
    """Per sequence ``(start, end)``: F.conv1d with W-1 zeros in front, the activation, then
    bias and gate as in reference_apply."""
    width, channels = weight.shape[1], weight.shape[0]
    rows = []
    for start, end in bounds:
        history = torch.nn.functional.pad(u[start:end].T[None], (width - 1, 0))
        rows.append(torch.nn.functional.conv1d(history, weight[:, None, :], conv_bias, groups=channels)[0].T)
    pre = torch.cat(rows)
    return reference_apply(torch.nn.functional.silu(pre) if silu else pre, s, e)


CONV_CASES = [
    # (heads, pairs, width, lengths of the sequences, packed)
    (1, 1, 1, [5], False),
    (3, 5, 4, [37, 37], False),
    (2, 64, 4, [70], False),
    (2, 3, 2, [1, 2, 17, 3, 40], True),
    (4, 16, 4, [3, 1, 66, 4], True),
]


@pytest.mark.parametrize("silu", [True, False], ids=["silu", "linear"])
@pytest.mark.parametrize("extras", [True, False], ids=["biases", "no-biases"])
@pytest.mark.parametrize("heads,pairs,width,lengths,packed", CONV_CASES)
def test_conv_matches_float64(heads, pairs, width, lengths, packed, extras, silu, device):
    """The fused conv + activation + bias + gate against per-sequence F.conv1d in float64:
    output and the gradients of u, the taps, the conv bias, the gate and e; dense rows
    (every row restarts) and packed sequences (including ones shorter than the conv)."""
    gen = generator(heads * 100 + width)
    count = sum(lengths)
    bounds, start = [], 0
    for length in lengths:
        bounds.append((start, start + length))
        start += length
    u = randn(count, heads * pairs, seed_gen=gen, dtype=torch.float32).to(device)
    weight = randn(heads * pairs, width, seed_gen=gen, dtype=torch.float32).to(device)
    s = torch.rand(count, heads, generator=gen).to(device)
    conv_bias = randn(heads * pairs, seed_gen=gen, dtype=torch.float32).to(device) if extras else None
    e = randn(heads, pairs, seed_gen=gen, dtype=torch.float32).exp().to(device) if extras else None
    where = {"seq_len": lengths[0]}
    if packed:
        where = {"positions": torch.cat([torch.arange(length, dtype=torch.int32) for length in lengths]).to(device)}
    activation = "silu" if silu else None
    names = ["u", "weight", "s"] + (["conv_bias", "e"] if extras else [])
    inputs = [u, weight, s] + ([conv_bias, e] if extras else [])

    def fused(*args):
        named = dict(zip(names, args))
        return conv_head_gate(named.pop("u"), named.pop("weight"), named.pop("s"), activation=activation, **named, **where)

    def exact(*args):
        named = dict(zip(names, args))
        return reference_conv(named["u"], named["weight"], named.get("conv_bias"), named["s"], named.get("e"), bounds, silu)

    check_against_float64(fused, exact, inputs, seed=3)


def test_conv_bad_inputs(device):
    u, s, w = torch.zeros(6, 4, device=device), torch.zeros(6, 2, device=device), torch.zeros(4, 3, device=device)
    with pytest.raises(ValueError, match="exactly one of"):
        conv_head_gate(u, w, s)
    with pytest.raises(ValueError, match="dividing"):
        conv_head_gate(u, w, s, seq_len=4)
    with pytest.raises(ValueError, match="int32"):
        conv_head_gate(u, w, s, positions=torch.zeros(6, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="weight must be"):
        conv_head_gate(u, torch.zeros(5, 3, device=device), s, seq_len=3)
    with pytest.raises(ValueError, match="activation"):
        conv_head_gate(u, w, s, seq_len=3, activation="relu")
    with pytest.raises(TypeError, match="float32"):
        conv_head_gate(u.double(), w, s, seq_len=3)


def test_conv_opcheck(device):
    from srope.ops.triton import head_gate

    gen = generator(8)
    u, w = randn(7, 6, seed_gen=gen, dtype=torch.float32).to(device), randn(6, 3, seed_gen=gen, dtype=torch.float32).to(device)
    s, cb = torch.rand(7, 2, generator=gen).to(device), randn(6, seed_gen=gen, dtype=torch.float32).to(device)
    e = randn(2, 3, seed_gen=gen, dtype=torch.float32).to(device)
    pos = torch.tensor([0, 1, 2, 0, 0, 1, 2], dtype=torch.int32, device=device)
    torch.library.opcheck(head_gate._conv_op, (u, w, cb, s, e, pos, 1, True))
    torch.library.opcheck(head_gate._conv_op, (u, w, None, s, None, None, 7, False))


def test_module_decode_after_fused_prefill(monkeypatch, device):
    """Prefill through the fused conv (its final conv state from the inputs), then one-token
    steps with the cache: the same rotated q/k as one prefill of the whole sequence."""
    from srope.modules import selective_rope as module

    monkeypatch.setattr(module, "FUSED_GATE", "always")
    torch.manual_seed(13)
    layer = module.SelectiveRoPE(32, 2, 8, gate="standard", bias=True, conv_size=4).to(device).eval()
    gen = generator(14)
    q, k = (randn(2, 9, 2, 8, seed_gen=gen, dtype=torch.float32).to(device) for _ in range(2))
    x = randn(2, 9, 32, seed_gen=gen, dtype=torch.float32).to(device)
    with torch.no_grad():
        whole = layer(q, k, x)[:2]
        out_q, out_k, state = layer(q[:, :6], k[:, :6], x[:, :6], use_cache=True)
        steps = [(out_q, out_k)]
        for t in range(6, 9):
            step_q, step_k, state = layer(q[:, t:t + 1], k[:, t:t + 1], x[:, t:t + 1], state=state, use_cache=True)
            steps.append((step_q, step_k))
    for got, expected in zip((torch.cat([s[0] for s in steps], 1), torch.cat([s[1] for s in steps], 1)), whole):
        assert rel_err(got, expected) < 1e-5
