"""What a user installs: the licence, the typed marker, one version, the dependency floors and
extras, and the quick start's choice of the CPU torch build."""

from __future__ import annotations

import ast
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def _pin(name: str) -> tuple[int, ...]:
    """The version requirements-cpu.txt (what CI installs) pins ``name`` to."""
    text = (ROOT / "requirements-cpu.txt").read_text(encoding="utf-8")
    return tuple(int(part) for part in re.search(rf"^{name}==([\d.]+)", text, re.M).group(1).split("."))


def _floor(requirements: list[str], name: str) -> tuple[int, ...]:
    spec = next(r for r in requirements if re.match(rf"{name}\b", r))
    return tuple(int(part) for part in re.search(r">=([\d.]+)", spec).group(1).split("."))


def test_the_licence_is_the_apache_2_0_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    for section in ("1. Definitions.", "9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS"):
        assert section in text


def test_py_typed_ships_and_the_version_has_one_source():
    import srope

    assert (ROOT / "src" / "srope" / "py.typed").is_file()
    assert "py.typed" in SETUPTOOLS["package-data"]["srope"]
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert SETUPTOOLS["dynamic"]["version"] == {"attr": "srope.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", srope.__version__)


def test_project_urls_are_absolute():
    assert {"Homepage", "Paper"} <= set(PROJECT["urls"])
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())


def test_floors_are_versions_that_ran():
    """torch: 2.11 on the GPU machine (every report), 2.13 in CI; Triton 3.6.0 in both."""
    assert (2, 11) <= _floor(PROJECT["dependencies"], "torch") <= _pin("torch")
    cuda = PROJECT["optional-dependencies"]["cuda"]
    assert _floor(cuda, "triton") == _pin("triton")[:2]


def test_plotting_and_logging_are_extras_and_lm_is_their_union():
    extras = PROJECT["optional-dependencies"]
    assert not _names(PROJECT["dependencies"]) & {"matplotlib", "tensorboard"}
    assert _names(extras["plot"]) == {"matplotlib"} and _names(extras["tensorboard"]) == {"tensorboard"}
    assert "datasets" in _names(extras["data"]) and "lm-eval" in _names(extras["eval"])
    assert extras["lm"] == ["srope[data,eval,plot,tensorboard]"]
    assert extras["all"] == ["srope[cuda,lm]"]


def test_cuda_depends_on_fla_core_which_holds_every_fla_module_srope_imports():
    """fla-core holds fla.ops, fla.modules and fla.utils; flash-linear-attention adds fla.layers
    and fla.models, which only benchmarks/bench_train.py uses (the [bench] extra)."""
    assert _names(PROJECT["optional-dependencies"]["cuda"]) == {"fla-core", "triton"}
    assert "flash-linear-attention" in _names(PROJECT["optional-dependencies"]["bench"])
    imported = set()
    for path in (ROOT / "src" / "srope").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            imported |= {".".join(name.split(".")[:2]) for name in names if name.split(".")[0] == "fla"}
    assert imported and imported <= {"fla.ops", "fla.modules", "fla.utils"}, imported


@pytest.mark.skipif(platform.system() != "Linux" or shutil.which("make") is None, reason="the CPU index is for Linux; needs make")
def test_make_takes_the_cpu_torch_on_linux_without_a_cuda_gpu(tmp_path):
    def install_lines(env_path: str, *args: str) -> list[str]:
        env = {**os.environ, "PATH": env_path}
        for name in ("TORCH_INDEX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # `make test TORCH_INDEX=` passes it down through MAKEFLAGS
            env.pop(name, None)
        result = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", str(tmp_path / "venv" / ".srope-installed"), *args],
                                cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        return [line for line in result.stdout.splitlines() if "requirements-cpu.txt" in line]

    no_gpu = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    cpu = "--extra-index-url https://download.pytorch.org/whl/cpu"
    pinned, extras = install_lines(no_gpu)
    assert "-r requirements-cpu.txt" in pinned and pinned.endswith(cpu)
    assert "-c requirements-cpu.txt" in extras and cpu not in extras  # only the pins look at PyTorch's index
    assert cpu not in install_lines(no_gpu, "TORCH_INDEX=")[0]  # what .ci/run passes
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
    (fake / "nvidia-smi").chmod(0o755)
    assert cpu not in install_lines(f"{fake}{os.pathsep}{no_gpu}")[0]  # a CUDA GPU keeps PyPI's CUDA build


def test_the_recipes_ship_as_package_data():
    """``srope synth --recipe`` reads src/srope/lab/recipes/*.toml: without a package-data pattern
    that takes them, an installed srope would have no recipes."""
    from fnmatch import fnmatch

    from srope.lab import recipes

    package = ROOT / "src" / "srope"
    files = sorted((package / "lab" / "recipes").glob("*.toml"))
    assert files and sorted(f.stem for f in files) == recipes.names()
    for file in files:
        assert any(fnmatch(file.relative_to(package).as_posix(), pattern) for pattern in SETUPTOOLS["package-data"]["srope"]), file
