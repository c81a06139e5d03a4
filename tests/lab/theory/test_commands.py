"""The `srope theory` command contract: run(out_dir, seed) writes <name>.json + <name>.png."""

from __future__ import annotations

import inspect
import json

import pytest

from srope.lab.theory import COMMANDS, leakage


def test_registry():
    assert set(COMMANDS) == {"rff", "temperature", "leakage"}
    for name, fn in COMMANDS.items():
        params = inspect.signature(fn).parameters
        assert list(params) == ["out_dir", "seed"] and params["seed"].default == 0, name


def test_leakage_run_writes_json_and_png(tmp_path):
    out = tmp_path / "theory"
    data = leakage.run(out, seed=3)
    assert json.loads((out / "leakage.json").read_text()) == data
    png = (out / "leakage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 300_000
    assert data["seed"] == 3 and all(data["checks"].values()), data["checks"]
    assert data["findings"] and data["seconds"] < 120


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_bad_arguments_raise(name, tmp_path):
    with pytest.raises(TypeError, match="seed"):
        COMMANDS[name](tmp_path, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        COMMANDS[name](tmp_path, seed=1.5)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="folder"):
        COMMANDS[name](blocker, seed=0)
