"""Softmax attention as an input-dependent rotation, through random Fourier features
(paper §3.1 and App. A.2).

**Features** (paper eq. 8, App. A.2), with ω ~ N(0, I)::

    φ_ω(q) = exp(‖q‖²/2 + i ωᵀq)    (query),     φ̄_ω(k) = exp(‖k‖²/2 − i ωᵀk)    (key, conjugated)

so ``E_ω[φ_ω(q) φ̄_ω(k)] = exp((‖q‖²+‖k‖²)/2) · E[exp(iωᵀ(q−k))] = exp(qᵀk)``, because the
characteristic function of ``ωᵀ(q−k) ~ N(0, ‖q−k‖²)`` is ``exp(−‖q−k‖²/2)``. The D-feature
estimate is the real part of the mean over D independent ω_j (the paper's Re{·}).

**Predicted standard deviation (closed form).** With ``u = ωᵀ(q−k) ~ N(0, r)``, ``r = ‖q−k‖²``:
``E[cos u] = e^{−r/2}`` and ``E[cos² u] = (1 + E[cos 2u])/2 = (1 + e^{−2r})/2``, so
``Var[cos u] = (1 − e^{−r})²/2`` and the D-feature estimate has standard deviation::

    std_D(q, k) = exp((‖q‖²+‖k‖²)/2) · (1 − exp(−‖q−k‖²)) / √(2D)

which for unit q, k with ``ξ = qᵀk`` is ``e · (1 − e^{−2(1−ξ)}) / √(2D)``: the error falls as
``D^{-1/2}``.

**Recurrence** (App. A.2, eq. 19 of v3). Stacking D features ``Ω = [ω_1 … ω_D]``::

    Ŝ_t = Ŝ_{t−1} · diag(exp(iΩᵀ(q_t − q_{t−1}))) + v_t (φ(q_t) ∘ φ̄(k_t))ᵀ,     ŝ_t = Re(Ŝ_t 1) / D.

Column j of Ŝ_t is ``Σ_τ v_τ φ_j(q_τ) φ̄_j(k_τ) e^{iω_jᵀ(q_t − q_τ)}``, which equals
``Σ_τ v_τ φ_j(q_t) φ̄_j(k_τ)`` exactly when ``‖q_τ‖ = ‖q_t‖`` (the paper's ℓ2-normalised
queries): the closed-form D-feature estimate of the unnormalised softmax numerator
``s_t = Σ_{τ≤t} exp(q_tᵀk_τ) v_τ``. The transition is a pure, input-dependent rotation. With
unnormalised queries the rotation alone is wrong (the real factor
``exp((‖q_t‖² − ‖q_{t−1}‖²)/2)`` is missing); the tests check that this variant fails.
"""

from __future__ import annotations

import math
import pathlib
import time

import numpy as np
import torch

from srope.ops.mixers.naive import complex_rotation_recurrence
from srope.lab.theory._common import (
    start_run,
    loglog_slope,
    new_figure,
    save_figure,
    single_thread,
    step_rel_errors,
    write_json,
)

NAME = "rff"
F64 = torch.float64


# --------------------------------------------------------------------------------------
# Features and the single-pair estimate


def unit_pairs(angles: torch.Tensor, dim: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random unit vectors q, k ``[P, dim]`` with ``∠(q, k) = angles [P]`` (radians)."""
    if dim < 2:
        raise ValueError(f"dim must be >= 2 to place two vectors at an angle, got {dim}")
    q = torch.randn(angles.numel(), dim, generator=gen, dtype=F64)
    q = q / q.norm(dim=-1, keepdim=True)
    u = torch.randn(angles.numel(), dim, generator=gen, dtype=F64)
    u = u - (u * q).sum(-1, keepdim=True) * q
    u = u / u.norm(dim=-1, keepdim=True)
    angles = angles.to(F64)[:, None]
    return q, torch.cos(angles) * q + torch.sin(angles) * u


def features(x: torch.Tensor, omega: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """``φ_ω(x) = exp(‖x‖²/2 + i·sign·ωᵀx)`` for ``x [..., d]`` and ``omega [..., D, d]``
    (or ``[D, d]``); returns complex ``[..., D]``."""
    projection = torch.einsum("...d,...jd->...j", x, omega) if omega.dim() > 2 else x @ omega.T
    magnitude = torch.exp(0.5 * x.square().sum(-1, keepdim=True)).expand_as(projection)
    return torch.polar(magnitude, sign * projection)


def rff_estimate(q: torch.Tensor, k: torch.Tensor, omega: torch.Tensor, conjugate_key: bool = True) -> torch.Tensor:
    """The D-feature estimate ``(1/D) Σ_j φ_{ω_j}(q) φ̄_{ω_j}(k)`` of ``exp(qᵀk)`` (complex;
    the estimate is its real part). ``conjugate_key=False`` uses ``φ(k)`` instead of ``φ̄(k)``,
    the estimator whose mean is ``exp(−qᵀk)`` for unit vectors (the wrong variant)."""
    key = features(k, omega, -1.0 if conjugate_key else 1.0)
    return (features(q, omega, 1.0) * key).mean(-1)


def predicted_std(q: torch.Tensor, k: torch.Tensor, num_features: int) -> torch.Tensor:
    """Closed-form standard deviation of ``Re(rff_estimate)`` with D features (module docstring)."""
    scale = torch.exp(0.5 * (q.square().sum(-1) + k.square().sum(-1)))
    return scale * (-torch.expm1(-(q - k).square().sum(-1))) / math.sqrt(2.0 * num_features)


def convergence_study(
    gen: torch.Generator,
    *,
    pairs: int = 4000,
    dim: int = 8,
    feature_counts: tuple[int, ...] = tuple(2**i for i in range(11)),
    chunk_elements: int = 2**21,
    progress: bool = False,
) -> dict:
    """Error of the D-feature estimate over random unit pairs (angle ~ U[0, π]) against D.

    Every (pair, D) gets fresh ω. Returns per-D statistics of the error ``e = Re(est) −
    exp(qᵀk)`` and of its standardised value ``z = e / std_D``: RMS error, predicted RMS
    ``sqrt(mean std_D²)``, ``mean z`` (0 if unbiased) and ``mean z²`` (1 if the predicted std
    is right) with their standard errors, and the fraction of pairs with ``|z| > 3``. The same
    ω also drive the unconjugated-key estimator, for contrast.
    """
    angles = math.pi * torch.rand(pairs, generator=gen, dtype=F64)
    q, k = unit_pairs(angles, dim, gen)
    target = torch.exp((q * k).sum(-1))
    stats = {key: [] for key in (
        "rms_error", "rms_predicted", "mean_z", "se_mean_z", "mean_z2", "se_mean_z2", "frac_beyond_3sigma",
        "max_abs_z", "unconjugated_rms_error",
    )}
    iterator = feature_counts
    if progress:
        from tqdm import tqdm

        iterator = tqdm(feature_counts, desc="rff: error vs D", leave=False)
    for count in iterator:
        errors, wrong = [], []
        step = max(1, chunk_elements // (count * dim))
        for start in range(0, pairs, step):
            sl = slice(start, start + step)
            omega = torch.randn(q[sl].shape[0], count, dim, generator=gen, dtype=F64)
            query, key = features(q[sl], omega, 1.0), features(k[sl], omega, -1.0)  # = rff_estimate, features shared
            errors.append((query * key).mean(-1).real - target[sl])
            wrong.append((query * key.conj()).mean(-1).real - target[sl])  # φ(k) = conj(φ̄(k)) for real k
        err, wrong = torch.cat(errors), torch.cat(wrong)
        std = predicted_std(q, k, count)
        z = err / std
        stats["rms_error"].append(err.square().mean().sqrt().item())
        stats["rms_predicted"].append(std.square().mean().sqrt().item())
        stats["mean_z"].append(z.mean().item())
        stats["se_mean_z"].append((z.std() / math.sqrt(pairs)).item())
        stats["mean_z2"].append(z.square().mean().item())
        stats["se_mean_z2"].append((z.square().std() / math.sqrt(pairs)).item())
        stats["frac_beyond_3sigma"].append((z.abs() > 3).double().mean().item())
        stats["max_abs_z"].append(z.abs().max().item())
        stats["unconjugated_rms_error"].append(wrong.square().mean().sqrt().item())
    stats["features"] = list(feature_counts)
    stats["slope"] = loglog_slope(feature_counts, stats["rms_error"])
    stats["unconjugated_slope"] = loglog_slope(feature_counts, stats["unconjugated_rms_error"])
    stats["pairs"], stats["dim"] = pairs, dim
    return stats


# --------------------------------------------------------------------------------------
# The sequence: recurrence, closed form, exact numerator


def rff_recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``Ŝ_t = Ŝ_{t−1} diag(exp(iΩᵀ(q_t − q_{t−1}))) + v_t (φ(q_t) ∘ φ̄(k_t))ᵀ`` token by token.

    ``q, k [T, d]``, ``v [T, dv]``, ``omega [D, d]``. Returns ``(ŝ [T, dv], ẑ [T])``: the real
    read-outs ``Re(Ŝ_t 1)/D`` and the normaliser ``Re(Ẑ_t 1)/D`` (same recurrence, v = 1).
    """
    length, count = q.shape[0], omega.shape[0]
    feature = features(q, omega, 1.0) * features(k, omega, -1.0)  # [T, D]: φ(q_t) ∘ φ̄(k_t)
    state = torch.zeros(v.shape[1] + 1, count, dtype=feature.dtype)  # rows: v channels, then the normaliser
    values = torch.cat([v.to(F64), torch.ones(length, 1, dtype=F64)], dim=1)
    outputs = []
    for t in range(length):
        step = q[t] - q[t - 1] if t > 0 else torch.zeros_like(q[t])  # Ŝ_0 = 0: the first rotation is irrelevant
        rotation = torch.polar(torch.ones(count, dtype=F64), omega @ step)  # diag(exp(iΩᵀ(q_t − q_{t−1})))
        state = state * rotation + values[t, :, None] * feature[t]
        outputs.append(state.sum(-1).real / count)
    out = torch.stack(outputs)
    return out[:, :-1], out[:, -1]


def rff_closed_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``ŝ_t = Σ_{τ≤t} v_τ · Re((1/D) Σ_j φ_j(q_t) φ̄_j(k_τ))``, ``[T, dv]``."""
    kernel = (features(q, omega, 1.0) @ features(k, omega, -1.0).T).real / omega.shape[0]
    return torch.tril(kernel) @ v.to(F64)


def softmax_numerator(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact ``s_t = Σ_{τ≤t} exp(q_tᵀk_τ) v_τ`` (no 1/√d, as in the paper), ``[T, dv]``."""
    return torch.tril(torch.exp(q @ k.T)) @ v.to(F64)


def predicted_numerator_variance(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Closed-form variance ``[T, dv]`` of ``ŝ_t`` with ONE feature (divide by D for D).

    ``ŝ_t = Σ_τ c_τ v_τ cos(ωᵀa_τ)`` with ``a_τ = q_t − k_τ``, ``c_τ = exp((‖q_t‖²+‖k_τ‖²)/2)``;
    the terms share ω, so ``Cov(cos ωᵀa, cos ωᵀb) = ½(e^{−‖a−b‖²/2} + e^{−‖a+b‖²/2}) −
    e^{−(‖a‖²+‖b‖²)/2}``.
    """
    rows = []
    for t in range(q.shape[0]):
        a = q[t] - k[: t + 1]
        scale = torch.exp(0.5 * (q[t].square().sum() + k[: t + 1].square().sum(-1)))
        sq = a.square().sum(-1)
        minus = torch.cdist(a, a).square()
        plus = (a[:, None] + a[None]).square().sum(-1)
        cov = 0.5 * (torch.exp(-minus / 2) + torch.exp(-plus / 2)) - torch.exp(-(sq[:, None] + sq[None]) / 2)
        weighted = scale[:, None] * v[: t + 1].to(F64)  # [t+1, dv]
        rows.append(torch.einsum("ac,ab,bc->c", weighted, cov, weighted))
    return torch.stack(rows)


def library_recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """The same ŝ computed by :func:`srope.ops.mixers.naive.complex_rotation_recurrence`, the
    complex diagonal recurrence Selective RoPE realises: angles ``θ_t = Ωᵀ(q_t − q_{t−1})``,
    key ``k̃_t = conj(φ(q_t) ∘ φ̄(k_t))`` (so that ``v_t k̃_tᴴ`` is the paper's write), and
    query ``q̃ = 1/D`` (the read-out ``Re(Ŝ_t 1)/D``). Returns ``[T, dv]``."""
    length, count = q.shape[0], omega.shape[0]
    key = (features(q, omega, 1.0) * features(k, omega, -1.0)).conj()
    steps = torch.cat([torch.zeros_like(q[:1]), q[1:] - q[:-1]])
    theta = (steps @ omega.T)[None, :, None]
    q_real = torch.cat([torch.full((length, count), 1.0 / count, dtype=F64), torch.zeros(length, count, dtype=F64)], -1)
    k_real = torch.cat([key.real, key.imag], -1)
    return complex_rotation_recurrence(q_real[None, :, None], k_real[None, :, None], v.to(F64)[None, :, None], theta)[0, :, 0]


def sequence_study(
    gen: torch.Generator,
    *,
    length: int = 33,
    dim: int = 8,
    value_dim: int = 4,
    feature_counts: tuple[int, ...] = (4, 16, 64, 256, 1024, 4096, 16384),
    repeats: int = 8,
    progress: bool = False,
) -> dict:
    """1(b): recurrence vs closed form at every step, and convergence to the exact s_t."""
    q = torch.randn(length, dim, generator=gen, dtype=F64)
    q = q / q.norm(dim=-1, keepdim=True)
    k = torch.randn(length, dim, generator=gen, dtype=F64)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(length, value_dim, generator=gen, dtype=F64)
    exact = softmax_numerator(q, k, v)
    exact_out = exact / torch.tril(torch.exp(q @ k.T)).sum(-1, keepdim=True)
    variance_one = predicted_numerator_variance(q, k, v)
    result = {key: [] for key in ("max_step_rel_err_recurrence_vs_closed_form", "rel_rms_err_vs_exact",
                                  "rel_rms_err_predicted", "rel_rms_err_output_vs_softmax")}
    trajectories = {}
    iterator = feature_counts
    if progress:
        from tqdm import tqdm

        iterator = tqdm(feature_counts, desc="rff: sequence", leave=False)
    for count in iterator:
        worst, sq_err, sq_out = 0.0, 0.0, 0.0
        for rep in range(repeats):
            omega = torch.randn(count, dim, generator=gen, dtype=F64)
            rec, norm = rff_recurrence(q, k, v, omega)
            closed = rff_closed_form(q, k, v, omega)
            worst = max(worst, step_rel_errors(rec, closed).max().item())
            sq_err += (closed - exact).square().sum().item()
            sq_out += (rec / norm[:, None] - exact_out).square().sum().item()
            if rep == 0:
                trajectories[count] = rec[:, 0]
        result["max_step_rel_err_recurrence_vs_closed_form"].append(worst)
        result["rel_rms_err_vs_exact"].append(math.sqrt(sq_err / repeats) / exact.norm().item())
        result["rel_rms_err_predicted"].append(math.sqrt(variance_one.sum().item() / count) / exact.norm().item())
        result["rel_rms_err_output_vs_softmax"].append(math.sqrt(sq_out / repeats) / exact_out.norm().item())
    omega = torch.randn(256, dim, generator=gen, dtype=F64)
    rec, _ = rff_recurrence(q, k, v, omega)
    library = library_recurrence(q, k, v, omega)
    # The wrong variant: queries with varying norms, rotation only (no real magnitude factor).
    scaled_q = q * (0.5 + torch.rand(length, 1, generator=gen, dtype=F64))
    wrong = step_rel_errors(rff_recurrence(scaled_q, k, v, omega)[0], rff_closed_form(scaled_q, k, v, omega))
    result.update(
        features=list(feature_counts),
        repeats=repeats,
        length=length,
        dim=dim,
        value_dim=value_dim,
        slope_vs_exact=loglog_slope(feature_counts, result["rel_rms_err_vs_exact"]),
        max_step_rel_err_library_vs_recurrence=step_rel_errors(library, rec).max().item(),
        unnormalised_queries_max_step_rel_err=wrong.max().item(),
        trajectory_channel0={"exact": exact[:, 0], **{f"D={c}": trajectories[c] for c in feature_counts}},
    )
    return result


# --------------------------------------------------------------------------------------
# The command


def _plot(conv: dict, seq: dict, out: pathlib.Path) -> None:
    fig, axes = new_figure(2, 2, (11, 8))
    ax = axes[0, 0]
    feats = np.array(conv["features"])
    ax.loglog(feats, conv["rms_error"], "o-", label=f"conjugated key (eq. 8): slope {conv['slope']:.3f}")
    ax.loglog(feats, conv["rms_predicted"], "k--", label="predicted std (closed form)")
    ax.loglog(feats, 3 * np.array(conv["rms_predicted"]), "k:", label="3 × predicted")
    ax.loglog(feats, conv["unconjugated_rms_error"], "s-", color="tab:red",
              label=f"unconjugated key: slope {conv['unconjugated_slope']:.3f}")
    ax.set_xlabel("number of random features D")
    ax.set_ylabel("RMS error of Re estimate of exp(qᵀk)")
    ax.set_title(f"(a) RFF estimate, {conv['pairs']} unit pairs, d={conv['dim']}, angle ~ U[0, π]")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[0, 1]
    ax.semilogx(feats, conv["mean_z2"], "o-", label="mean z² (1 if the std is right)")
    ax.semilogx(feats, conv["mean_z"], "s-", label="mean z (0 if unbiased)")
    ax.semilogx(feats, 100 * np.array(conv["frac_beyond_3sigma"]), "^-", label="% of pairs with |z| > 3")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlabel("number of random features D")
    ax.set_ylabel("standardised error z = error / predicted std")
    ax.set_title("(b) error in units of the predicted std")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1, 0]
    sfeats = np.array(seq["features"])
    ax.loglog(sfeats, seq["rel_rms_err_vs_exact"], "o-", label=f"ŝ_t vs exact s_t: slope {seq['slope_vs_exact']:.3f}")
    ax.loglog(sfeats, seq["rel_rms_err_predicted"], "k--", label="predicted (closed-form covariance)")
    ax.loglog(sfeats, seq["rel_rms_err_output_vs_softmax"], "s-", label="ŝ_t / ẑ_t vs softmax output")
    ax.loglog(sfeats, np.maximum(seq["max_step_rel_err_recurrence_vs_closed_form"], 1e-17), "^-",
              label="recurrence vs closed form (max over steps)")
    ax.axhline(1e-10, color="tab:red", ls=":", label="1e-10 tolerance")
    ax.set_xlabel("number of random features D")
    ax.set_ylabel("relative error")
    ax.set_title(f"(c) rotation recurrence, T={seq['length']}, float64")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1, 1]
    traj = seq["trajectory_channel0"]
    steps = np.arange(1, len(traj["exact"]) + 1)
    for count in (16, 256, 16384):
        if f"D={count}" in traj:
            ax.plot(steps, traj[f"D={count}"], lw=1, label=f"recurrence, D={count}")
    ax.plot(steps, traj["exact"], "k-", lw=2, label="exact s_t")
    ax.set_xlabel("step t")
    ax.set_ylabel("s_t, value channel 0")
    ax.set_title("(d) softmax numerator from the rotation recurrence")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    save_figure(fig, out, NAME)


def run(out_dir: pathlib.Path, seed: int = 0) -> dict:
    """Compute 1(a) and 1(b), write ``rff.json`` and ``rff.png`` into ``out_dir``, return the JSON dict."""
    seed, out, start, gen = start_run(out_dir, seed)
    with single_thread():
        conv = convergence_study(gen, progress=True)
        seq = sequence_study(gen, progress=True)
    slope_ok = abs(conv["slope"] + 0.5) <= 0.1
    unbiased = all(abs(m) <= 3 * s for m, s in zip(conv["mean_z"], conv["se_mean_z"]))
    # D = 1 excluded: z² is then strongly skewed and its sample standard error unreliable.
    std_ok = all(abs(m - 1) <= 3 * s for d, m, s in zip(conv["features"], conv["mean_z2"], conv["se_mean_z2"]) if d > 1)
    worst_rec = max(seq["max_step_rel_err_recurrence_vs_closed_form"])
    checks = {
        "slope_within_0.1_of_-0.5": slope_ok,
        "mean_error_within_3_standard_errors_of_0_at_every_D": unbiased,
        "mean_z2_within_3_standard_errors_of_1_for_D_above_1": std_ok,
        "rms_error_within_3x_predicted_std_at_every_D": all(
            e <= 3 * p for e, p in zip(conv["rms_error"], conv["rms_predicted"])),
        "max_fraction_beyond_3_predicted_std": max(conv["frac_beyond_3sigma"]),
        "recurrence_equals_closed_form_1e-10": worst_rec <= 1e-10,
        "library_complex_rotation_recurrence_equals_1e-10": seq["max_step_rel_err_library_vs_recurrence"] <= 1e-10,
    }
    findings = [
        f"RFF error falls as D^{conv['slope']:.3f} (paper/theory: D^-0.5); mean z² = "
        f"{min(conv['mean_z2']):.3f}..{max(conv['mean_z2']):.3f} over D, so the closed-form std "
        "e(1-exp(-|q-k|²))/sqrt(2D) is the right scale; at most "
        f"{100 * max(conv['frac_beyond_3sigma']):.2f}% of pairs fall beyond 3 predicted std "
        f"(largest at D=1, where the estimate is far from Gaussian; Chebyshev bound 11.1%).",
        f"With the key NOT conjugated (φ(q)φ(k), the form Theorem 1's proof expands) the estimate "
        f"converges to exp(-qᵀk) instead: its error vs exp(qᵀk) stops falling (slope {conv['unconjugated_slope']:.3f}).",
        f"The pure-rotation recurrence reproduces the closed-form D-feature estimate at every step "
        f"(max relative error {worst_rec:.1e}); the library's complex_rotation_recurrence gives the same "
        f"({seq['max_step_rel_err_library_vs_recurrence']:.1e}). With unnormalised queries the rotation "
        f"alone is wrong (max relative error {seq['unnormalised_queries_max_step_rel_err']:.2f}): the paper's "
        "ℓ2-normalisation is needed.",
        f"The estimate converges to the exact softmax numerator as D^{seq['slope_vs_exact']:.3f}, matching "
        "the closed-form covariance prediction (relative error "
        + ", ".join(f"D={d}: {e:.3f}" for d, e in zip(seq["features"], seq["rel_rms_err_vs_exact"])) + "). "
        "The normalised output ŝ_t/ẑ_t is unreliable at small D, where ẑ_t can come near 0 (relative error "
        f"{seq['rel_rms_err_output_vs_softmax'][0]:.2f} at D={seq['features'][0]}, "
        f"{seq['rel_rms_err_output_vs_softmax'][-1]:.3f} at D={seq['features'][-1]}).",
    ]
    data = {
        "command": NAME,
        "seed": seed,
        "paper": "§3.1, App. A.2: softmax attention as a recurrence with input-dependent rotations",
        "convergence": conv,
        "sequence": seq,
        "checks": checks,
        "findings": findings,
        "seconds": time.perf_counter() - start,
    }
    _plot(conv, seq, out)
    data = write_json(out, NAME, data)
    print(f"rff: wrote {out / (NAME + '.json')} and {out / (NAME + '.png')} in {data['seconds']:.1f} s")
    return data


if __name__ == "__main__":
    from srope.lab.theory._common import script

    script(run, "rff")
