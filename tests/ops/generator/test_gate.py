"""The fused per-head phase gate after the generator's conv (srope.ops.generator.gate)
against float64 torch, forward and backward, interpreted on the CPU or compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from srope import backend
from srope.ops.conv import causal_conv
from srope.ops.generator.gate import apply_head_gate, conv_head_gate
from tests.helpers import generator, randn, rel_err

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)

# (tokens, heads, pairs): one block and a partial one, odd sizes, the benchmark's head shape.
SHAPES = [(1, 1, 1), (37, 3, 5), (70, 4, 64), (16, 2, 16)]


def reference_apply(c, y, gate_bias, e, activation=None):
    heads = y.shape[1]
    value = c.unflatten(1, (heads, -1))
    value = value if activation is None else torch.nn.functional.silu(value)
    gate = torch.sigmoid(y.sum(1) + gate_bias)
    return (value if e is None else value + e) * gate[..., None]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def check_against_float64(fused, reference, inputs, seed, tol=1e-6):
    """Outputs and every input's gradient (for fresh random output gradients) of the
    float32 kernels within float32 rounding of float64 torch; outputs poisoned beforehand
    cannot pass (every output element is written)."""
    ours, exact = leaves(*inputs), leaves(*(t.double() for t in inputs))
    out, out64 = fused(*ours), reference(*exact)
    out, out64 = (out, out64) if isinstance(out, tuple) else ((out,), (out64,))
    gen = generator(seed)
    grads = [randn(*o.shape, seed_gen=gen) for o in out64]
    for o, o64 in zip(out, out64):
        assert o.dtype == torch.float32 and o.shape == o64.shape and rel_err(o, o64) < tol
    torch.autograd.backward(out, [g.to(out[0].device, torch.float32) for g in grads])
    torch.autograd.backward(out64, [g.to(out64[0].device, torch.float64) for g in grads])
    for t, t64 in zip(ours, exact):
        assert t.grad is not None and t.grad.shape == t64.shape and rel_err(t.grad, t64.grad) < tol


def gate_inputs(tokens, heads, pairs, bias, seed, device):
    gen = generator(seed)
    c = randn(tokens, heads * pairs, seed_gen=gen, scale=2.0, dtype=torch.float32).to(device)
    y = randn(tokens, heads, heads, seed_gen=gen, scale=2.0, dtype=torch.float32).to(device)
    gate_bias = randn(heads, seed_gen=gen, dtype=torch.float32).to(device)
    e = randn(heads, pairs, seed_gen=gen, dtype=torch.float32).exp().to(device) if bias else None
    return c, y, gate_bias, e


@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("tokens,heads,pairs", SHAPES)
def test_apply_matches_float64(tokens, heads, pairs, bias, activation, device):
    c, y, gate_bias, e = gate_inputs(tokens, heads, pairs, bias, tokens * heads, device)
    if bias:
        check_against_float64(lambda *a: apply_head_gate(*a, activation), lambda *a: reference_apply(*a, activation),
                              (c, y, gate_bias, e), seed=2)
    else:
        check_against_float64(lambda *a: apply_head_gate(*a, None, activation), lambda *a: reference_apply(*a, None, activation),
                              (c, y, gate_bias), seed=2)


def test_logit_gradient_is_a_broadcast(device):
    """y's gradient is one [N, H] tensor seen through a stride-0 view over the shares."""
    c, y, gate_bias, e = gate_inputs(37, 3, 5, True, 3, device)
    y = y.requires_grad_()
    captured = {}
    y.register_hook(lambda grad: captured.setdefault("grad", grad))
    apply_head_gate(c, y, gate_bias, e).square().sum().backward()
    grad = captured["grad"]
    assert grad.stride(1) == 0 and torch.equal(grad, grad[:, :1].expand_as(grad))


def test_strided_inputs_and_empty(device):
    """Non-contiguous inputs give the contiguous inputs' results; zero tokens give empty outputs."""
    c, y, gate_bias, e = gate_inputs(9, 2, 5, True, 5, device)
    wide = torch.zeros(9, 2, 4, device=device)
    wide[..., ::2] = y
    assert torch.equal(apply_head_gate(c, wide[..., ::2], gate_bias, e), apply_head_gate(c, y, gate_bias, e))
    assert apply_head_gate(c[:0], y[:0], gate_bias, e).shape == (0, 2, 5)
    inputs = leaves(c[:0], y[:0], gate_bias, e)
    apply_head_gate(*inputs).sum().backward()
    assert all(t.grad is not None and not t.grad.any() for t in inputs)


def test_gradients_deterministic(device):
    """Token reductions (gate bias, e) are per-block partial sums in a fixed order: two
    backward passes give bit-equal gradients."""
    c, y, gate_bias, e = gate_inputs(300, 2, 4, True, 6, device)
    grads = []
    for _ in range(2):
        inputs = leaves(c, y, gate_bias, e)
        apply_head_gate(*inputs, "silu").square().sum().backward()
        grads.append([t.grad for t in inputs])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def reference_conv_gate(u, w, conv_bias, y, gate_bias, e, activation=None):
    c = causal_conv(u, w, bias=conv_bias)[0].flatten(0, 1)
    return reference_apply(c, y, gate_bias, e, activation)


def conv_gate_inputs(batch, length, heads, pairs, width, seed, device):
    gen = generator(seed)
    u = randn(batch, length, heads * pairs, seed_gen=gen, scale=2.0, dtype=torch.float32).to(device)
    w = randn(heads * pairs, width, seed_gen=gen, dtype=torch.float32).to(device)
    conv_bias = randn(heads * pairs, seed_gen=gen, dtype=torch.float32).to(device)
    _, y, gate_bias, e = gate_inputs(batch * length, heads, pairs, True, seed + 1, device)
    return u, w, conv_bias, y, gate_bias, e


# (batch, length, heads, pairs, width): rows shorter than the taps, rows ending inside a block
# (and a block spanning rows), odd sizes, the benchmark's head shape, a one-tap conv.
CONV_SHAPES = [(1, 1, 1, 1, 4), (2, 3, 1, 2, 4), (3, 13, 3, 5, 4), (2, 37, 4, 64, 4), (2, 9, 2, 3, 1), (1, 20, 2, 4, 3)]


@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
@pytest.mark.parametrize("biases", ["both", "none", "conv", "e"])
@pytest.mark.parametrize("batch,length,heads,pairs,width", CONV_SHAPES)
def test_conv_gate_matches_float64(batch, length, heads, pairs, width, biases, activation, device):
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(batch, length, heads, pairs, width, batch * length + width, device)
    conv_bias = conv_bias if biases in ("both", "conv") else None
    e = e if biases in ("both", "e") else None
    tensors = [t for t in (u, w, conv_bias, y, gate_bias, e) if t is not None]

    def bind(fn):
        def call(*given):
            given = iter(given)
            return fn(next(given), next(given), next(given) if conv_bias is not None else None, next(given), next(given),
                      next(given) if e is not None else None, activation)
        return call

    # the token sums of the biases' gradients cancel more than the gate's alone: 1e-5
    check_against_float64(bind(conv_head_gate), bind(reference_conv_gate), tensors, seed=3, tol=1e-5)


@pytest.mark.parametrize("batch,length,heads,pairs,width", [(2, 37, 4, 64, 4), (1, 70, 2, 128, 4), (3, 11, 2, 5, 5)])
def test_conv_gate_matches_float64_with_the_gpus_blocks(monkeypatch, batch, length, heads, pairs, width, device):
    """The tokens per program the GPU takes (64 forward; 32, 16 or 8 backward by R and K),
    not the interpreter's 16."""
    from srope.ops.generator import gate as head_gate

    monkeypatch.setattr(head_gate, "INTERPRET_BLOCK_N", 0)
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(batch, length, heads, pairs, width, 4, device)
    check_against_float64(lambda *a: conv_head_gate(*a, "silu"), lambda *a: reference_conv_gate(*a, "silu"),
                          (u, w, conv_bias, y, gate_bias, e), seed=5, tol=1e-5)


def test_strided_inputs_backward(device):
    """Inputs that are views with other strides (a transposed u or weight, a stride-0 weight
    as FirstDifference makes, strided y) give the contiguous inputs' outputs and gradients:
    autograd hands the backward the inputs as given."""
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(2, 9, 2, 3, 4, 11, device)
    views = (u.transpose(1, 2).contiguous().transpose(1, 2), w.t().contiguous().t(), conv_bias,
             torch.stack([y, y], -1)[..., 0], gate_bias, e.t().contiguous().t())
    assert not views[0].is_contiguous() and not views[1].is_contiguous() and not views[3].is_contiguous()
    for fused, reference, inputs in (
        (lambda *a: conv_head_gate(*a, "silu"), lambda *a: reference_conv_gate(*a, "silu"), views),
        (lambda *a: conv_head_gate(*a, "silu"), lambda *a: reference_conv_gate(*a, "silu"),
         (u, torch.tensor([-1.0, 1.0], device=device).expand(6, 2), None, y, gate_bias, e)),
        (lambda *a: apply_head_gate(*a, "silu"), lambda *a: reference_apply(*a, "silu"),
         (views[0].flatten(0, 1).t().contiguous().t(), views[3], gate_bias, views[5])),
    ):
        exact = [None if t is None else t.double().detach().requires_grad_() for t in inputs]
        ours = [None if t is None else t.detach().requires_grad_() for t in inputs]
        out, out64 = fused(*ours), reference(*exact)
        gen = generator(6)
        grad = randn(*out64.shape, seed_gen=gen)
        out.backward(grad.to(out.device, torch.float32))
        out64.backward(grad.to(out64.device, torch.float64))
        assert rel_err(out, out64) < 1e-6
        for t, t64 in zip(ours, exact):
            if t is not None:
                assert t.grad is not None and rel_err(t.grad, t64.grad) < 1e-5


def test_conv_gate_equals_conv_then_gate(device):
    """The fused path gives what the conv followed by apply_head_gate gives (within float32
    rounding: the same sums in the same order are not promised)."""
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(2, 21, 3, 4, 4, 8, device)
    c = causal_conv(u, w, bias=conv_bias)[0].flatten(0, 1)
    assert rel_err(conv_head_gate(u, w, conv_bias, y, gate_bias, e, "silu"), apply_head_gate(c, y, gate_bias, e, "silu")) < 1e-6


def test_conv_gate_deterministic_and_empty(device):
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(3, 50, 2, 4, 4, 9, device)
    grads = []
    for _ in range(2):
        inputs = leaves(u, w, conv_bias, y, gate_bias, e)
        conv_head_gate(*inputs, "silu").square().sum().backward()
        grads.append([t.grad for t in inputs])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    inputs = leaves(u[:, :0], w, conv_bias, y[:0], gate_bias, e)
    out = conv_head_gate(*inputs)
    assert out.shape == (0, 2, 4)
    out.sum().backward()
    assert all(t.grad is not None and not t.grad.any() for t in inputs)


CONV_BAD = [
    ("u rank", lambda d: conv_head_gate(_zeros(6, 8, device=d), _zeros(8, 4, device=d), None, _zeros(6, 2, 2, device=d), _zeros(2, device=d)),
     ValueError, r"u must be \[B, T, H·R\]"),
    ("y tokens", lambda d: conv_head_gate(_zeros(2, 3, 8, device=d), _zeros(8, 4, device=d), None, _zeros(5, 2, 2, device=d), _zeros(2, device=d)),
     ValueError, r"\[B·T, H, H\]"),
    ("weight", lambda d: conv_head_gate(_zeros(2, 3, 8, device=d), _zeros(4, 8, device=d), None, _zeros(6, 2, 2, device=d), _zeros(2, device=d)),
     ValueError, "weight must be"),
    ("conv bias", lambda d: conv_head_gate(_zeros(2, 3, 8, device=d), _zeros(8, 4, device=d), _zeros(7, device=d), _zeros(6, 2, 2, device=d),
                                           _zeros(2, device=d)), ValueError, "conv_bias"),
    ("int32 offsets", lambda d: conv_head_gate(_zeros(1, 1, 1, device=d).expand(2**16, 2**8, 2**8), _zeros(2**8, 4, device=d), None,
                                               _zeros(1, 1, 1, device=d).expand(2**24, 1, 1), _zeros(1, device=d)), ValueError, "int32"),
    ("dtype", lambda d: conv_head_gate(_zeros(2, 3, 8, device=d, dtype=torch.float64), _zeros(8, 4, device=d), None, _zeros(6, 2, 2, device=d),
                                       _zeros(2, device=d)), TypeError, "float32"),
]


@pytest.mark.parametrize("name,call,error,match", CONV_BAD, ids=[b[0] for b in CONV_BAD])
def test_conv_gate_bad_inputs(name, call, error, match, device):
    with pytest.raises(error, match=match):
        call(device)


def _zeros(*shape, device, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=device)


BAD = [
    ("dtype", lambda d: apply_head_gate(_zeros(3, 4, device=d, dtype=torch.float64), _zeros(3, 2, 2, device=d), _zeros(2, device=d)),
     TypeError, "float32"),
    ("y square", lambda d: apply_head_gate(_zeros(3, 4, device=d), _zeros(3, 2, 3, device=d), _zeros(2, device=d)), ValueError, r"\[N, H, H\]"),
    ("heads", lambda d: apply_head_gate(_zeros(3, 7, device=d), _zeros(3, 2, 2, device=d), _zeros(2, device=d)), ValueError, r"H·R"),
    ("tokens", lambda d: apply_head_gate(_zeros(4, 8, device=d), _zeros(3, 2, 2, device=d), _zeros(2, device=d)), ValueError, r"H·R"),
    ("gate bias", lambda d: apply_head_gate(_zeros(3, 8, device=d), _zeros(3, 2, 2, device=d), _zeros(3, device=d)), ValueError, "gate_bias"),
    ("e", lambda d: apply_head_gate(_zeros(3, 8, device=d), _zeros(3, 2, 2, device=d), _zeros(2, device=d), _zeros(4, 2, device=d)),
     ValueError, "e must have shape"),
    ("activation", lambda d: apply_head_gate(_zeros(3, 8, device=d), _zeros(3, 2, 2, device=d), _zeros(2, device=d), None, "gelu"),
     ValueError, "activation"),
]


@pytest.mark.parametrize("name,call,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(name, call, error, match, device):
    with pytest.raises(error, match=match):
        call(device)


def test_opcheck(device):
    from srope.ops.generator import gate as head_gate

    c, y, gate_bias, e = gate_inputs(5, 2, 3, True, 7, device)
    for bias in (e, None):
        for silu in (True, False):
            torch.library.opcheck(head_gate._apply_op.op, (c, y, gate_bias, bias, silu))
    u, w, conv_bias, y, gate_bias, e = conv_gate_inputs(2, 5, 2, 3, 4, 10, device)
    for biases in ((conv_bias, e), (None, None), (conv_bias, None), (None, e)):
        torch.library.opcheck(head_gate._conv_gate_op.op, (u.requires_grad_(), w, biases[0], y, gate_bias, biases[1], True))
        torch.library.opcheck(head_gate._conv_gate_bwd_op.op, (torch.randn(10, 2, 3, device=device), u.detach(), w, biases[0], y,
                                                            gate_bias, biases[1], True))


@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("packing", ["dense", "padded", "packed", "ones", "first-difference"])
def test_module_fused_gate_matches_float64(monkeypatch, bias, packing, activation, device):
    """SelectiveRoPE with the standard gate through the fused kernel and the split
    projection (srope backend "triton")
    against the same module in float64 through torch: rotated q/k and every gradient
    (parameters, q, k, x), with padding or packed sequences; the torch route in float32
    agrees as well."""
    from srope.modules import selective_rope as module

    torch.manual_seed(11)
    layer = module.SelectiveRoPE(48, 3, 10, gate="standard", bias=bias, conv_size=3, conv_activation=activation,
                                 skip_conv=packing == "first-difference").to(device)
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
    elif packing == "ones":  # a mask with no padding: whole rows, the conv inside the gate's kernels
        options["attention_mask"] = torch.ones(batch, length, dtype=torch.long, device=device)
    elif packing == "packed":
        options["cu_seqlens"] = torch.tensor([0, 7, 8, 23], dtype=torch.int32, device=device)
    grads = [randn(batch, length, 3, 10, seed_gen=gen) for _ in range(2)]

    def run(mode, dtype):
        copy = layer.to(dtype)
        inputs = [t.to(dtype).detach().requires_grad_() for t in (q, k, x)]
        with backend.use(mode):
            out = copy(*inputs, **options)[:2]
            torch.autograd.backward(out, [g.to(device, dtype) for g in grads])
        result = [*out, *(t.grad for t in inputs), *(p.grad.clone() for p in copy.parameters())]
        copy.zero_grad(set_to_none=True)
        return result

    exact = run("torch", torch.float64)
    fused = run("triton", torch.float32)
    unfused = run("torch", torch.float32)
    for a, b, c in zip(fused, unfused, exact):
        assert rel_err(a, c) < 1e-5 and rel_err(b, c) < 1e-5


def test_module_decode_after_fused_prefill(monkeypatch, device):
    """Prefill with the fused gate, then one-token steps with the cache: the same rotated
    q/k as one prefill of the whole sequence."""
    from srope.modules import selective_rope as module

    monkeypatch.setattr(backend, "_active", "triton")
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
