"""The report's plots: every row of a panel is told apart by its colour."""

from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from srope.lab.report.plots import COLORS, _colors  # noqa: E402


def test_a_second_variant_of_an_encoding_gets_a_colour_of_its_own():
    rows = [SimpleNamespace(paper_row=kind, label=label) for kind, label in (
        ("NoPE", "copying-nope"), ("RoPE", "copying-rope"), ("Selective RoPE", "copying-srope"),
        ("Selective RoPE", "copying-srope-gate-bias"), ("Selective RoPE", "Selective RoPE (no SiLU)"), (None, "other"))]
    colors = _colors(rows)
    assert colors[:3] == [COLORS["NoPE"], COLORS["RoPE"], COLORS["Selective RoPE"]]
    from matplotlib.colors import to_hex

    assert len({to_hex(c) for c in colors}) == len(rows)
