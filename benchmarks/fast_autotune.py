"""Run a script with Triton autotuning cut to the first candidate config that runs, for correctness
checks on a fresh GPU machine (fla's first autotune of a new shape costs minutes; any single
config computes the same result). Never use it for timings.

    python benchmarks/fast_autotune.py benchmarks/check_cuda.py --data STORE --out ...
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from srope.lab.tasks import autotune  # noqa: E402

autotune.apply("first")  # also for synthetic runs started inside, and their workers
if sys.argv[1] == "-m":  # python benchmarks/fast_autotune.py -m pytest ...
    module, sys.argv = sys.argv[2], sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
