"""Run a script with Triton autotuning cut to the first candidate config that runs, for correctness
checks on a fresh GPU machine (fla's first autotune of a new shape costs minutes; any single
config computes the same result). Never use it for timings.

    python benchmarks/fast_autotune.py benchmarks/check_cuda.py --data STORE --out ...
    python benchmarks/fast_autotune.py -m pytest ...

srope must be importable (installed, or PYTHONPATH=src as benchmarks/device-env.sh sets). The
script runs in this process with this process's sys.path, whose first entry Python made this
file's folder, benchmarks/: a benchmark script finds its neighbours (``from common import ...``)
as when it runs alone; a script elsewhere gets no folder of its own on sys.path.
"""

import runpy
import sys

import common  # noqa: F401  (first: says how to make srope importable when it is not)
from srope.lab.tasks import autotune

autotune.apply("first")  # also for synthetic runs started inside, and their workers
if sys.argv[1] == "-m":  # python benchmarks/fast_autotune.py -m pytest ...
    module, sys.argv = sys.argv[2], sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
