"""The scripts under experiments/, by path, and a loader that imports one as a module."""

import importlib.util
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture
def experiment():
    """``experiment(name)``: the module experiments/NAME.py (its path: ``module.__file__``)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
