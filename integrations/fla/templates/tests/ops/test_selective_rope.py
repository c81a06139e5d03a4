# @header

import pytest
import torch
import torch.nn.functional as F

from fla.modules import SelectiveRotaryEmbedding
from fla.ops.selective_rope import chunk_selective_rope, fused_recurrent_selective_rope, naive_selective_rope
from fla.utils import assert_close, device


def make_inputs(B, T, H, HK, D, R, dtype, N=None):
    q = torch.randn(B, T, H, D, dtype=dtype, device=device).requires_grad_(True)
    k = torch.randn(B, T, HK, D, dtype=dtype, device=device).requires_grad_(True)
    # increments like a Selective RoPE generator's at init: around 0.5, a few above 1
    phi = (0.5 + 0.5 * torch.randn(B, T, HK, R, dtype=torch.float32, device=device)).requires_grad_(True)
    temperature = (500000.0 ** -(torch.arange(R, dtype=torch.float32, device=device) / R)).requires_grad_(True)
    h0 = torch.randn(N or B, HK, R, dtype=torch.float64, device=device).requires_grad_(True)
    return q, k, phi, temperature, h0


def run(fn, q, k, phi, temperature, h0, dq, dk, **kwargs):
    q_rot, k_rot, ht = fn(q, k, phi, temperature, initial_state=h0, output_final_state=True, **kwargs)
    ((q_rot * dq).sum() + (k_rot * dk).sum()).backward()
    grads = [x.grad for x in (q, k, phi, temperature, h0)]
    for x in (q, k, phi, temperature, h0):
        x.grad = None
    return q_rot, k_rot, ht, grads


def compare(ref, tri, ratio):
    for name, r, t in zip(('q', 'k', 'ht'), ref[:3], tri[:3]):
        assert_close(name, r, t, ratio)
    for name, r, t in zip(('dq', 'dk', 'dphi', 'dtemperature', 'dh0'), ref[3], tri[3]):
        assert_close(name, r, t, ratio)


@pytest.mark.parametrize(
    ('B', 'T', 'H', 'HK', 'D', 'R', 'dtype'),
    [
        pytest.param(*test, id="B{}-T{}-H{}-HK{}-D{}-R{}-{}".format(*test))
        for test in [
            (1, 63, 1, 1, 64, 32, torch.float),
            (2, 500, 4, 2, 64, 32, torch.float),
            (2, 1000, 4, 4, 128, 64, torch.float),
            (3, 1024, 8, 2, 128, 48, torch.bfloat16),
            (4, 2048, 4, 4, 128, 64, torch.bfloat16),
        ]
    ],
)
def test_chunk(B, T, H, HK, D, R, dtype):
    torch.manual_seed(42)
    q, k, phi, temperature, h0 = make_inputs(B, T, H, HK, D, R, dtype)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    ref = run(naive_selective_rope, q, k, phi, temperature, h0, dq, dk)
    tri = run(chunk_selective_rope, q, k, phi, temperature, h0, dq, dk)
    compare(ref, tri, 1e-5 if dtype == torch.float else 5e-3)


@pytest.mark.parametrize(
    ('H', 'HK', 'D', 'R', 'cu_seqlens', 'dtype'),
    [
        pytest.param(*test, id="H{}-HK{}-D{}-R{}-cu_seqlens{}-{}".format(*test))
        for test in [
            (4, 2, 64, 32, [0, 15], torch.float),
            (4, 4, 64, 32, [0, 256, 500, 1000], torch.float),
            (8, 2, 128, 64, [0, 15, 100, 300, 1200, 2000], torch.float),
            (4, 4, 128, 64, [0, 1, 100, 300, 1200, 2048], torch.bfloat16),
        ]
    ],
)
def test_chunk_varlen(H, HK, D, R, cu_seqlens, dtype):
    torch.manual_seed(42)
    cu_seqlens = torch.tensor(cu_seqlens, dtype=torch.int32, device=device)
    T, N = int(cu_seqlens[-1]), len(cu_seqlens) - 1
    q, k, phi, temperature, h0 = make_inputs(1, T, H, HK, D, R, dtype, N=N)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    ref = run(naive_selective_rope, q, k, phi, temperature, h0, dq, dk, cu_seqlens=cu_seqlens)
    tri = run(chunk_selective_rope, q, k, phi, temperature, h0, dq, dk, cu_seqlens=cu_seqlens)
    compare(ref, tri, 1e-5 if dtype == torch.float else 5e-3)


@pytest.mark.parametrize(
    ('B', 'T', 'H', 'HK', 'D', 'R', 'dtype'),
    [
        pytest.param(*test, id="B{}-T{}-H{}-HK{}-D{}-R{}-{}".format(*test))
        for test in [
            (2, 63, 4, 2, 64, 32, torch.float),
            (3, 100, 4, 4, 128, 64, torch.bfloat16),
        ]
    ],
)
def test_fused_recurrent(B, T, H, HK, D, R, dtype):
    """Token by token with the carried phase equals one chunked call over the whole sequence."""
    torch.manual_seed(42)
    q, k, phi, temperature, h0 = (x.detach() for x in make_inputs(B, T, H, HK, D, R, dtype))
    ref_q, ref_k, ref_ht = chunk_selective_rope(q, k, phi, temperature, initial_state=h0, output_final_state=True)
    state, outs_q, outs_k = h0, [], []
    for t in range(T):
        q_t, k_t, state = fused_recurrent_selective_rope(
            q[:, t:t + 1], k[:, t:t + 1], phi[:, t:t + 1], temperature, initial_state=state, output_final_state=True,
        )
        outs_q.append(q_t)
        outs_k.append(k_t)
    ratio = 1e-5 if dtype == torch.float else 5e-3
    assert_close('q', ref_q, torch.cat(outs_q, 1), ratio)
    assert_close('k', ref_k, torch.cat(outs_k, 1), ratio)
    assert_close('ht', ref_ht, state, 1e-12)


def in_graph(tensor, name):
    """Whether an autograd node named `name...` made `tensor`."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith(name):
            return True
        stack.extend(parent for parent, _ in node.next_functions)
    return False


def naive_increments(module, x):
    """The module's increments phi in float64 from its parameters (full-rank projection, standard gate)."""
    HK, R = module.num_heads, module.pairs
    chunks = x.double().unflatten(-1, (HK, -1))
    x_hat = chunks / torch.sqrt(chunks.square().sum(-1, keepdim=True) + module.norm_eps)
    w = module.proj_weight.double()
    w = module.proj_gain.double()[:, None, None] * w / w.norm(dim=1, keepdim=True)
    u = torch.einsum('bthi,hir->bthr', x_hat, w).flatten(-2)
    K = module.conv.weight.shape[-1]
    c = F.conv1d(F.pad(u.transpose(1, 2), (K - 1, 0)), module.conv.weight.double(), groups=u.shape[-1]).transpose(1, 2)
    phi = (F.silu(c) if module.conv.activation else c).unflatten(-1, (HK, R))
    if module.bias is not None:
        phi = phi + torch.exp(module.bias.double())
    logits = torch.einsum('bthi,ghi->btg', x_hat, module.gate.weight.double().unflatten(1, (HK, -1)))
    return phi * torch.sigmoid(logits + module.gate.bias.double())[..., None]


@pytest.mark.parametrize(
    ('B', 'T', 'hidden', 'HK', 'R', 'bias', 'autocast'),
    [
        pytest.param(*test, id="B{}-T{}-hidden{}-HK{}-R{}-bias{}-autocast{}".format(*test))
        for test in [
            (1, 63, 256, 1, 32, False, False),
            (2, 500, 512, 4, 32, True, False),
            (2, 1000, 1024, 4, 64, False, True),
            (1, 2048, 2048, 8, 64, True, True),
        ]
    ],
)
def test_module_generator(B, T, hidden, HK, R, bias, autocast):
    """The module's fused generator (the normalised projection, then the convolution with the gate and bias) against
    float64, forward and backward; and against the unfused route (fla's ShortConvolution) that prefill takes."""
    torch.manual_seed(42)
    module = SelectiveRotaryEmbedding(hidden, HK, 2 * R, bias=bias).to(device)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))  # off the zero bias and unit gains of the initialisation
    x = torch.randn(B, T, hidden, device=device, requires_grad=True)
    dphi = torch.randn(B, T, HK, R, device=device)
    leaves = [x, *module.parameters()]
    results = []
    for fn in (lambda: naive_increments(module, x), lambda: module.increments(x)[0]):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            phi = fn()
        (phi * dphi.to(phi.dtype)).sum().backward()
        results.append((phi, [leaf.grad for leaf in leaves]))
        for leaf in leaves:
            leaf.grad = None
    (ref, ref_grads), (tri, tri_grads) = results
    assert in_graph(tri, 'ConvHeadGateFunction')  # the fused convolution + gate ran
    assert_close('phi', ref, tri, 1e-5)  # the forward is float32-accurate with or without autocast
    for i, (r, t) in enumerate(zip(ref_grads, tri_grads)):
        # autocast: the backward's products and its copy of x in bf16 (relative errors up to ~8e-3 seen at hidden 1024)
        assert_close(f'grad{i}', r, t, 2e-2 if autocast else 1e-5)
    with torch.no_grad():
        unfused, _ = module.increments(x, output_final_state=True)
    assert_close('phi unfused', tri, unfused, 1e-5)
