"""The Triton kernels of the generator's projection (srope.ops.generator.projection_kernels), its
float32 forward and its fused backward, against float64, interpreted on the CPU or
compiled on CUDA; and the projection that uses them on CUDA against its torch routes."""

from __future__ import annotations

import pytest
import torch

from srope import backend
from srope.ops.generator import projection
from srope.ops.generator import projection_kernels as triton_projection
from srope.ops.generator.projection_kernels import column_blocks, projection_backward, projection_forward, slab_tokens
from tests.helpers import generator, randn, rel_err
from tests.conftest import INTERPRET

pytestmark = pytest.mark.kernels  # Triton kernels: the pass of their own (tests/conftest.py)

SHAPES = [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68)]
# (tokens, heads, chunk, width): one input tile or several (the interpreter's tile is 16
# tokens x 16 inputs), one or two column tiles, widths below 16 and past a power of two.
FORWARD_SHAPES = [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68), (5, 2, 16, 5), (33, 1, 48, 130), (17, 2, 7, 33)]


def float64_forward(x, weight, eps):
    """y, r and the error scale ``|x̂| @ |weight|`` of every output, in float64."""
    x64, w64 = x.double(), weight.double()
    r = torch.rsqrt(x64.square().sum(-1) + eps)
    x_hat = x64 * r[..., None]
    return torch.einsum("nhi,him->nhm", x_hat, w64), r, torch.einsum("nhi,him->nhm", x_hat.abs(), w64.abs())


def torch_float32_forward(x, weight, eps):
    inv_norm = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square() + eps)
    return torch.bmm(x.transpose(0, 1), weight).transpose(0, 1) * inv_norm[..., None]


@pytest.mark.parametrize("norm_pass", ["shipped", "varied"])
@pytest.mark.parametrize("count,heads,chunk,width", FORWARD_SHAPES)
def test_forward_is_float32_accurate(count, heads, chunk, width, norm_pass, device, monkeypatch):
    """The split float16 products are as accurate as float32 ones: every output within
    1e-6 of its error scale ``|x̂|·|w|`` of float64, and overall no further from float64 than
    the float32 cuBLAS route (plus float32 rounding). One column 1e-6 times smaller than the
    rest (its power-of-two scale keeps its splits normal), one all zero, inputs of scale 3
    (r far from 1); outputs poisoned with NaN before. Also with the norm's pass varied: in
    wider chunks than the products' under the interpreter, and unpipelined in 32-input
    chunks on the GPU."""
    if norm_pass != "shipped":
        if INTERPRET:
            monkeypatch.setattr(triton_projection, "INTERPRETED_FORWARD", ((16, 16, 4, 1), (32, 1)))
        else:
            monkeypatch.setattr(triton_projection, "NORM_PASS", (32, 1))  # (shipped: 64 inputs, two stages)
    gen = generator(count * 7 + width)
    x = randn(count, heads, chunk, seed_gen=gen, scale=3.0).to(device, torch.float32)
    weight = randn(heads, chunk, width, seed_gen=gen).to(device, torch.float32) / 16
    weight[:, :, 0] *= 1e-6
    if width > 2:
        weight[:, :, 1] = 0.0
    y, inv_norm, _ = projection_forward(x, weight, 1e-6)
    expected, r, scale = float64_forward(x, weight, 1e-6)
    assert y.dtype == inv_norm.dtype == torch.float32 and y.shape == expected.shape and inv_norm.shape == r.shape
    assert ((inv_norm.double() - r).abs() <= 4e-7 * r).all()
    assert ((y.double() - expected).abs() <= 1e-6 * scale).all()
    if width > 2:
        assert (y[..., 1] == 0).all()
    small = (y[..., 0].double() - expected[..., 0]).abs() <= 1e-6 * scale[..., 0]
    assert small.all() and scale[..., 0].max() < 1e-6
    route = torch_float32_forward(x, weight, 1e-6)
    assert rel_err(y, expected) <= 2 * rel_err(route, expected) + 1e-7


def test_forward_zero_rows_and_strided_tokens(device):
    """A zero input row gives zero outputs and r = ε^(-1/2); x may be a view with any token stride."""
    gen = generator(3)
    x = randn(9, 2, 16, seed_gen=gen).to(device, torch.float32)
    x[4] = 0.0
    weight = randn(2, 16, 18, seed_gen=gen).to(device, torch.float32)
    y, inv_norm, _ = projection_forward(x, weight, 1e-4)
    assert (y[4] == 0).all() and torch.allclose(inv_norm[4], torch.full_like(inv_norm[4], 100.0))
    wide = torch.zeros(9, 3, 2, 16, device=device)
    wide[:, 1] = x
    strided = projection_forward(wide[:, 1], weight, 1e-4)
    assert torch.equal(strided[0], y) and torch.equal(strided[1], inv_norm)


def assert_rounded(low, exact, dtype):
    """``low`` is ``exact`` rounded to ``dtype``: to nearest when compiled; Triton's
    interpreter rounds toward zero, so there one ulp."""
    assert low.dtype == dtype and low.shape == exact.shape
    if INTERPRET:
        ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
        assert ((low.float() - exact).abs() <= exact.abs() * ulp).all()
    else:
        assert torch.equal(low, exact.to(dtype))


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_forward_writes_the_cast(cast, device):
    """With ``cast`` the kernel also writes x rounded to that dtype (to nearest when compiled;
    the interpreter rounds toward zero: one ulp there), from any token stride, and y and r
    stay float32-accurate (another compiled kernel: the compiler may contract its sums
    differently, so not always bitwise the call without it on the H200); with no outputs r
    and the cast still come out."""
    gen = generator(6)
    wide = randn(37, 3, 3, 24, seed_gen=gen, scale=3.0).to(device, torch.float32)
    x = wide[:, 1]
    weight = randn(3, 24, 21, seed_gen=gen).to(device, torch.float32)
    y, inv_norm, x_cast = projection_forward(x, weight, 1e-6, cast)
    plain = projection_forward(x, weight, 1e-6)
    expected, r, scale = float64_forward(x, weight, 1e-6)
    assert plain[2] is None and ((y.double() - expected).abs() <= 1e-6 * scale).all()
    assert ((inv_norm.double() - r).abs() <= 4e-7 * r).all() and rel_err(y, plain[0]) < 1e-6
    assert_rounded(x_cast, x, cast)
    y, inv_norm, x_cast = projection_forward(x, weight[..., :0].contiguous(), 1e-6, cast)
    assert y.shape == (37, 3, 0) and rel_err(inv_norm, plain[1]) < 1e-6 and torch.equal(x_cast, x.to(cast))


def test_column_blocks():
    assert [column_blocks(m) for m in (1, 16, 17, 21, 64, 68, 130, 256)] == [
        (16, 0), (16, 0), (16, 16), (16, 16), (64, 0), (64, 16), (128, 16), (256, 0)]


FORWARD_BAD = [
    ("x dtype", dict(x=torch.zeros(4, 2, 8, dtype=torch.float64)), TypeError, "float32"),
    ("weight dtype", dict(weight=torch.zeros(2, 8, 5, dtype=torch.bfloat16)), TypeError, "float32"),
    ("shapes", dict(weight=torch.zeros(2, 7, 5)), ValueError, "expected x"),
    ("eps", dict(eps=-1.0), ValueError, "eps"),
]


@pytest.mark.parametrize("name,overrides,error,match", FORWARD_BAD, ids=[b[0] for b in FORWARD_BAD])
def test_forward_bad_inputs(name, overrides, error, match, device):
    args = dict(x=torch.zeros(4, 2, 8), weight=torch.zeros(2, 8, 5), eps=1e-6) | overrides
    args = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in args.items()}
    with pytest.raises(error, match=match):
        projection_forward(**args)


def test_opcheck_forward(device):
    from srope.ops.generator.projection_kernels import _forward_op

    gen = generator(4)
    x = randn(5, 2, 16, seed_gen=gen).to(device, torch.float32)
    weight = randn(2, 16, 18, seed_gen=gen).to(device, torch.float32)
    for cast, split in ((None, None), (torch.bfloat16, None), (None, 11), (torch.bfloat16, 16)):
        torch.library.opcheck(_forward_op.op, (x, weight, 1e-6, cast, split))


# (tokens, heads, chunk, width, split): the GLA-370M head split (64 + 4 outputs), parts
# narrower than a tile or not a power of two, a one-column part either side.
SPLITS = [(70, 2, 40, 68, 64), (37, 3, 24, 21, 5), (33, 1, 48, 130, 100), (17, 2, 7, 33, 1), (9, 2, 16, 18, 17)]


@pytest.mark.parametrize("count,heads,chunk,width,split", SPLITS)
def test_forward_split_writes_the_parts(count, heads, chunk, width, split, device):
    """With ``split`` the columns come as two contiguous tensors, each output as accurate as
    unsplit (within 1e-6 of its float64 error scale) and the same r; poisoned before."""
    gen = generator(count + split)
    x = randn(count, heads, chunk, seed_gen=gen, scale=3.0).to(device, torch.float32)
    weight = randn(heads, chunk, width, seed_gen=gen).to(device, torch.float32) / 16
    (first, rest), inv_norm, _ = projection_forward(x, weight, 1e-6, split=split)
    expected, r, scale = float64_forward(x, weight, 1e-6)
    assert first.shape == (count, heads, split) and rest.shape == (count, heads, width - split)
    assert first.is_contiguous() and rest.is_contiguous()
    assert ((torch.cat([first, rest], -1).double() - expected).abs() <= 1e-6 * scale).all()
    assert torch.equal(inv_norm, projection_forward(x, weight, 1e-6)[1])


@pytest.mark.parametrize("split", [0, 68, True, 2.0])
def test_forward_bad_split(split, device):
    with pytest.raises(ValueError, match="split"):
        projection_forward(torch.zeros(4, 2, 8, device=device), torch.zeros(2, 8, 68, device=device), 1e-6, split=split)


GRAD_SHAPES = [(1, 1, 16, 16), (37, 3, 24, 21), (70, 2, 40, 68), (130, 2, 7, 5)]
# (tokens, heads, chunk, width): under the interpreter (16-token steps, 32-token slabs, 16-input
# slices) one slab or up to five (the last partial), one input slice or several with a
# masked rest, one column tile (16) or two (21, 68), widths below a tile.


def grad_inputs(count, heads, chunk, width, dtype, device, seed=0, exact=False):
    """dy, y, inv_norm, weight (in ``dtype``) and x; with ``exact``, x and dy representable in
    ``dtype`` and r powers of two, so that the kernel's 16-bit roundings are exact."""
    gen = generator(seed)
    dy = randn(count, heads, width, seed_gen=gen).to(device, torch.float32)
    y = randn(count, heads, width, seed_gen=gen).to(device, torch.float32)
    inv_norm = randn(count, heads, seed_gen=gen).abs().add(0.1).to(device, torch.float32)
    weight = randn(heads, chunk, width, seed_gen=gen).to(device, dtype)
    x = randn(count, heads, chunk, seed_gen=gen, scale=3.0).to(device, torch.float32)
    if exact:
        dy, x = dy.to(dtype).float(), x.to(dtype).float()
        inv_norm = torch.exp2(torch.round(torch.log2(inv_norm)))
    return dy, y, inv_norm, weight, x


def float64_backward(dy, y, inv_norm, weight, x, dtype):
    """dx and dw in float64 from dz = r·dy and x rounded to ``dtype`` to nearest."""
    dz = (dy * inv_norm[..., None]).to(dtype).double()
    r = inv_norm.double()
    dx = torch.einsum("nhm,him->nhi", dz, weight.double()) - (r.square() * (dy.double() * y.double()).sum(-1))[..., None] * x.double()
    return dx, torch.einsum("nhi,nhm->him", x.to(dtype).double(), dz)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("count,heads,chunk,width", GRAD_SHAPES)
def test_backward_matches_float64(dtype, count, heads, chunk, width, device):
    """dx = dz @ Wᵀ - r²(dy·y)·x and dw = Σ_n x_lowᵀ dz to float32 accuracy, on inputs whose
    16-bit roundings are exact (only the float32 sums differ from float64); deterministic;
    without the weight gradient the same dx (to float32 rounding). Outputs poisoned with NaN before."""
    args = grad_inputs(count, heads, chunk, width, dtype, device, exact=True)
    dx, dw = projection_backward(*args)
    expected_dx, expected_dw = float64_backward(*args, dtype)
    assert dx.dtype == dw.dtype == torch.float32 and dx.shape == expected_dx.shape and dw.shape == expected_dw.shape
    assert rel_err(dx, expected_dx) < 1e-6 and rel_err(dw, expected_dw) < 1e-6
    again = projection_backward(*args)
    assert torch.equal(again[0], dx) and torch.equal(again[1], dw)
    # Another compiled kernel (WEIGHT_GRAD is a constexpr): the same sums, but the compiler
    # may contract them differently (bit-equal under the interpreter, not always on the H200).
    alone = projection_backward(*args, weight_grad=False)
    assert alone[1] is None and rel_err(alone[0], expected_dx) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_backward_rounds_to_nearest(dtype, device):
    """On general inputs dz and x are rounded to the weight's dtype to nearest when compiled
    (the gradients then match float64 of the rounded values to float32 accuracy). Triton's
    interpreter rounds toward zero; there only the rounding's size is checked."""
    args = grad_inputs(70, 2, 40, 68, dtype, device, seed=3)
    dx, dw = projection_backward(*args)
    expected_dx, expected_dw = float64_backward(*args, dtype)
    bound = 1e-6 if not INTERPRET else 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    assert rel_err(dx, expected_dx) < bound and rel_err(dw, expected_dw) < bound


def test_backward_adds_the_host_gradient(device):
    """``host_grad`` (the gradient of the forward's cast, any float dtype) is added into dx;
    the weight gradient does not change."""
    args = grad_inputs(70, 2, 40, 68, torch.bfloat16, device, seed=4)
    host_grad = randn(70, 2, 40, seed_gen=generator(7)).to(device, torch.bfloat16)
    dx, dw = projection_backward(*args, host_grad=host_grad)
    plain = projection_backward(*args)
    assert rel_err(dx, plain[0] + host_grad.float()) < 1e-6 and torch.equal(dw, plain[1])
    with pytest.raises(ValueError, match="host_grad"):
        projection_backward(*args, host_grad=host_grad[:, :1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_backward_reads_x_in_the_weights_dtype(dtype, device):
    """x may come as its 16-bit copy (what the projection keeps under autocast): on x that the
    copy represents exactly, the same gradients as from float32 x, in float32."""
    dy, y, inv_norm, weight, x = grad_inputs(70, 2, 40, 68, dtype, device, seed=5, exact=True)
    dx, dw = projection_backward(dy, y, inv_norm, weight, x.to(dtype))
    expected = projection_backward(dy, y, inv_norm, weight, x)
    assert dx.dtype == dw.dtype == torch.float32
    assert rel_err(dx, expected[0]) < 1e-6 and rel_err(dw, expected[1]) < 1e-6
    with pytest.raises(TypeError, match="x must be float32 or the weight's dtype"):
        projection_backward(dy, y, inv_norm, weight, x.to(torch.float16 if dtype == torch.bfloat16 else torch.bfloat16))


def test_slab_tokens():
    assert slab_tokens(100, 64, 1024) == 1024 and slab_tokens(1 << 20, 64, 1024) == 4096
    assert slab_tokens(1_000_003, 64, 1024) % 64 == 0 and -(-1_000_003 // slab_tokens(1_000_003, 64, 1024)) <= 256


def test_backward_reads_strided_tokens(device):
    dy, y, inv_norm, weight, x = grad_inputs(9, 2, 16, 16, torch.bfloat16, device, seed=1)
    wide = torch.zeros(9, 3, 2, 16, device=device)
    wide[:, 1] = x
    strided, dense = projection_backward(dy, y, inv_norm, weight, wide[:, 1]), projection_backward(dy, y, inv_norm, weight, x)
    assert torch.equal(strided[0], dense[0]) and torch.equal(strided[1], dense[1])


def test_backward_without_tokens(device):
    dy, y, inv_norm, weight, x = grad_inputs(0, 2, 16, 5, torch.bfloat16, device)
    dx, dw = projection_backward(dy, y, inv_norm, weight, x)
    assert dx.shape == (0, 2, 16) and torch.equal(dw, torch.zeros(2, 16, 5, device=device))


GRAD_BAD = [
    ("weight dtype", dict(weight=torch.zeros(2, 8, 5)), TypeError, "16-bit|bfloat16"),
    ("x dtype", dict(x=torch.zeros(4, 2, 8, dtype=torch.float64)), TypeError, "float32"),
    ("widths", dict(weight=torch.zeros(2, 8, 6, dtype=torch.bfloat16)), ValueError, "shapes disagree"),
    ("inv_norm", dict(inv_norm=torch.zeros(4, 3)), ValueError, "shapes disagree"),
]


@pytest.mark.parametrize("name,overrides,error,match", GRAD_BAD, ids=[b[0] for b in GRAD_BAD])
def test_backward_bad_inputs(name, overrides, error, match, device):
    args = dict(dy=torch.zeros(4, 2, 5), y=torch.zeros(4, 2, 5), inv_norm=torch.zeros(4, 2),
                weight=torch.zeros(2, 8, 5, dtype=torch.bfloat16), x=torch.zeros(4, 2, 8)) | overrides
    args = {key: value.to(device) for key, value in args.items()}
    with pytest.raises(error, match=match):
        projection_backward(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 333, 4096 + 5])
def test_projection_on_cuda_against_torch_route(monkeypatch, tokens):
    """On CUDA the float32 forward and the bf16 backward take the fused kernels. The forward
    is float32-accurate like cuBLAS's. Both gradients keep their products in float32 where
    the torch route rounds them to bf16 (cuBLAS's bf16 products return bf16: the input
    gradient's before the norm's term is added, the weight gradient's per slab of tokens),
    so they are at least as close to float64, and within bf16 rounding of the torch route's."""
    gen = generator(tokens)
    x64 = randn(tokens, 4, 256, seed_gen=gen, dtype=torch.float64).cuda()
    w64 = randn(4, 256, 68, seed_gen=gen, dtype=torch.float64).cuda() / 16
    grad = randn(tokens, 4, 68, seed_gen=gen, dtype=torch.float64).cuda()

    def run(x, w, dtype):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = projection.normalized_head_projection(x, w, 1e-6, dtype)
        return (y, *torch.autograd.grad(y, (x, w), grad.to(x.dtype)))

    exact = run(x64, w64, None)
    fused = run(x64.float(), w64.float(), torch.bfloat16)
    with backend.use("torch"):
        unfused = run(x64.float(), w64.float(), torch.bfloat16)
    # The forward: both float32-accurate (split float16 products against cuBLAS's float32).
    assert rel_err(fused[0], exact[0]) < 1e-6 and rel_err(unfused[0], exact[0]) < 1e-6
    for index in (1, 2):
        assert rel_err(fused[index], unfused[index]) < 8e-3
        assert rel_err(fused[index], exact[index]) <= rel_err(unfused[index], exact[index]) + 1e-6
    assert rel_err(fused[1], exact[1]) < 2e-2 and rel_err(fused[2], exact[2]) < 2e-2


@pytest.mark.gpu
def test_cast_on_cuda_against_torch_route(monkeypatch):
    """The forward kernel's cast is torch's rounding, and the backward kernel adds the
    cast's gradient into dx as the torch route does. With the cast the backward keeps only
    the bf16 copy of x, so dx's -r²(dy·y)·x term reads x rounded (3e-6 of dx here on the
    CPU's torch route); the weight gradient read the rounded x before too."""
    gen = generator(8)
    calls = _count_kernel_calls(monkeypatch)
    x = randn(4101, 4, 256, seed_gen=gen, dtype=torch.float32).cuda().requires_grad_()  # float32: the kernels' input
    w = (randn(4, 256, 68, seed_gen=gen, dtype=torch.float32).cuda() / 16).requires_grad_()
    grad_y, grad_cast = randn(4101, 4, 68, seed_gen=gen, dtype=torch.float32).cuda(), randn(4101, 4, 256, seed_gen=gen).cuda().bfloat16()

    def run():
        y, x_cast = projection.normalized_head_projection(x, w, 1e-6, torch.bfloat16, torch.bfloat16)
        return (x_cast, *torch.autograd.grad((y, x_cast), (x, w), (grad_y, grad_cast)))

    fused = run()
    plain = torch.autograd.grad(projection.normalized_head_projection(x, w, 1e-6, torch.bfloat16), (x, w), grad_y)
    assert calls == {"forward": 2, "backward": 2}  # both routes above ran the kernels
    assert torch.equal(fused[0], x.detach().bfloat16())
    assert rel_err(fused[1], plain[0] + grad_cast.float()) < 2e-5 and torch.equal(fused[2], plain[1])
    with backend.use("torch"):
        unfused = run()
    assert torch.equal(unfused[0], fused[0]) and rel_err(fused[1], unfused[1]) < 8e-3


@pytest.mark.gpu
def test_callers_copy_on_cuda_matches_the_cast(monkeypatch):
    """A host layer's own bf16 copy of x (``x_low``) takes the kernels as the forward's cast
    does: y and the weight gradient bitwise the same, and dx that of the cast route, whose
    backward kernel adds the copy's gradient itself (here autograd adds it)."""
    gen = generator(9)
    calls = _count_kernel_calls(monkeypatch)
    x = randn(4101, 4, 256, seed_gen=gen, dtype=torch.float32).cuda().requires_grad_()  # float32: the kernels' input
    w = (randn(4, 256, 68, seed_gen=gen, dtype=torch.float32).cuda() / 16).requires_grad_()
    grad_y, grad_copy = randn(4101, 4, 68, seed_gen=gen, dtype=torch.float32).cuda(), randn(4101, 4, 256, seed_gen=gen).cuda().bfloat16()
    y, x_cast = projection.normalized_head_projection(x, w, 1e-6, torch.bfloat16, torch.bfloat16)
    cast = torch.autograd.grad((y, x_cast), (x, w), (grad_y, grad_copy))
    x_low = x.bfloat16()
    y_low = projection.normalized_head_projection(x, w, 1e-6, torch.bfloat16, x_low=x_low)
    low = torch.autograd.grad((y_low, x_low), (x, w), (grad_y, grad_copy))
    assert calls == {"forward": 2, "backward": 2}  # both routes ran the kernels
    assert torch.equal(y_low, y) and torch.equal(low[1], cast[1])
    assert rel_err(low[0], cast[0]) < 1e-6


def _count_kernel_calls(monkeypatch) -> dict[str, int]:
    """Counts the calls of the projection's kernel launches: a CUDA test of the kernels must
    reach them (float64 inputs, say, take the PyTorch route)."""
    from srope.ops.generator import projection_kernels

    calls = {"forward": 0, "backward": 0}
    for name, fn in (("forward", projection_kernels.projection_forward), ("backward", projection_kernels.projection_backward)):
        def counted(*args, _name=name, _fn=fn, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(projection_kernels, f"projection_{name}", counted)
    return calls


def test_opcheck_backward(device):
    from srope.ops.generator.projection_kernels import _backward_op

    dy, y, inv_norm, weight, x = grad_inputs(5, 2, 16, 18, torch.bfloat16, device, seed=2)
    for host_grad, weight_grad in ((None, True), (None, False), (x.to(torch.bfloat16), True)):
        torch.library.opcheck(_backward_op.op, (dy, None, y, None, inv_norm, weight, x, host_grad, weight_grad))
    parts = [t.contiguous() for t in (dy[..., :11], dy[..., 11:], y[..., :11], y[..., 11:])]
    torch.library.opcheck(_backward_op.op, (*parts, inv_norm, weight, x, None, True))


@pytest.mark.parametrize("count,heads,chunk,width,split", SPLITS)
def test_backward_reads_split_parts(count, heads, chunk, width, split, device):
    """dy and y as their two column parts, the second part of dy a broadcast over heads (as
    the gate's gradient comes): the same dx and dw as from the whole tensors, to float32
    accuracy against float64."""
    dy, y, inv_norm, weight, x = grad_inputs(count, 1, chunk, width, torch.bfloat16, device, seed=split, exact=True)
    dy, y, inv_norm, x = dy.expand(-1, heads, -1), y.expand(-1, heads, -1).contiguous(), inv_norm.expand(-1, heads).contiguous(), \
        x.expand(-1, heads, -1).contiguous()
    weight = weight.expand(heads, -1, -1).contiguous()
    rest = dy[:, :1, split:].expand(-1, heads, -1)
    assert heads == 1 or rest.stride(1) == 0
    parts = projection_backward((dy[..., :split].contiguous(), rest), (y[..., :split].contiguous(), y[..., split:].contiguous()),
                                inv_norm, weight, x)
    whole = projection_backward(dy.contiguous(), y, inv_norm, weight, x)
    expected_dx, expected_dw = float64_backward(dy, y, inv_norm, weight, x, torch.bfloat16)
    for got, dense, exact in zip(parts, whole, (expected_dx, expected_dw)):
        assert rel_err(got, exact) < 1e-6 and rel_err(got, dense) < 1e-6


def test_backward_bad_parts(device):
    dy, y, inv_norm, weight, x = grad_inputs(4, 2, 8, 5, torch.bfloat16, device)
    with pytest.raises(TypeError, match="pair"):
        projection_backward((dy,), y, inv_norm, weight, x)
    with pytest.raises(ValueError, match="shapes disagree"):
        projection_backward((dy[..., :2], dy[..., 2:]), (y[..., :3], y[..., 3:]), inv_norm, weight, x)
    with pytest.raises(ValueError, match="shapes disagree"):
        projection_backward((dy[..., :2], dy[..., 2:]), y, inv_norm, weight, x)
