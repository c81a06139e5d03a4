"""Theorem 1 (its printed objective, its minimiser, the estimator behind it) and the spectra."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from srope.modules import RoPE, SelectiveRoPE, temperature_spectrum
from srope.lab.theory import temperature as tm
from tests.helpers import generator

F64 = torch.float64
ANGLES = torch.linspace(0.2, 2.8, 53, dtype=F64)


def test_infinite_D_minimiser_of_printed_objective_is_tan_half():
    sigma = tm.minimise(lambda s, x: tm.theorem1_objective(s, x, math.inf), torch.cos(ANGLES))
    assert ((sigma / torch.tan(ANGLES / 2) - 1).abs() <= 0.01).all()
    # Large finite D approaches the same limit.
    sigma_big = tm.minimise(lambda s, x: tm.theorem1_objective(s, x, 1e9), torch.cos(ANGLES))
    assert ((sigma_big / torch.tan(ANGLES / 2) - 1).abs() <= 0.01).all()
    # The wrong variant is rejected: the conjugated-key (eq. 8) estimator's limit minimiser is 1, not tan(θ/2).
    conj = tm.minimise(lambda s, x: tm.estimator_mse(s, x, math.inf, conjugate_key=True), torch.cos(ANGLES))
    assert ((conj - 1).abs() <= 1e-3).all()
    assert ((conj / torch.tan(ANGLES / 2) - 1).abs() > 0.01).sum() >= len(ANGLES) - 2


@pytest.mark.parametrize("count", [1, 4, 16, 256])
def test_printed_objective_is_the_unconjugated_estimator_mse(count):
    sigma = torch.linspace(0.05, 3.0, 40, dtype=F64)[:, None]
    xi = torch.cos(ANGLES)[None]
    printed = tm.theorem1_objective(sigma, xi, count) + math.e**2 / (2 * count) + torch.exp(2 * xi)
    assert (printed - tm.estimator_mse(sigma, xi, count, conjugate_key=False)).abs().max() <= 1e-12
    assert (printed - tm.estimator_mse(sigma, xi, count, conjugate_key=True)).abs().max() > 0.1


@pytest.mark.parametrize("count", [1, 4, 16, 64, 256])
def test_finite_D_minimisers_closed_form(count):
    xi = torch.cos(ANGLES)
    tan_half = torch.tan(ANGLES / 2)
    printed = tm.minimise(lambda s, x: tm.theorem1_objective(s, x, count), xi)
    conj = tm.minimise(lambda s, x: tm.estimator_mse(s, x, count, conjugate_key=True), xi)
    assert (printed / tm.cubic_minimiser(xi, count, False) - 1).abs().max() < 1e-6
    assert (conj / tm.cubic_minimiser(xi, count, True) - 1).abs().max() < 1e-6
    assert (printed / (tan_half * conj) - 1).abs().max() < 1e-6
    assert (printed < tan_half).all() and (conj < 1).all()  # finite D shrinks σ
    if count == 1:
        assert (conj - 1 / math.sqrt(3)).abs().max() < 1e-6
        assert (printed - tan_half / math.sqrt(3)).abs().max() < 1e-6


@pytest.mark.parametrize("conjugate", [False, True])
def test_closed_form_mse_matches_monte_carlo_of_the_estimator(conjugate):
    sigmas = torch.tensor([0.4, 0.9, 1.6], dtype=F64)
    angle, count = 1.0, 4
    empirical = tm.monte_carlo_mse(angle, sigmas, count, conjugate, generator(9), repeats=20000)
    closed = tm.estimator_mse(sigmas, torch.tensor(math.cos(angle), dtype=F64), count, conjugate)
    other = tm.estimator_mse(sigmas, torch.tensor(math.cos(angle), dtype=F64), count, not conjugate)
    assert ((empirical / closed - 1).abs() < 0.05).all(), (empirical, closed)
    assert ((empirical / other - 1).abs() > 0.2).any()


PAIRS = [2, 3, 32, 64]


@pytest.mark.parametrize("pairs", PAIRS)
@pytest.mark.parametrize("max_value", [1.0, 2.5])
def test_module_spectra_equal_their_formulas(pairs, max_value):
    head_dim = 2 * pairs + 2  # partial rotary: 2 pass-through channels
    cases = {
        "rope": ({"theta": 10000.0}, tm.rope_formula(pairs, 10000.0, max_value)),
        "rfa": ({"epsilon": 0.1}, tm.tan_formula(pairs, 0.1, max_value)),
        "uniform": ({}, tm.uniform_formula(pairs, max_value)),
    }
    for kind, (kwargs, formula) in cases.items():
        module = SelectiveRoPE(head_dim, 2, head_dim, rotary_dim=2 * pairs, spectrum=kind, max_temperature=max_value, **kwargs)
        for values in (module.temperature(F64), module.to(torch.bfloat16).temperature(F64),
                       temperature_spectrum(kind, pairs, max_value=max_value, **kwargs)):
            assert values.dtype == F64 and values.shape == (pairs,)
            np.testing.assert_allclose(values.numpy(), formula, rtol=1e-12, atol=0, err_msg=kind)
        learned = SelectiveRoPE(head_dim, 2, head_dim, rotary_dim=2 * pairs, spectrum=kind, max_temperature=max_value,
                                learnable_temperature=True, **kwargs).temperature(F64).detach()
        assert learned.shape == (2, pairs)
        np.testing.assert_allclose(learned.numpy(), np.broadcast_to(formula, (2, pairs)), rtol=1e-7, atol=1e-30)
    # The rope spectrum is RoPE's inverse frequencies.
    np.testing.assert_allclose(RoPE(2 * pairs, theta=10000.0).inv_freq().numpy() * max_value, cases["rope"][1], rtol=1e-12)


def test_formulas_reject_wrong_variants():
    rope = SelectiveRoPE(64, 1, 64, spectrum="rope", theta=500000.0).temperature(F64).numpy()
    rfa = SelectiveRoPE(64, 1, 64, spectrum="rfa", epsilon=1e-4).temperature(F64).numpy()
    j = np.arange(32)
    np.testing.assert_allclose(rope, 500000.0 ** (-2 * j / 64), rtol=1e-12)
    assert not np.allclose(rope, 500000.0 ** (-j / 64), rtol=1e-3)  # exponent j/d instead of 2j/d
    np.testing.assert_allclose(rfa, tm.tan_formula(32, 1e-4), rtol=1e-12)
    raw = np.tan(np.linspace(0, (1 - 1e-4) * np.pi, 32))  # tan(φ) instead of tan(φ/2)
    assert not np.allclose(rfa, raw / np.abs(raw).max(), rtol=1e-3)
    assert rfa[0] == 0.0 and np.all(np.diff(rfa) > 0)  # ascending; pair 0 never rotates


def test_figure2_rope_is_epsilon_power():
    fig2 = tm.figure2_study(pairs=16, epsilons=(0.1, 0.001))
    for eps in (0.1, 0.001):
        np.testing.assert_allclose(fig2["rope"][str(eps)], eps ** (np.arange(16) / 16), rtol=1e-12)
        tan = fig2["tan_descending"][str(eps)]
        assert tan[0] == 1.0 and tan[-1] == 0.0 and np.all(np.diff(tan) < 0)
