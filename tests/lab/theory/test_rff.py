"""1(a)/(b): random Fourier features of softmax, and softmax as a rotation recurrence."""

from __future__ import annotations

import math

import pytest
import torch

from srope.lab.theory import rff
from srope.lab.theory._common import step_rel_errors
from tests.helpers import generator

F64 = torch.float64


def test_rff_error_falls_as_inverse_sqrt_D_within_predicted_std():
    stats = rff.convergence_study(generator(11), pairs=1500, dim=8, feature_counts=(1, 4, 16, 64, 256, 1024))
    assert abs(stats["slope"] + 0.5) <= 0.1, stats["slope"]
    for count, mz, se, mz2, se2, frac in zip(stats["features"], stats["mean_z"], stats["se_mean_z"], stats["mean_z2"],
                                             stats["se_mean_z2"], stats["frac_beyond_3sigma"]):
        # Unbiased, and the closed-form std is the right scale (a factor √2 off would give mean z² of 0.5 or 2).
        # At D = 1, z² is so skewed (≈ (1 − χ²₁)²/2 for nearly equal q, k) that its sample standard error is
        # unreliable; there only a loose range is asserted.
        assert abs(mz) <= 4 * se, (count, mz, se)
        assert 0.75 < mz2 < 1.25 if count == 1 else abs(mz2 - 1) <= 4 * se2, (count, mz2, se2)
        # Errors beyond 3 predicted std: ≤ 1/9 always (Chebyshev), near-Gaussian ≤ 1% once D ≥ 16.
        assert frac <= 1 / 9 and (count < 16 or frac <= 0.01), (count, frac)
    # The wrong variant (key not conjugated) converges to exp(-qᵀk): its error stops falling.
    assert stats["unconjugated_slope"] > -0.2
    assert stats["unconjugated_rms_error"][-1] > 10 * stats["rms_error"][-1]


@pytest.mark.parametrize("norms", [(1.0, 1.0), (0.6, 1.3)])
def test_single_feature_mean_and_std_match_closed_form(norms):
    """E[φ(q)φ̄(k)] = exp(qᵀk) and the predicted std hold for any norms (the general formula)."""
    g = generator(5)
    q, k = rff.unit_pairs(torch.tensor([1.1], dtype=F64), 6, g)
    q, k = norms[0] * q, norms[1] * k
    draws = 40000
    omega = torch.randn(draws, 1, 6, generator=g, dtype=F64)
    est = rff.rff_estimate(q.expand(draws, 6), k.expand(draws, 6), omega).real
    target = torch.exp((q * k).sum()).item()
    std = rff.predicted_std(q, k, 1).item()
    assert abs(est.mean().item() - target) <= 4 * std / math.sqrt(draws)
    assert abs(est.std().item() / std - 1) < 0.03
    wrong = rff.rff_estimate(q.expand(draws, 6), k.expand(draws, 6), omega, conjugate_key=False).real
    assert abs(wrong.mean().item() - target) > 20 * std / math.sqrt(draws)


def unit_rows(n, dim, g):
    x = torch.randn(n, dim, generator=g, dtype=F64)
    return x / x.norm(dim=-1, keepdim=True)


# (T, d, dv, D)
SEQUENCES = [(1, 2, 1, 1), (2, 4, 3, 7), (17, 8, 2, 256), (64, 5, 4, 33)]


@pytest.mark.parametrize("length,dim,value_dim,count", SEQUENCES)
def test_rotation_recurrence_equals_closed_form_at_every_step(length, dim, value_dim, count):
    g = generator(100 + length)
    q, k = unit_rows(length, dim, g), unit_rows(length, dim, g)
    v = torch.randn(length, value_dim, generator=g, dtype=F64)
    omega = torch.randn(count, dim, generator=g, dtype=F64)
    rec, norm = rff.rff_recurrence(q, k, v, omega)
    closed = rff.rff_closed_form(q, k, v, omega)
    assert step_rel_errors(rec, closed).max() <= 1e-10
    assert step_rel_errors(norm[:, None], rff.rff_closed_form(q, k, torch.ones(length, 1, dtype=F64), omega)).max() <= 1e-10
    # The library's complex diagonal recurrence (what Selective RoPE realises) computes the same.
    assert step_rel_errors(rff.library_recurrence(q, k, v, omega), rec).max() <= 1e-10
    if length > 1:  # the wrong variant: queries of varying norm need a real factor the rotation lacks
        scaled = q * (0.5 + torch.rand(length, 1, generator=g, dtype=F64))
        wrong = step_rel_errors(rff.rff_recurrence(scaled, k, v, omega)[0], rff.rff_closed_form(scaled, k, v, omega))
        assert wrong.max() > 1e-3


def test_recurrence_converges_to_exact_softmax_numerator():
    result = rff.sequence_study(generator(7), length=13, dim=6, value_dim=2, feature_counts=(16, 256, 4096), repeats=6)
    assert max(result["max_step_rel_err_recurrence_vs_closed_form"]) <= 1e-10
    errors, predicted = result["rel_rms_err_vs_exact"], result["rel_rms_err_predicted"]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.03
    assert abs(result["slope_vs_exact"] + 0.5) <= 0.1
    for err, pred in zip(errors, predicted):
        assert 0.6 < err / pred < 1.6, (err, pred)


def test_exact_numerator_is_causal_softmax_sum():
    g = generator(3)
    q, k, v = (torch.randn(5, 3, generator=g, dtype=F64) for _ in range(3))
    expected = torch.stack([sum(math.exp(q[t] @ k[s]) * v[s] for s in range(t + 1)) for t in range(5)])
    assert torch.allclose(rff.softmax_numerator(q, k, v), expected, rtol=1e-13, atol=0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="dim"):
        rff.unit_pairs(torch.tensor([0.5]), 1, generator(0))
