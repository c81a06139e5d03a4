"""Run a script with Triton autotuning cut to the first candidate config, for correctness
checks on a fresh GPU machine (fla's first autotune of a new shape costs minutes; any single
config computes the same result). Never use it for timings.

    python benchmarks/fast_autotune.py benchmarks/check_cuda_models.py --out ...
"""

import runpy
import sys

from triton.runtime import autotuner

_prune = autotuner.Autotuner.prune_configs


def _first_config(self, *args, **kwargs):
    return _prune(self, *args, **kwargs)[:1]


autotuner.Autotuner.prune_configs = _first_config
if sys.argv[1] == "-m":  # python benchmarks/fast_autotune.py -m pytest ...
    module, sys.argv = sys.argv[2], sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
