"""matplotlib and tensorboard are optional (extras ``[plot]`` and ``[tensorboard]``, both in
``[lm]``): imported only where they are used, and a missing one is a one-line error that names
the extra, before a command spends minutes training."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import pytest

from srope._lazy import MissingDependency
from srope.lab import plotting

SRC = Path(__file__).resolve().parents[2] / "src" / "srope"


def _imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node, node.module))
    return found


def test_only_the_plotting_module_imports_matplotlib():
    importers = {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
                 for _, name in _imports(ast.parse(path.read_text(encoding="utf-8"))) if name.split(".")[0] == "matplotlib"}
    assert importers == {"lab/plotting.py"}


def test_tensorboard_is_imported_once_and_its_absence_is_handled():
    """The trainer's SummaryWriter, inside ``try: ... except ImportError`` (metrics.jsonl only)."""
    sites = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.Try)
                   and any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers)
                   for statement in node.body for inner in ast.walk(statement)}
        for node, name in _imports(tree):
            if "tensorboard" in name.split("."):
                sites.append((path.relative_to(SRC).as_posix(), id(node) in guarded))
    assert sites == [("lab/train/metrics_log.py", True)]


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as if not installed (``None`` in sys.modules makes its import fail)."""
    for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_a_missing_matplotlib_names_the_extra(no_matplotlib):
    with pytest.raises(MissingDependency, match=r"srope demo's plots .*pip install 'srope\[plot\]'"):
        plotting.require("srope demo's plots")
    with pytest.raises(MissingDependency, match=r"pip install 'srope\[plot\]'"):
        plotting.pyplot("a plot")
    with pytest.raises(MissingDependency, match=r"pip install 'srope\[plot\]'"):
        plotting.figure("a plot", figsize=(2, 2))


def test_the_demo_without_matplotlib_refuses_before_training(no_matplotlib, tmp_path, capsys, monkeypatch):
    from srope.lab.cli import main

    monkeypatch.setattr("srope.lab.demo.run._train_all", lambda *a, **k: pytest.fail("trained before checking for matplotlib"))
    began = time.perf_counter()
    assert main(["demo", "--out", str(tmp_path / "demo"), "--workers", "1"]) == 2
    assert time.perf_counter() - began < 30
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("srope demo: error: ") and "pip install 'srope[plot]'" in lines[0], lines
    assert not (tmp_path / "demo").exists()


def test_with_matplotlib_a_figure_draws():
    pytest.importorskip("matplotlib")
    fig = plotting.figure("a test plot", figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [1, 0])
    assert fig.canvas.__class__.__name__ == "FigureCanvasAgg"
    assert plotting.pyplot("a test plot").get_backend().lower() == "agg"
