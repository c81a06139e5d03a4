"""No code of ours edits sys.path: srope is imported as installed (or through PYTHONPATH=src), and a
benchmark script finds its neighbours because Python puts the script's folder first on sys.path.
Two exceptions, each for a reason: experiments/vs_authors.py imports the authors' release from
its checkout on purpose, and tests/benchmarks/conftest.py does for one test what Python does
for ``python benchmarks/NAME.py`` (pytest's monkeypatch, undone after the test)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\[|[+]?=)|syspath_prepend")
ALLOWED = {
    "experiments/vs_authors.py": {"sys.path.insert", "sys.path["},
    "tests/benchmarks/conftest.py": {"syspath_prepend"},
}


def test_no_code_edits_sys_path():
    hits = []
    for folder in ("src", "benchmarks", "tests", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == "tests/test_no_sys_path.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for match in EDIT.finditer(line):
                    if not any(match.group().startswith(allowed) for allowed in ALLOWED.get(name, ())):
                        hits.append(f"{name}:{number}: {line.strip()}")
    assert not hits, "sys.path edited (install srope or set PYTHONPATH=src instead):\n" + "\n".join(hits)
