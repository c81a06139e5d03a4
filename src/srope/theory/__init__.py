"""The paper's theory as runnable, checked code (``srope theory {rff,temperature,leakage}``).

- :mod:`srope.theory.rff`: softmax attention as an input-dependent rotation (random
  Fourier features, §3.1 / App. A.2).
- :mod:`srope.theory.temperature`: Theorem 1 (the optimal RFF scale), checked against the
  estimator it is meant to describe, and the temperature spectra (App. A.3).
- :mod:`srope.theory.leakage`: rotation-only recurrences as windowed DFTs, and what decay
  does to spectral leakage (§3.2 / App. A.4).

Each module's ``run(out_dir, seed=0) -> dict`` writes ``<name>.json`` and ``<name>.png``.
"""

from __future__ import annotations

from srope.theory import leakage, rff, temperature

COMMANDS = {"rff": rff.run, "temperature": temperature.run, "leakage": leakage.run}

__all__ = ["COMMANDS"]
