"""The import graph of ``src/srope``: no cycles, the library never imports the lab, and
``import srope`` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# The library: what a model needs. Everything else under srope is the lab around it, in
# srope.lab (training, tasks, evaluation, report, theory, demo, the command line).
LIBRARY = ("srope.ops", "srope.modules", "srope.layers", "srope.models", "srope.backend", "srope.registry", "srope._lazy")


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "srope").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the srope modules it imports anywhere in its text (function-level too);
    ``from package import module`` counts as importing that module only."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                targets.update(subs)
                if len(subs) < len(node.names):
                    targets.add(node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_library_never_imports_the_lab():
    graph = _graph()
    library = {m for m in graph if m == "srope" or m.startswith(LIBRARY)}
    assert {"srope.ops.rotary", "srope.models.modeling"} <= library and graph["srope.models.modeling"]
    wrong = {m: sorted(t for t in graph[m] if t not in library) for m in sorted(library)}
    assert not {m: t for m, t in wrong.items() if t}, f"library modules importing the lab: {wrong}"


def test_everything_outside_the_library_is_in_the_lab():
    outside = {m for m in _graph() if m not in ("srope", "srope.__main__") and not m.startswith(LIBRARY)}
    assert "srope.lab.train.trainer" in outside
    assert not {m for m in outside if not m.startswith("srope.lab")}, sorted(outside)


def test_import_srope_is_light():
    code = "import srope, sys; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_benchmarks_never_import_the_tests():
    root = SRC.parent
    wrong = {}
    for path in sorted((root / "benchmarks").glob("*.py")) + sorted((root / "experiments").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name == "tests" or name.startswith("tests.") for name in names):
                wrong.setdefault(path.name, []).extend(names)
    assert not wrong, wrong


def test_the_layers_import_without_the_compiler_or_transformers():
    """A model of one's own with srope's layers pays neither torch.compile's machinery (about a
    second) nor transformers until it asks for them; the one compiler hint srope sets at import
    is the mark torch's own decorator sets."""
    code = ("import srope.layers, srope.ops, sys; "
            "print(sorted(m for m in ('torch._dynamo', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    import torch

    from srope.ops.mixers._common import host_constant

    ours, torchs = host_constant(lambda: 0), torch.compiler.assume_constant_result(lambda: 0)
    assert vars(ours) == vars(torchs) == {"_dynamo_marked_constant": True}
