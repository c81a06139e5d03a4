"""gla: the chunked PyTorch path against the token-by-token recurrence (float64)."""

from __future__ import annotations

import pytest
import torch

from srope.ops.mixers import gla
from srope.ops.mixers import naive as mixers_naive
from srope.ops.mixers.gla import CHUNK_SIZE, gla_torch
from tests.helpers import rel_err
from tests.ops.mixers.common import assert_close_all, backward_grads, cotangents_like, gla_inputs, leaves, split_packed

NAMES = ["q", "k", "v", "log_decay", "initial_state"]

# (B, T, H, K, V, chunk_size); chunk_size None = the public function's default.
SHAPES = [
    (1, 1, 1, 4, 3, None),  # T = 1
    (2, 7, 2, 8, 5, None),  # odd T inside one chunk
    (2, 37, 3, 8, 4, None),  # T not a multiple of the chunk size
    (2, 2 * CHUNK_SIZE, 2, 6, 6, None),  # exactly two chunks
    (1, 23, 2, 5, 3, 4),  # many small chunks, odd K
]


def run(q, k, v, log_decay, h0, chunk_size=None, **kwargs):
    if chunk_size is None:
        return gla(q, k, v, log_decay, initial_state=h0, output_final_state=True, backend="torch", **kwargs)
    scale = kwargs.get("scale", q.shape[-1] ** -0.5)
    return gla_torch(q, k, v, log_decay, scale, h0, kwargs.get("cu_seqlens"), chunk_size)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_state", [True, False])
def test_matches_recurrence_forward_and_backward(shape, with_state):
    *dims, chunk_size = shape
    q, k, v, log_decay, h0 = leaves(*gla_inputs(*dims, seed=1))
    h0 = h0 if with_state else None
    out, final = run(q, k, v, log_decay, h0, chunk_size)
    ref_out, ref_final = mixers_naive.gated_linear_attention_recurrence(q, k, v, log_decay, dims[3] ** -0.5, h0)
    assert out.dtype == final.dtype == torch.float64
    assert_close_all(["o", "final_state"], [out, final], [ref_out, ref_final], 1e-10)
    cot = cotangents_like(2, out, final)
    inputs = [q, k, v, log_decay, h0]
    assert_close_all(NAMES, backward_grads([out, final], inputs, cot), backward_grads([ref_out, ref_final], inputs, cot), 1e-10)


def test_scale_default_and_explicit():
    q, k, v, log_decay, h0 = gla_inputs(2, 9, 2, 4, 3, seed=3)
    out = gla(q, k, v, log_decay, scale=0.3, backend="torch")[0]
    assert rel_err(out, mixers_naive.gated_linear_attention_recurrence(q, k, v, log_decay, 0.3)[0]) < 1e-12
    assert gla(q, k, v, log_decay)[1] is None  # no final state unless asked


def test_gradcheck_across_chunks_and_packed():
    q, k, v, log_decay, h0 = leaves(*gla_inputs(1, 5, 1, 2, 2, seed=4))
    assert torch.autograd.gradcheck(lambda *x: gla_torch(*x[:4], 0.7, x[4], None, 2), (q, k, v, log_decay, h0), fast_mode=True)
    q, k, v, log_decay, h0 = leaves(*gla_inputs(1, 5, 1, 2, 2, seed=5, states=2))
    cu = torch.tensor([0, 2, 5])

    def packed(*x):
        return gla(*x[:4], initial_state=x[4], output_final_state=True, cu_seqlens=cu)

    assert torch.autograd.gradcheck(packed, (q, k, v, log_decay, h0), fast_mode=True)


@pytest.mark.parametrize("split", [1, 16, 21])
def test_split_and_continue_from_final_state(split):
    q, k, v, log_decay, h0 = gla_inputs(2, 37, 2, 8, 4, seed=6)
    full, final = run(q, k, v, log_decay, h0)
    first, mid = run(q[:, :split], k[:, :split], v[:, :split], log_decay[:, :split], h0)
    second, last = run(q[:, split:], k[:, split:], v[:, split:], log_decay[:, split:], mid)
    assert rel_err(torch.cat([first, second], 1), full) < 1e-12 and rel_err(last, final) < 1e-12


@pytest.mark.parametrize("bounds", [[0, 5, 5, 12, 13, 40], [0, 1, 17, 33]])
def test_packed_equals_sequences_one_by_one(bounds):
    cu = torch.tensor(bounds, dtype=torch.int32)
    q, k, v, log_decay, h0 = leaves(*gla_inputs(1, bounds[-1], 2, 6, 5, seed=7, states=len(bounds) - 1))
    out, final = run(q, k, v, log_decay, h0, cu_seqlens=cu)
    cot = cotangents_like(8, out, final)
    grads = backward_grads([out, final], [q, k, v, log_decay, h0], cot)
    expected_grads = [torch.zeros_like(x) for x in (q, k, v, log_decay, h0)]
    for n, (s, e) in enumerate(split_packed(cu)):
        if s == e:
            assert torch.equal(final[n], h0[n])  # an empty sequence keeps its state
            expected_grads[4][n] = cot[1][n]
            continue
        part = leaves(q[:, s:e], k[:, s:e], v[:, s:e], log_decay[:, s:e], h0[n : n + 1])
        one, one_final = run(*part)
        assert rel_err(out[:, s:e], one) < 1e-12 and rel_err(final[n : n + 1], one_final) < 1e-12
        part_grads = backward_grads([one, one_final], part, [cot[0][:, s:e], cot[1][n : n + 1]])
        for full, g in zip(expected_grads[:4], part_grads[:4]):
            full[:, s:e] = g
        expected_grads[4][n : n + 1] = part_grads[4]
    assert_close_all(NAMES, grads, expected_grads, 1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_low_precision_matches_float64(dtype, tol):
    inputs = gla_inputs(2, 45, 2, 8, 6, seed=9)
    low = leaves(*[x.to(dtype) for x in inputs[:4]], inputs[4].float())
    high = leaves(*low, dtype=torch.float64)
    out, final = run(*low)
    ref_out, ref_final = run(*high)
    assert out.dtype == dtype and final.dtype == torch.float32
    assert_close_all(["o", "final_state"], [out, final], [ref_out, ref_final], tol)
    cot = cotangents_like(10, out, final)
    grads = backward_grads([out, final], low, cot)
    assert all(g.dtype == x.dtype for g, x in zip(grads, low))
    assert_close_all(NAMES, grads, backward_grads([ref_out, ref_final], high, cot), tol)


def test_strong_decay_stays_finite_in_float32():
    """Log-decays of -40 per step over a chunk sum to -640: a chunked form that divides by
    the decay (k·e^{-G}) would overflow float32 here; ours only forms causal differences."""
    q, k, v, _, h0 = gla_inputs(1, 40, 2, 4, 3, seed=11)
    log_decay = torch.full_like(q, -40.0)
    log_decay[:, ::7] = -0.01
    out, final = run(*leaves(q.float(), k.float(), v.float(), log_decay.float(), h0.float()))
    ref_out, ref_final = mixers_naive.gated_linear_attention_recurrence(q, k, v, log_decay, 0.5, h0)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    assert rel_err(out, ref_out) < 1e-5 and rel_err(final, ref_final) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("step_log_decay", [-0.05, -9.0, -80.0])  # factored / float32 pairwise / both pairwise
def test_factored_and_pairwise_scores_match_recurrence(dtype, step_log_decay):
    """Strong decay (a log-decay fall beyond MAX_FACTORED_SPREAD inside a chunk) takes the
    pairwise form; both forms equal the float64 recurrence, with finite values throughout."""
    from srope.ops.mixers.gla import MAX_FACTORED_SPREAD

    q, k, v, log_decay, h0 = gla_inputs(2, 3 * CHUNK_SIZE + 5, 2, 6, 4, seed=11)
    log_decay = step_log_decay * (0.5 + torch.rand_like(log_decay))
    spread = float(-log_decay[:, :CHUNK_SIZE].sum(1).max())  # the smallest fall of a first chunk
    assert (spread > MAX_FACTORED_SPREAD[dtype]) == (step_log_decay < (-1 if dtype == torch.float32 else -50))
    leaves_ = leaves(*(x.to(dtype) for x in (q, k, v, log_decay, h0)))
    out, final = run(*leaves_)
    ref = mixers_naive.gated_linear_attention_recurrence(*(x.double() for x in leaves_[:4]), 6**-0.5, leaves_[4].double())
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert torch.isfinite(out).all() and rel_err(out, ref[0]) < tol and rel_err(final, ref[1]) < tol
    cot = cotangents_like(2, out, final)
    grads = backward_grads([out, final], list(leaves_), cot)
    assert all(torch.isfinite(g).all() for g in grads)
