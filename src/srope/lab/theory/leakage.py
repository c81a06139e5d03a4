"""Spectral leakage of rotation-only diagonal recurrences, and what decay does to it
(paper §3.2, App. A.4, Fig. 3).

**Recurrence = windowed DFT.** One channel of a diagonal recurrence ``h_t = λ e^{iω} h_{t−1} + x_t``
read out at step t is::

    h_t = Σ_{τ≤t} (λ e^{iω})^{t−τ} x_τ = e^{iωt} Σ_{τ≤t} w_τ x_τ e^{−iωτ},     w_τ = λ^{t−τ}

the DFT of the inputs at frequency ω under the window w (times a phase). ``|λ| = 1`` (pure
rotation): a rectangular window over ``[0, t]``. ``λ = e^{−α}`` (a decay gate): a one-sided
exponential window, largest at the current step and cut off there (no future inputs exist),
i.e. discontinuous at ``τ = t`` for every α. Two cascaded decayed rotations read out as
``a·h2_t`` give the causal two-pole window ``w = (t−τ) λ^{t−τ}``, which is 0 at the current
step.

**What is measured.** For windows of length N (the read-out step ``t = N−1``): rectangular,
one-sided exponential (decay α), two-sided (Poisson) exponential ``e^{−α|τ−(N−1)/2|}`` (Harris'
Poisson window, which a causal recurrence read out at t cannot produce), periodic Hann, and
the two-pole window. On the window spectrum ``|W(Δω)|`` (Δω in DFT bins ``2π/N``, 64×
zero-padding): peak side-lobe level (beyond the first minimum; none if the response is
monotone), side-lobe fall-off (dB/octave from the octave maxima in [4, 32) bins), energy outside
±2 and ±8 bins of the tone, 3-dB width and far-field level (max beyond 16 bins). Then a bank of
channels ``ω_n = 2πn/N`` read out at ``t = N−1`` with a tone off the frequency grid, and the
same bank as a linear-attention read-out: GLA's recurrence on RoPE-rotated q/k with a tied
per-pair decay (``srope.ops.mixers.naive.gated_linear_attention_recurrence``), checked against
``complex_rotation_recurrence`` and the windowed DFT, measuring whether a weak tone 30 bins
from a strong one is visible above the strong tone's leakage.
"""

from __future__ import annotations

import math
import pathlib
import time

import numpy as np
import torch

from srope.ops import rope
from srope.ops.mixers.naive import complex_rotation_recurrence, gated_linear_attention_recurrence
from srope.lab.theory._common import (
    start_run,
    new_figure,
    save_figure,
    single_thread,
    step_rel_errors,
    write_json,
)

NAME = "leakage"
F64, C128 = torch.float64, torch.complex128
EXAMPLES = (("rectangular", 0.0), ("one_sided_exponential", 4.0), ("one_sided_exponential", 16.0),
            ("two_sided_exponential", 16.0), ("hann", 0.0), ("two_pole", 16.0))
COLORS = ("k", "tab:blue", "tab:cyan", "tab:orange", "tab:green", "tab:purple")
WINDOWS = ("rectangular", "one_sided_exponential", "two_sided_exponential", "hann", "two_pole")
ALPHA_N = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # decay α times the window length N


# --------------------------------------------------------------------------------------
# Recurrences and their closed forms


def rotation_bank(x: torch.Tensor, omegas: torch.Tensor, decay: float = 1.0, order: int = 1) -> torch.Tensor:
    """Run ``h_t = λ e^{iω_n} h_{t−1} + x_t`` for every channel n; return ``h [T, M]`` at
    every step (complex). ``order=2`` cascades a second recurrence ``g_t = a g_{t−1} + h_{t−1}``
    and returns ``a·g_t`` (the two-pole window)."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay λ must be in (0, 1], got {decay}")
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    a = torch.polar(torch.full_like(omegas, float(decay), dtype=F64), omegas.to(F64))
    h = torch.zeros(omegas.shape[0], dtype=C128)
    g = torch.zeros_like(h)
    out = []
    for t in range(x.shape[0]):
        if order == 2:
            g = a * g + h  # uses h_{t−1}
        h = a * h + x[t]
        out.append(h if order == 1 else a * g)
    return torch.stack(out)


def window_weights(length: int, decay: float, order: int = 1) -> torch.Tensor:
    """``w[t, τ]``: the weight of ``x_τ`` in the read-out at step t (0 for τ > t)."""
    lag = torch.arange(length, dtype=F64)[:, None] - torch.arange(length, dtype=F64)[None]
    causal = lag >= 0
    lag = lag.clamp(min=0)
    weights = float(decay) ** lag if order == 1 else lag * float(decay) ** lag
    return torch.where(causal, weights, torch.zeros_like(weights))


def windowed_dft(x: torch.Tensor, omegas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``e^{iω_n t} Σ_τ w[t, τ] x_τ e^{−iω_n τ}`` for every step t and channel n, ``[T, M]``."""
    steps = torch.arange(x.shape[0], dtype=F64)
    basis = torch.polar(torch.ones(x.shape[0], omegas.shape[0], dtype=F64), -steps[:, None] * omegas[None].to(F64))
    spectrum = (weights.to(C128) * x.to(C128)[None]) @ basis  # [t, n]
    return spectrum * basis.conj()  # e^{iω_n t}


# --------------------------------------------------------------------------------------
# Windows and their figures of merit


def window(kind: str, length: int, alpha: float = 0.0) -> torch.Tensor:
    """The weight of ``x_τ``, τ = 0..N−1, in a read-out at step ``N−1`` (see the module doc)."""
    tau = torch.arange(length, dtype=F64)
    lag = (length - 1) - tau
    if kind == "rectangular":
        return torch.ones(length, dtype=F64)
    if kind == "one_sided_exponential":
        return torch.exp(-alpha * lag)
    if kind == "two_sided_exponential":
        return torch.exp(-alpha * (tau - (length - 1) / 2).abs())
    if kind == "hann":
        return 0.5 - 0.5 * torch.cos(2 * math.pi * tau / length)
    if kind == "two_pole":
        return lag * torch.exp(-alpha * lag)
    raise ValueError(f"unknown window {kind!r}; expected one of {WINDOWS}")


def window_metrics(w: torch.Tensor, oversample: int = 64) -> dict:
    """Figures of merit of the window spectrum (module docstring); levels in dB re the peak."""
    length = w.shape[0]
    power = torch.fft.fft(w.to(F64), n=length * oversample).abs().square()
    power = power / power[0]
    half = power[: length * oversample // 2 + 1]  # Δ = 0 .. N/2 bins (|W| is even: w is real)
    delta = torch.arange(half.shape[0], dtype=F64) / oversample
    level = 10 * torch.log10(half.clamp(min=1e-300))
    interior = (half[1:-1] <= half[:-2]) & (half[1:-1] <= half[2:])
    minima = torch.nonzero(interior).flatten()
    first_min = int(minima[0]) + 1 if minima.numel() else None
    full_delta = torch.cat([delta, -delta[1:-1].flip(0)])  # matches fft order of `power`
    total = power.sum()

    def outside(bins: float) -> float:
        return float(power[full_delta.abs() > bins].sum() / total)

    octave_peaks = [float(level[(delta >= lo) & (delta < 2 * lo)].max()) for lo in (4, 8, 16)]
    return {
        "main_lobe_half_width_bins": None if first_min is None else float(delta[first_min]),
        "peak_side_lobe_db": None if first_min is None else float(level[first_min:].max()),
        "falloff_db_per_octave": float(np.polyfit(np.arange(3), octave_peaks, 1)[0]),
        "energy_outside_2_bins": outside(2.0),
        "energy_outside_8_bins": outside(8.0),
        "energy_outside_main_lobe": None if first_min is None else outside(float(delta[first_min])),
        "bandwidth_3db_bins": 2 * float(delta[torch.nonzero(half <= 0.5).flatten()[0]]),
        "far_level_db": float(level[delta >= 16].max()),
        "enbw_bins": float(length * w.square().sum() / w.sum().square()),
    }


# --------------------------------------------------------------------------------------
# Linear-attention read-out


def linear_attention_bank(x: torch.Tensor, omegas: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a real value stream ``x [T]`` out through linear attention with RoPE.

    One head per (frequency, cos/sin) with ``D = 2M`` channels: keys ``k = (1…1, 0…0)`` and RoPE
    frequencies ``ω_n`` on the M pairs, query ``e_n`` (cos read-out) or ``e_{M+n}`` (sin
    read-out), values ``x``, decay ``exp(−α)`` on both channels of every pair (GLA's recurrence).
    By the RoPE trick, head ``n`` returns ``Σ_τ λ^{t−τ} cos(ω_n(t−τ)) x_τ`` and head ``M+n``
    ``−Σ_τ λ^{t−τ} sin(ω_n(t−τ)) x_τ``. Returns ``(o_gla [T, 2M], o_complex [T, 2M])``, the second
    from :func:`complex_rotation_recurrence` with the same q/k/v/decay.
    """
    length, count = x.shape[0], omegas.shape[0]
    heads, dim = 2 * count, 2 * count
    q = torch.zeros(1, length, heads, dim, dtype=F64)
    q[0, :, torch.arange(heads), torch.arange(heads)] = 1.0  # head h reads channel h
    k = torch.zeros(1, length, heads, dim, dtype=F64)
    k[..., :count] = 1.0
    v = x.to(F64)[None, :, None, None].expand(1, length, heads, 1)
    positions = torch.arange(length)[None]
    q_rot, k_rot = rope(q, k, positions, omegas.to(F64))
    log_decay = torch.full((1, length, heads, dim), -float(alpha), dtype=F64)
    o_gla, _ = gated_linear_attention_recurrence(q_rot, k_rot, v, log_decay)
    theta = omegas.to(F64).expand(1, length, heads, count)
    decay = torch.full((1, length, heads, count), math.exp(-alpha), dtype=F64)
    o_complex = complex_rotation_recurrence(q, k, v, theta, decay)
    return o_gla[0, :, :, 0], o_complex[0, :, :, 0]


def readout_magnitude(o: torch.Tensor) -> torch.Tensor:
    """``|Σ_τ λ^{t−τ} e^{iω_n(t−τ)} x_τ|`` from the cos/sin head pairs, ``[T, M]``."""
    count = o.shape[-1] // 2
    return torch.sqrt(o[..., :count].square() + o[..., count:].square())


# --------------------------------------------------------------------------------------
# The command


def _label(kind: str, alpha_n: float) -> str:
    return kind.replace("_", " ") + ("" if kind in ("rectangular", "hann") else f", αN={alpha_n:g}")


def _tone(length: int, bins: float, phase: float, complex_valued: bool) -> torch.Tensor:
    tau = torch.arange(length, dtype=F64)
    arg = 2 * math.pi * bins * tau / length + phase
    return torch.polar(torch.ones_like(tau), arg) if complex_valued else torch.cos(arg)


def _study(gen: torch.Generator, length: int, alpha_n: tuple[float, ...]) -> dict:
    omegas = 2 * math.pi * torch.arange(length, dtype=F64) / length
    phase = lambda: float(2 * math.pi * torch.rand((), generator=gen, dtype=F64))  # noqa: E731
    # 1. the recurrence is the windowed DFT at every step (decays and orders of the study)
    x = torch.randn(length, dtype=F64, generator=gen) + 1j * torch.randn(length, dtype=F64, generator=gen)
    equality = {}
    for an in (0.0, 4.0, 16.0):
        lam = math.exp(-an / length)
        for order in (1, 2):
            rec = rotation_bank(x, omegas, lam, order)
            closed = windowed_dft(x, omegas, window_weights(length, lam, order))
            equality[f"alphaN={an:g},order={order}"] = float(step_rel_errors(rec, closed).max())
    # 2. window figures of merit
    metrics = {"rectangular": window_metrics(window("rectangular", length)), "hann": window_metrics(window("hann", length))}
    for kind in ("one_sided_exponential", "two_sided_exponential", "two_pole"):
        metrics[kind] = {f"{an:g}": window_metrics(window(kind, length, an / length)) for an in alpha_n}
    # a rectangular window over the most recent L inputs with the one-sided window's ENBW (same resolution)
    metrics["rectangular_matched_enbw"] = {}
    for an in alpha_n:
        span = max(1, min(length, round(length / metrics["one_sided_exponential"][f"{an:g}"]["enbw_bins"])))
        recent = torch.zeros(length, dtype=F64)
        recent[length - span:] = 1.0
        metrics["rectangular_matched_enbw"][f"{an:g}"] = {"length": span, **window_metrics(recent)}
    # 3. a complex tone off the grid, read out by the recurrence bank at t = N-1
    tone_bin = length / 4 + 0.5
    tone = _tone(length, tone_bin, phase(), complex_valued=True)
    nearest = (torch.arange(length, dtype=F64) - tone_bin).abs() <= 2
    bank = {}
    for kind, an in EXAMPLES:
        if kind in ("rectangular", "one_sided_exponential", "two_pole"):  # realisable: run the recurrence
            h = rotation_bank(tone, omegas, math.exp(-an / length), order=2 if kind == "two_pole" else 1)[-1].abs()
        else:  # not a causal recurrence: the windowed DFT
            h = windowed_dft(tone, omegas, window(kind, length, an / length)[None].expand(length, -1))[-1].abs()
        bank[_label(kind, an)] = {
            "magnitude_db": 20 * torch.log10(h / h.max()),
            "energy_outside_4_nearest_channels": float(h[~nearest].square().sum() / h.square().sum()),
            "computed_by": "recurrence" if kind in ("rectangular", "one_sided_exponential", "two_pole") else "windowed DFT",
        }
    # 4. the linear-attention read-out: strong tone at bin 10.5, weak (-60 dB) at 40.5
    half = torch.arange(length // 2 + 1, dtype=F64)
    la_omegas = 2 * math.pi * half / length
    strong_bin, weak_bin, weak_db = 10.5, 40.5, -60.0
    strong = _tone(length, strong_bin, phase(), complex_valued=False)
    weak = 10 ** (weak_db / 20) * _tone(length, weak_bin, phase(), complex_valued=False)
    weak_channel = int(weak_bin)
    readout = {"alphaN": [0.0, *alpha_n], "contrast_db": [], "max_rel_err_gla_vs_complex": 0.0,
               "max_rel_err_gla_vs_windowed_dft": 0.0, "final_step_db": {}}
    for an in readout["alphaN"]:
        alpha = an / length
        mags = {}
        signals = [("strong", strong), ("weak", weak)] + ([("both", strong + weak)] if an in (0.0, 4.0, 16.0) else [])
        for name, signal in signals:
            o_gla, o_complex = linear_attention_bank(signal, la_omegas, alpha)
            closed = windowed_dft(signal.to(C128), la_omegas, window_weights(length, math.exp(-alpha)))
            mag = readout_magnitude(o_gla)
            readout["max_rel_err_gla_vs_complex"] = max(readout["max_rel_err_gla_vs_complex"], float((o_gla - o_complex).norm() / o_complex.norm()))
            readout["max_rel_err_gla_vs_windowed_dft"] = max(readout["max_rel_err_gla_vs_windowed_dft"], float((mag - closed.abs()).norm() / closed.abs().norm()))
            mags[name] = mag[-1]
        readout["contrast_db"].append(20 * math.log10(float(mags["weak"][weak_channel] / mags["strong"][weak_channel])))
        if an in (0.0, 4.0, 16.0):
            readout["final_step_db"][f"{an:g}"] = 20 * torch.log10(mags["both"] / mags["both"].max())
    hann = windowed_dft((strong + weak).to(C128), la_omegas, window("hann", length)[None].expand(length, -1))[-1].abs()
    readout["final_step_db"]["hann"] = 20 * torch.log10(hann / hann.max())
    window_contrast = {}
    for kind in ("hann", "two_sided_exponential", "two_pole"):
        values = []
        for an in ([0.0] if kind == "hann" else alpha_n):
            w = window(kind, length, an / length)[None].expand(length, -1)
            strong_h = windowed_dft(strong.to(C128), la_omegas, w)[-1].abs()
            weak_h = windowed_dft(weak.to(C128), la_omegas, w)[-1].abs()
            values.append(20 * math.log10(float(weak_h[weak_channel] / strong_h[weak_channel])))
        window_contrast[kind] = values
    readout.update(strong_bin=strong_bin, weak_bin=weak_bin, weak_db=weak_db, weak_channel=weak_channel,
                   window_contrast_db=window_contrast)
    return {"length": length, "alphaN": list(alpha_n), "recurrence_vs_windowed_dft_max_rel_err": equality,
            "window_metrics": metrics, "tone_bin": tone_bin, "bank": bank, "linear_attention": readout}


def _plot(st: dict, out: pathlib.Path) -> None:
    length, alpha_n = st["length"], st["alphaN"]
    fig, axes = new_figure(2, 3, (16, 9))
    ax = axes[0, 0]
    for (kind, an), color in zip(EXAMPLES, COLORS):
        w = window(kind, length, an / length)
        ax.plot(np.arange(length), (w / w.max()).numpy(), color=color, label=_label(kind, an))
    ax.set_xlabel(f"input index τ (read-out at step t = {length - 1})")
    ax.set_ylabel("window weight w_τ (max 1)")
    ax.set_title("(a) windows: a decay gate gives the one-sided exponential")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)

    ax = axes[0, 1]
    right = (np.arange(length) > st["tone_bin"]) & (np.arange(length) - st["tone_bin"] <= length / 2)  # up to the far side of the circle
    distance = np.arange(length)[right] - st["tone_bin"]
    for (kind, an), color in zip(EXAMPLES, COLORS):
        entry = st["bank"][_label(kind, an)]
        ax.semilogx(distance, np.asarray(entry["magnitude_db"])[right], ".-", ms=3, lw=1, color=color,
                    label=f"{_label(kind, an)} ({entry['computed_by']})")
    ax.set_ylim(-120, 5)
    ax.set_xlabel(f"channel distance from the tone n − {st['tone_bin']:g} (bins 2π/N)")
    ax.set_ylabel("|h_n| at t = N−1 (dB re max)")
    ax.set_title(f"(b) N = {length} channel bank, complex tone off the grid")
    ax.legend(fontsize=6)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[0, 2]
    metrics = st["window_metrics"]
    for kind, color in (("one_sided_exponential", "tab:blue"), ("two_sided_exponential", "tab:orange"), ("two_pole", "tab:purple")):
        for key, style in (("energy_outside_2_bins", "o-"), ("energy_outside_8_bins", "s--")):
            ax.loglog(alpha_n, [metrics[kind][f"{a:g}"][key] for a in alpha_n], style, color=color, ms=4,
                      label=f"{kind.replace('_', ' ')}: {key.replace('_', ' ')}")
    for kind, color in (("rectangular", "k"), ("hann", "tab:green")):
        ax.axhline(metrics[kind]["energy_outside_2_bins"], color=color, ls="-", lw=1, label=f"{kind}: outside 2 bins")
        ax.axhline(metrics[kind]["energy_outside_8_bins"], color=color, ls="--", lw=1, label=f"{kind}: outside 8 bins")
    ax.set_xlabel("decay × window length (αN)")
    ax.set_ylabel("fraction of energy outside ±2 / ±8 bins")
    ax.set_title("(c) leaked energy vs decay")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1, 0]
    for kind, color in (("one_sided_exponential", "tab:blue"), ("two_sided_exponential", "tab:orange"), ("two_pole", "tab:purple")):
        ax.semilogx(alpha_n, [metrics[kind][f"{a:g}"]["far_level_db"] for a in alpha_n], "o-", color=color, ms=4,
                    label=f"{kind.replace('_', ' ')}: max level beyond 16 bins")
        psl = [metrics[kind][f"{a:g}"]["peak_side_lobe_db"] for a in alpha_n]
        ax.semilogx(alpha_n, [np.nan if p is None else p for p in psl], "x:", color=color, ms=6,
                    label=f"{kind.replace('_', ' ')}: peak side lobe (none: monotone)")
    for kind, color in (("rectangular", "k"), ("hann", "tab:green")):
        ax.axhline(metrics[kind]["far_level_db"], color=color, lw=1, label=f"{kind}: beyond 16 bins")
        ax.axhline(metrics[kind]["peak_side_lobe_db"], color=color, ls=":", lw=1, label=f"{kind}: peak side lobe")
    ax.set_xlabel("decay × window length (αN)")
    ax.set_ylabel("level re peak (dB)")
    ax.set_title("(d) side lobes and far-field leakage vs decay")
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1, 1]
    la = st["linear_attention"]
    for key, color in (("0", "k"), ("4", "tab:blue"), ("16", "tab:cyan"), ("hann", "tab:green")):
        db = np.asarray(la["final_step_db"][key])
        label = {"0": "rotation only (rectangular)", "hann": "Hann window (windowed DFT, not a recurrence)"}.get(key, f"with decay, αN={key}")
        ax.plot(np.arange(db.size), db, color=color, lw=1, label=label)
    ax.axvline(la["strong_bin"], color="tab:red", ls=":", lw=1, label=f"strong tone (bin {la['strong_bin']})")
    ax.axvline(la["weak_bin"], color="tab:green", ls=":", lw=1, label=f"weak tone ({la['weak_db']:g} dB, bin {la['weak_bin']})")
    ax.set_ylim(-130, 5)
    ax.set_xlabel("read-out channel n (RoPE frequency 2πn/N)")
    ax.set_ylabel("|read-out| at t = N−1 (dB re max)")
    ax.set_title("(e) linear-attention read-out (GLA recurrence + RoPE)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)

    ax = axes[1, 2]
    ax.semilogx(la["alphaN"][1:], la["contrast_db"][1:], "o-", color="tab:blue", label="one-sided exp. (linear attention, decay gate)")
    ax.axhline(la["contrast_db"][0], color="k", label="rotation only (linear attention)")
    for kind, color in (("two_sided_exponential", "tab:orange"), ("two_pole", "tab:purple")):
        ax.semilogx(alpha_n, la["window_contrast_db"][kind], "s--", color=color, ms=4, label=kind.replace("_", " ") + " (windowed DFT)")
    ax.axhline(la["window_contrast_db"]["hann"][0], color="tab:green", label="hann (windowed DFT)")
    ax.axhline(0, color="0.5", ls=":", lw=1)
    ax.set_xlabel("decay × window length (αN)")
    ax.set_ylabel("weak tone / strong-tone leakage at its channel (dB)")
    ax.set_title("(f) is the weak tone visible? (> 0 dB: yes)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, out, NAME)


def run(out_dir: pathlib.Path, seed: int = 0) -> dict:
    """Leakage of rotation-only vs decayed recurrences; writes ``leakage.json`` / ``leakage.png``."""
    seed, out, start, gen = start_run(out_dir, seed)
    with single_thread():
        st = _study(gen, length=128, alpha_n=ALPHA_N)
    data = {"command": NAME, "seed": seed, "paper": "§3.2, App. A.4, Fig. 3: spectral leakage and decay", **st}
    data["checks"] = {
        "recurrence_equals_windowed_dft_1e-10": max(st["recurrence_vs_windowed_dft_max_rel_err"].values()) <= 1e-10,
        "gla_rope_readout_equals_complex_recurrence_1e-10": st["linear_attention"]["max_rel_err_gla_vs_complex"] <= 1e-10,
        "gla_rope_readout_equals_windowed_dft_1e-10": st["linear_attention"]["max_rel_err_gla_vs_windowed_dft"] <= 1e-10,
    }
    data["findings"] = _findings(st)
    data["seconds"] = time.perf_counter() - start
    _plot(st, out)
    data = write_json(out, NAME, data)
    print(f"leakage: wrote {out / (NAME + '.json')} and {out / (NAME + '.png')} in {data['seconds']:.1f} s")
    return data


def _findings(st: dict) -> list[str]:
    m = st["window_metrics"]
    one, two, pole, matched = m["one_sided_exponential"], m["two_sided_exponential"], m["two_pole"], m["rectangular_matched_enbw"]
    rect, hann = m["rectangular"], m["hann"]
    la, bank = st["linear_attention"], st["bank"]
    contrast = dict(zip(la["alphaN"], la["contrast_db"]))
    monotone = [a for a in st["alphaN"] if one[f"{a:g}"]["peak_side_lobe_db"] is None]
    best_two = max(zip(la["window_contrast_db"]["two_sided_exponential"], st["alphaN"]))

    def psl(v):
        return "none (monotone)" if v["peak_side_lobe_db"] is None else f"{v['peak_side_lobe_db']:.1f} dB"

    def leak(name):
        return f"{100 * bank[name]['energy_outside_4_nearest_channels']:.2f}%"

    return [
        "Window figures of merit (N = 128): " + "; ".join(
            f"{name}: peak side lobe {psl(v)}, fall-off {v['falloff_db_per_octave']:.1f} dB/oct, energy outside ±2 / ±8 bins "
            f"{100 * v['energy_outside_2_bins']:.2f}% / {100 * v['energy_outside_8_bins']:.2f}%, max level beyond 16 bins "
            f"{v['far_level_db']:.1f} dB, 3-dB width {v['bandwidth_3db_bins']:.2f} bins"
            for name, v in (("rectangular (rotation only)", rect), ("Hann", hann), ("one-sided exp. αN=4", one["4"]),
                            ("one-sided exp. αN=16", one["16"]), ("two-sided exp. αN=16", two["16"]), ("two-pole αN=16", pole["16"]))) + ".",
        f"Off-grid tone read out by the N-channel rotation bank: energy outside the 4 nearest channels is {leak('rectangular')} "
        f"with rotation only, {leak('one sided exponential, αN=4')} with decay αN=4, {leak('one sided exponential, αN=16')} with "
        f"αN=16, {leak('hann')} with a Hann window.",
        f"What decay does: the rectangular window's oscillating side lobes shrink (peak side lobe {psl(one['4'])} at αN=4) and "
        f"vanish (the response is monotone, no side lobe at all, for αN in {monotone}). What it does not do: the window still jumps from 1 to 0 at the "
        f"current step, so the far field keeps the rectangle's 1/Δω law ({one['4']['falloff_db_per_octave']:.1f} dB/oct at αN=4 vs "
        f"{rect['falloff_db_per_octave']:.1f}). At equal read-out length it leaks MORE far from the tone, relative to its peak "
        f"(beyond 16 bins {rect['far_level_db']:.1f} dB with rotation only vs {one['4']['far_level_db']:.1f} / {one['16']['far_level_db']:.1f} / "
        f"{one['64']['far_level_db']:.1f} dB at αN = 4 / 16 / 64). At equal resolution (a rectangle over the last L inputs with the "
        f"same ENBW) the far field is about the same ({one['4']['far_level_db']:.1f} vs {matched['4']['far_level_db']:.1f} dB at αN=4, "
        f"{one['16']['far_level_db']:.1f} vs {matched['16']['far_level_db']:.1f} dB at αN=16) and the energy beyond ±8 bins about twice "
        f"the rectangle's ({100 * one['4']['energy_outside_8_bins']:.1f}% vs {100 * matched['4']['energy_outside_8_bins']:.1f}%, "
        f"{100 * one['16']['energy_outside_8_bins']:.1f}% vs {100 * matched['16']['energy_outside_8_bins']:.1f}%).",
        f"The tapers of the paper's Fig. 3 and of Harris' Poisson window vanish (or nearly) at BOTH ends: Hann "
        f"({hann['falloff_db_per_octave']:.1f} dB/oct, {hann['far_level_db']:.1f} dB beyond 16 bins) and the two-sided exponential "
        f"({two['8']['far_level_db']:.1f} dB beyond 16 bins at αN=8). A decayed rotation read out at the current step cannot produce "
        "them (the paper's App. A.4 formula w_τ = exp(-αΔτ) is the one-sided window, though it is named Poisson). A causal window that "
        f"is continuous at the present does exist: two cascaded decayed rotations (two-pole, {pole['8']['falloff_db_per_octave']:.1f} dB/oct, "
        f"{pole['8']['far_level_db']:.1f} dB beyond 16 bins at αN=8).",
        f"Inside a linear-attention read-out (GLA recurrence on RoPE-rotated q/k with a tied decay; equal to the complex rotation "
        f"recurrence to {la['max_rel_err_gla_vs_complex']:.1e} and to the windowed DFT to {la['max_rel_err_gla_vs_windowed_dft']:.1e}): a "
        f"tone {-la['weak_db']:g} dB below a strong tone 30 bins away is masked by the strong tone's leakage with rotation only "
        f"(weak/leakage {contrast[0.0]:.1f} dB) and more so with decay ({contrast[4.0]:.1f} dB at αN=4, {contrast[16.0]:.1f} dB at "
        f"αN=16, {contrast[64.0]:.1f} dB at αN=64); it is visible with a Hann window ({la['window_contrast_db']['hann'][0]:.1f} dB) and "
        f"with the two-sided exponential at αN={best_two[1]:g} ({best_two[0]:.1f} dB).",
        "Verdict on the paper's claim (§3.2, App. A.4) that the decay (the real part of the transition) suppresses leakage: not "
        "supported as stated. A decay gate removes the side-lobe ripple but not the leakage, which comes from the cut at the current "
        "step that every causal one-pole window has; at equal length it leaks more, at equal resolution about as much. Decay gives "
        "forgetting (a finite effective window ~1/α); a leakage-suppressing taper needs a window that vanishes at both ends.",
    ]


if __name__ == "__main__":
    from srope.lab.theory._common import script

    script(run, "leakage")
