"""The plots ``srope synth`` writes into its result folder (srope.lab.tasks.sweep_plots)."""

from __future__ import annotations

from srope.lab.tasks import sweep_plots
from srope.lab.tasks.summary import summarize
from tests.lab.report.conftest import copying_runs, synth


def test_the_results_plot_is_written(tmp_path):
    cfg = {"steps": 10, "batch_size": 4, "min_len": 2, "max_len": 64, "eval_lengths": "2-512:30", "model": {"hidden_size": 8}}
    data = synth("copying", "nope", copying_runs((0.1, 0.2)), cfg, [{"name": "copy", "params": {}, "max_len": 420}], None)
    png = sweep_plots.plot_results({**data, "summary": summarize(data["runs"])}, tmp_path / "copy.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_loss_plot_gives_each_of_many_runs_its_own_colour(tmp_path, monkeypatch):
    """Past ten runs the default colour cycle repeats, and the legend tells runs apart by colour."""
    import matplotlib.axes

    colours, plot = [], matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):
        colours.append(kwargs.get("color"))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    runs = [{"setting": "S2", "lr": 5e-4, "weight_decay": 0.0, "seed": seed, "loss_curve": [[50, 0.7], [100, 0.5 - seed / 100]]}
            for seed in range(12)]
    path = sweep_plots.plot_loss_curves({"task": "state_tracking", "label": "S2", "runs": runs}, tmp_path / "loss.png")
    assert path.is_file() and len(colours) == 12 and len(set(colours)) == 12
