"""Temperature spectra: the fixed frequency of each rotation pair.

- ``rope``: RoPE's ``max · θ^{-2j/(2R)}``, ``j < R`` (geometric from ``max`` down).
- ``rfa``: the paper's tan(φ/2) spectrum (Theorem 1, App. A.3.1): ``φ_j = j (1-ε)π / (R-1)``,
  ``Θ_j = tan(φ_j / 2)``, rescaled so that its largest value is ``max``. Pair 0 has
  frequency 0 (it never rotates), as in the paper.
- ``rfa-float32``: ``rfa`` as the authors' release computes it, for reproducing its runs: tan(φ/2)
  as ``sqrt((1 - cos φ) / (1 + cos φ))`` in float32 (their ``rotary_temperature``,
  src/selective_rope/modules/rotary.py:18-31 at d12e825). Near φ = π, ``1 + cos φ`` keeps few of
  its digits in float32, so at ε = 1e-4 the largest raw value comes out 9% low and, after the
  rescaling, every pair but the first and last is 1.099 times the exact spectrum's.
- ``uniform``: every pair at ``max`` (the authors' state-tracking setting, rope with θ = 1).

All are returned in float64 from the configuration (``rfa-float32``'s float32 values exactly),
so casting a model to bf16 can never quantise a fixed spectrum.
"""

from __future__ import annotations

import math

import torch

SPECTRA = ("rope", "rfa", "rfa-float32", "uniform")


def temperature_spectrum(
    kind: str,
    pairs: int,
    *,
    theta: float = 500000.0,
    epsilon: float = 1e-4,
    max_value: float = 1.0,
) -> torch.Tensor:
    """The ``[pairs]`` float64 spectrum ``kind`` (see the module docstring)."""
    if pairs < 1:
        raise ValueError(f"the number of rotation pairs must be >= 1, got {pairs}")
    if not (math.isfinite(max_value) and max_value > 0):
        raise ValueError(f"max_value must be a positive number, got {max_value}")
    if kind == "rope":
        if not 1.0 <= theta < math.inf:
            raise ValueError(f"the rope spectrum needs a finite theta >= 1, got {theta}")
        return max_value * float(theta) ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
    if kind in ("rfa", "rfa-float32"):
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"the {kind} spectrum needs 0 < epsilon < 1, got {epsilon}")
        if pairs == 1:  # (the release's formula gives 0 / 0 here)
            return torch.full((1,), float(max_value), dtype=torch.float64)
        if kind == "rfa-float32":  # the release's operations in its order, in float32
            angles = torch.linspace(0.0, float((1.0 - epsilon) * math.pi), steps=pairs, dtype=torch.float32)
            raw = torch.sqrt((1 - torch.cos(angles)) / (1 + torch.cos(angles)))
            values = (max_value * raw / torch.max(raw)).double()
            if not torch.isfinite(values).all():
                raise ValueError(f"the rfa-float32 spectrum is not finite at epsilon={epsilon}: float32 rounds 1 + cos φ to 0 "
                                 "for the last pair (epsilon below about 8.5e-5); use spectrum 'rfa'")
            return values
        angles = torch.arange(pairs, dtype=torch.float64) * ((1.0 - epsilon) * math.pi / (pairs - 1))
        raw = torch.tan(angles / 2)
        return max_value * raw / raw.max()
    if kind == "uniform":
        return torch.full((pairs,), float(max_value), dtype=torch.float64)
    raise ValueError(f"unknown temperature spectrum {kind!r}; expected one of {SPECTRA}")
