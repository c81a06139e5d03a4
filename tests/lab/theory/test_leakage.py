"""Rotation/decay recurrences as windowed DFTs, the linear-attention read-out, window metrics."""

from __future__ import annotations

import math

import pytest
import torch

from srope.lab.theory import leakage as lk
from srope.lab.theory._common import step_rel_errors
from tests.helpers import generator

F64, C128 = torch.float64, torch.complex128


def complex_signal(length, g):
    return torch.complex(torch.randn(length, generator=g, dtype=F64), torch.randn(length, generator=g, dtype=F64))


@pytest.mark.parametrize("length", [1, 2, 17, 100])
@pytest.mark.parametrize("decay", [1.0, 0.97, 0.5])
@pytest.mark.parametrize("order", [1, 2])
def test_recurrence_equals_windowed_dft_at_every_step(length, decay, order):
    g = generator(length)
    x = complex_signal(length, g)
    omegas = torch.cat([2 * math.pi * torch.rand(5, generator=g, dtype=F64), torch.tensor([0.0, math.pi], dtype=F64)])
    rec = lk.rotation_bank(x, omegas, decay, order)
    closed = lk.windowed_dft(x, omegas, lk.window_weights(length, decay, order))
    assert rec.shape == (length, omegas.numel())
    assert step_rel_errors(rec, closed).max() <= 1e-10
    if length > 2:  # wrong windows are rejected
        reversed_window = lk.window_weights(length, decay, order).flip(1).tril()  # decay towards the future
        if decay < 1 or order == 2:
            assert step_rel_errors(rec, lk.windowed_dft(x, omegas, reversed_window)).max() > 1e-3
            assert step_rel_errors(rec, lk.windowed_dft(x, omegas, torch.ones(length, length, dtype=F64).tril())).max() > 1e-3


def test_rotation_only_readout_is_the_fft():
    """|λ| = 1 on the DFT grid, read out at t = N−1: e^{iω_n(N−1)} · FFT(x)[n] (torch.fft, independent)."""
    g = generator(2)
    length = 24
    x = complex_signal(length, g)
    omegas = 2 * math.pi * torch.arange(length, dtype=F64) / length
    final = lk.rotation_bank(x, omegas)[-1]
    expected = torch.fft.fft(x) * torch.polar(torch.ones(length, dtype=F64), omegas * (length - 1))
    assert ((final - expected).abs().max() / expected.abs().max()) <= 1e-12


@pytest.mark.parametrize("kind,order", [("one_sided_exponential", 1), ("two_pole", 2)])
def test_read_out_window_is_the_studied_window(kind, order):
    length, alpha = 37, 0.11
    weights = lk.window_weights(length, math.exp(-alpha), order)[-1]
    assert torch.allclose(weights, lk.window(kind, length, alpha), rtol=1e-13, atol=1e-300)
    assert torch.equal(lk.window_weights(length, 1.0)[-1], lk.window("rectangular", length))


@pytest.mark.parametrize("length,count,alpha", [(1, 2, 0.0), (23, 5, 0.0), (23, 5, 0.2), (40, 3, 0.03)])
def test_linear_attention_readout_is_the_decayed_rotation_bank(length, count, alpha):
    g = generator(length + count)
    x = torch.randn(length, generator=g, dtype=F64)
    omegas = 2 * math.pi * torch.rand(count, generator=g, dtype=F64)
    o_gla, o_complex = lk.linear_attention_bank(x, omegas, alpha)
    closed = lk.windowed_dft(x.to(C128), omegas, lk.window_weights(length, math.exp(-alpha)))
    assert step_rel_errors(o_gla, o_complex).max() <= 1e-10
    assert step_rel_errors(o_gla[:, :count], closed.real).max() <= 1e-10  # cos heads
    assert step_rel_errors(o_gla[:, count:], -closed.imag).max() <= 1e-10  # sin heads
    assert step_rel_errors(lk.readout_magnitude(o_gla), closed.abs()).max() <= 1e-10
    if alpha > 0 and length > 1:  # the decay really enters
        undecayed = lk.windowed_dft(x.to(C128), omegas, lk.window_weights(length, 1.0))
        assert step_rel_errors(o_gla[:, :count], undecayed.real).max() > 1e-3


def test_window_metrics_reproduce_textbook_values():
    """Harris (1978): rectangular −13.3 dB PSL, −6 dB/oct, ENBW 1; Hann −31.5 dB, −18 dB/oct, ENBW 1.5."""
    rect = lk.window_metrics(lk.window("rectangular", 128))
    hann = lk.window_metrics(lk.window("hann", 128))
    assert abs(rect["peak_side_lobe_db"] + 13.26) < 0.05 and abs(hann["peak_side_lobe_db"] + 31.47) < 0.1
    assert abs(rect["main_lobe_half_width_bins"] - 1) < 0.02 and abs(hann["main_lobe_half_width_bins"] - 2) < 0.02
    assert abs(rect["enbw_bins"] - 1) < 1e-12 and abs(hann["enbw_bins"] - 1.5) < 1e-12
    assert -7 < rect["falloff_db_per_octave"] < -5 and -19.5 < hann["falloff_db_per_octave"] < -16
    assert abs(rect["bandwidth_3db_bins"] - 0.89) < 0.05 and abs(hann["bandwidth_3db_bins"] - 1.44) < 0.05
    # Energy by Parseval: the fractions are consistent and in [0, 1].
    for m in (rect, hann):
        assert 0 <= m["energy_outside_8_bins"] <= m["energy_outside_2_bins"] <= 1
    # A strongly decayed one-sided window has no side lobe (monotone) but keeps a ~1/Δω tail.
    steep = lk.window_metrics(lk.window("one_sided_exponential", 128, 16 / 128))
    assert steep["peak_side_lobe_db"] is None and steep["main_lobe_half_width_bins"] is None
    assert -7 < steep["falloff_db_per_octave"] < -4


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="decay"):
        lk.rotation_bank(torch.ones(3), torch.zeros(2), decay=1.5)
    with pytest.raises(ValueError, match="order"):
        lk.rotation_bank(torch.ones(3), torch.zeros(2), order=3)
    with pytest.raises(ValueError, match="unknown window"):
        lk.window("triangle", 8)
