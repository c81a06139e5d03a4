"""The report's plots: every row of a panel told apart by its colour, every panel by its title."""

import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from srope.lab.report.plots import COLORS, _colors, _title  # noqa: E402


def test_a_second_variant_of_an_encoding_gets_a_colour_of_its_own():
    rows = [SimpleNamespace(paper_row=kind, label=label) for kind, label in (
        ("NoPE", "copying-nope"), ("RoPE", "copying-rope"), ("Selective RoPE", "copying-srope"),
        ("Selective RoPE", "copying-srope-gate-bias"), ("Selective RoPE", "Selective RoPE (no SiLU)"), (None, "other"))]
    colors = _colors(rows)
    assert colors[:3] == [COLORS["NoPE"], COLORS["RoPE"], COLORS["Selective RoPE"]]
    from matplotlib.colors import to_hex

    assert len({to_hex(c) for c in colors}) == len(rows)


def test_a_title_cut_to_its_lines_says_so():
    """The overrides that tell two panels apart come last: a cut title must not look whole."""
    text = "srope synth mqar --preset zoology, gla 2 layers [configs=['64x4'], model.use_short_conv=True]"
    assert _title(text, 40, lines=4) == "\n".join(textwrap.wrap(text, 40))
    cut = _title(text, 40, lines=2).split("\n")
    assert len(cut) == 2 and cut[-1].endswith("…") and all(len(line) <= 40 for line in cut)


def test_mqar_draws_every_runs_test_accuracy_after_each_epoch(tmp_path):
    """A protocol without the paper's setting (64x4) still gets a panel: each run's evaluations
    against its steps, as recorded, with chance (one value among vocab/2) drawn beside them."""
    from srope.lab.report.rows import _rows
    from srope.lab.report.collect import collect
    from srope.lab.tasks.mqar_report import report_plot as _mqar

    from .conftest import _write, head, run, synth

    cfg = {"vocab": 128, "train_examples": 3_600, "epochs": 3, "batch_size": 32, "lrs": [1e-3], "model": {"num_hidden_layers": 2}}
    settings = [{"name": "T64-kv4-d64", "params": {"seq_len": 64, "kv_pairs": 4}, "max_len": 64}]
    curves = {"nope": [0.01, 0.2, 0.7], "selective_rope": [0.02, 0.1, 0.5]}
    for position, scores in curves.items():
        record = {**run("T64-kv4-d64", 0, scores[-1]), "history": [{"epoch": i + 1, "step": 100 * (i + 1), "score": s} for i, s in enumerate(scores)]}
        _write(tmp_path / f"mqar-{position}/results.json", synth("mqar", position, [record], cfg, settings, head()))
    rows = _rows(collect([tmp_path]).runs)
    assert sorted(r.runs[0].histories["T64-kv4-d64"][1][-1] for r in rows) == [0.5, 0.7]
    fig = _mqar(rows)
    (ax,) = [a for a in fig.axes if a.get_visible() and a.get_xlabel() == "training step"]
    drawn = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert drawn["gla/nope T64-kv4-d64 (1 seed)"] == curves["nope"] and drawn["gla/selective_rope T64-kv4-d64 (1 seed)"] == curves["selective_rope"]
    assert list(drawn["chance"]) == [2 / 128, 2 / 128]


def test_a_curve_from_before_the_last_evaluation_says_at_which_step():
    """select=best: the legend names the step a curve was measured at when it is not the last."""
    from srope.lab.report.plots import _earlier

    def row(*reported):
        return SimpleNamespace(runs=[SimpleNamespace(reported=[r]) for r in reported])

    assert _earlier(row({"step": 7_816, "steps": 9_587})) == "; at step 7,816 of 9,587"
    assert _earlier(row({"step": 9_587, "steps": 9_587}, {"step": None, "steps": 10})) == ""
    assert _earlier(row({"step": 5, "steps": 9}, {"step": 9, "steps": 9}, {"step": 2, "steps": 9})) == "; 2 of 3 at an evaluation before their last"


def test_a_curve_over_seeds_draws_each_seed_beside_the_mean():
    """Two seeds, one learning and one not: the mean alone (0.5) is a curve no run has."""
    from matplotlib.figure import Figure

    from srope.lab.report.plots import _curves

    x = [1, 2, 3]
    runs = [SimpleNamespace(curves={"acc": (x, y)}, reported=[]) for y in ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])]
    row = SimpleNamespace(runs=runs, label="srope", paper_row="Selective RoPE", train_len=2)
    ax = Figure().subplots()
    _curves(ax, [row], "acc")
    drawn = [(line.get_label(), list(line.get_ydata()), line.get_linewidth()) for line in ax.get_lines() if list(line.get_xdata()) == x]
    assert drawn[0] == ("srope (mean of 2 seeds, thin: each)", [0.5, 0.5, 0.5], 1.4)
    assert sorted(d[1] for d in drawn[1:]) == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert all(d[2] < 1.4 for d in drawn[1:])


def test_a_panel_without_curves_of_its_name_draws_no_empty_legend():
    """matplotlib warns "No artists with labels found to put in legend" for an empty one (seven
    times per run of test_build.py)."""
    import warnings

    from matplotlib.figure import Figure

    from srope.lab.report.plots import _curves

    row = SimpleNamespace(runs=[SimpleNamespace(curves={"other": ([1, 2], [1.0, 0.0])}, reported=[])], label="srope",
                          paper_row="Selective RoPE", train_len=2)
    ax = Figure().subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _curves(ax, [row], "acc")
    assert ax.get_legend() is None
