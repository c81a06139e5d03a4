"""The paper's theory as runnable, checked code: ``srope theory {rff,temperature,leakage}``,
or each module as a script, ``python -m srope.lab.theory.rff [--out DIR] [--seed N]``.

- :mod:`srope.lab.theory.rff`: softmax attention as an input-dependent rotation (random
  Fourier features, §3.1 / App. A.2).
- :mod:`srope.lab.theory.temperature`: Theorem 1 (the optimal RFF scale), checked against the
  estimator it is meant to describe, and the temperature spectra (App. A.3).
- :mod:`srope.lab.theory.leakage`: rotation-only recurrences as windowed DFTs, and what decay
  does to spectral leakage (§3.2 / App. A.4).

Each module's ``run(out_dir, seed=0) -> dict`` writes ``<name>.json`` and ``<name>.png``.
"""

from __future__ import annotations

from srope.lab.theory import leakage, rff, temperature

COMMANDS = {"rff": rff.run, "temperature": temperature.run, "leakage": leakage.run}

__all__ = ["COMMANDS"]
