"""gated_delta_rule: the chunked PyTorch path against the token-by-token recurrence (float64)."""

from __future__ import annotations

import pytest
import torch

from srope.ops.mixers import gated_delta_rule
from srope.ops.mixers import naive as mixers_naive
from srope.ops.mixers.delta_rule import CHUNK_SIZE, gated_delta_rule_torch
from tests.helpers import rel_err
from tests.ops.mixers.common import (
    assert_close_all,
    backward_grads,
    cotangents_like,
    delta_inputs,
    l2norm,
    leaves,
    split_packed,
)

NAMES = ["q", "k", "v", "beta", "log_decay", "initial_state"]

# (B, T, H, K, V, chunk_size); chunk_size None = the public function's default (64).
SHAPES = [
    (1, 1, 1, 4, 3, None),  # T = 1
    (2, 9, 2, 8, 5, None),  # odd T inside one chunk
    (2, CHUNK_SIZE + 7, 2, 6, 4, None),  # T not a multiple of the chunk size
    (1, 29, 3, 5, 6, 8),  # many small chunks, odd K
]


def run(q, k, v, beta, log_decay, h0, chunk_size=None, **kwargs):
    if chunk_size is None:
        return gated_delta_rule(
            q, k, v, beta, log_decay, initial_state=h0, output_final_state=True, backend="torch", **kwargs
        )
    scale = q.shape[-1] ** -0.5
    return gated_delta_rule_torch(q, k, v, beta, log_decay, scale, h0, None, kwargs.get("qk_l2norm", False), chunk_size)


def recurrence(q, k, v, beta, log_decay, h0, qk_l2norm=False):
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return mixers_naive.gated_delta_rule_recurrence(q, k, v, beta, log_decay, q.shape[-1] ** -0.5, h0)


CASES = {
    "gated": dict(),
    "deltanet": dict(no_decay=True),  # plain DeltaNet
    "negative eigenvalues": dict(max_beta=2.0),  # beta in (0, 2)
    "deltanet, negative eigenvalues": dict(no_decay=True, max_beta=2.0),
    "qk l2norm inside": dict(qk_l2norm=True, unit_keys=False),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_recurrence_forward_and_backward(shape, case):
    *dims, chunk_size = shape
    opts = dict(CASES[case])
    no_decay, qk_l2norm = opts.pop("no_decay", False), opts.pop("qk_l2norm", False)
    q, k, v, beta, log_decay, h0 = leaves(*delta_inputs(*dims, seed=1, **opts))
    log_decay = None if no_decay else log_decay
    out, final = run(q, k, v, beta, log_decay, h0, chunk_size, qk_l2norm=qk_l2norm)
    ref_out, ref_final = recurrence(q, k, v, beta, log_decay, h0, qk_l2norm)
    assert out.dtype == final.dtype == torch.float64
    assert_close_all(["o", "final_state"], [out, final], [ref_out, ref_final], 1e-10)
    cot = cotangents_like(2, out, final)
    inputs = [q, k, v, beta, log_decay, h0]
    names = [n for n, x in zip(NAMES, inputs) if x is not None]
    assert_close_all(names, backward_grads([out, final], inputs, cot), backward_grads([ref_out, ref_final], inputs, cot), 1e-10)


def test_without_initial_state_and_explicit_scale():
    q, k, v, beta, log_decay, _ = delta_inputs(2, 11, 2, 4, 3, seed=3)
    out, final = gated_delta_rule(q, k, v, beta, log_decay, scale=0.3, output_final_state=True)
    ref_out, ref_final = mixers_naive.gated_delta_rule_recurrence(q, k, v, beta, log_decay, 0.3)
    assert rel_err(out, ref_out) < 1e-12 and rel_err(final, ref_final) < 1e-12
    assert gated_delta_rule(q, k, v, beta, log_decay)[1] is None


def test_gradcheck_across_chunks_and_packed():
    q, k, v, beta, log_decay, h0 = leaves(*delta_inputs(1, 5, 1, 3, 2, seed=4, max_beta=2.0))

    def chunked(*x):
        return gated_delta_rule_torch(*x[:5], 0.7, x[5], None, True, 2)

    assert torch.autograd.gradcheck(chunked, (q, k, v, beta, log_decay, h0), fast_mode=True)
    q, k, v, beta, log_decay, h0 = leaves(*delta_inputs(1, 5, 1, 3, 2, seed=5, states=2))
    cu = torch.tensor([0, 3, 5])

    def packed(*x):
        return gated_delta_rule(*x[:5], initial_state=x[5], output_final_state=True, cu_seqlens=cu)

    assert torch.autograd.gradcheck(packed, (q, k, v, beta, log_decay, h0), fast_mode=True)


@pytest.mark.parametrize("split", [1, 40, 64])
def test_split_and_continue_from_final_state(split):
    q, k, v, beta, log_decay, h0 = delta_inputs(2, 71, 2, 6, 4, seed=6, max_beta=2.0)
    full, final = run(q, k, v, beta, log_decay, h0)
    parts = [x[:, :split] for x in (q, k, v, beta, log_decay)]
    first, mid = run(*parts, h0)
    second, last = run(*[x[:, split:] for x in (q, k, v, beta, log_decay)], mid)
    assert rel_err(torch.cat([first, second], 1), full) < 1e-12 and rel_err(last, final) < 1e-12


@pytest.mark.parametrize("no_decay", [False, True])
def test_packed_equals_sequences_one_by_one(no_decay):
    bounds = [0, 5, 5, 70, 71, 90]
    cu = torch.tensor(bounds)
    q, k, v, beta, log_decay, h0 = leaves(*delta_inputs(1, bounds[-1], 2, 5, 4, seed=7, states=len(bounds) - 1))
    log_decay = None if no_decay else log_decay
    inputs = [q, k, v, beta, log_decay, h0]
    out, final = run(*inputs, cu_seqlens=cu, qk_l2norm=True)
    cot = cotangents_like(8, out, final)
    grads = backward_grads([out, final], inputs, cot)
    expected = [torch.zeros_like(x) for x in inputs if x is not None]
    for n, (s, e) in enumerate(split_packed(cu)):
        if s == e:
            assert torch.equal(final[n], h0[n])
            expected[-1][n] = cot[1][n]
            continue
        part = leaves(*[None if x is None else x[:, s:e] for x in inputs[:5]], h0[n : n + 1])
        one, one_final = run(*part, qk_l2norm=True)
        assert rel_err(out[:, s:e], one) < 1e-12 and rel_err(final[n : n + 1], one_final) < 1e-12
        part_grads = backward_grads([one, one_final], part, [cot[0][:, s:e], cot[1][n : n + 1]])
        for full, g in zip(expected[:-1], part_grads[:-1]):
            full[:, s:e] = g
        expected[-1][n : n + 1] = part_grads[-1]
    names = [n for n, x in zip(NAMES, inputs) if x is not None]
    assert_close_all(names, grads, expected, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_low_precision_matches_float64(dtype, tol):
    inputs = delta_inputs(2, 75, 2, 8, 6, seed=9, max_beta=2.0)
    low = leaves(*[x.to(dtype) for x in inputs[:5]], inputs[5].float())
    high = leaves(*low, dtype=torch.float64)
    out, final = run(*low, qk_l2norm=True)
    ref_out, ref_final = run(*high, qk_l2norm=True)
    assert out.dtype == dtype and final.dtype == torch.float32
    assert_close_all(["o", "final_state"], [out, final], [ref_out, ref_final], tol)
    cot = cotangents_like(10, out, final)
    grads = backward_grads([out, final], low, cot)
    assert all(g.dtype == x.dtype for g, x in zip(grads, low))
    assert_close_all(NAMES, grads, backward_grads([ref_out, ref_final], high, cot), tol)


def test_strong_decay_stays_finite_in_float32():
    q, k, v, beta, _, h0 = delta_inputs(1, 70, 2, 4, 3, seed=11)
    log_decay = torch.full_like(beta, -30.0)
    log_decay[:, ::9] = -0.01
    low = [x.float() for x in (q, k, v, beta, log_decay, h0)]
    out, final = run(*low)
    ref_out, ref_final = mixers_naive.gated_delta_rule_recurrence(q, k, v, beta, log_decay, 0.5, h0)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    assert rel_err(out, ref_out) < 1e-5 and rel_err(final, ref_final) < 1e-5
