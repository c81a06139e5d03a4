"""The tables of result folders (srope.lab.report.folders), one row per folder, on hand-made
results: every row names its provenance, MAD rows sit beside Table 1, and ``srope report
--by-folder`` puts them on the task's page."""

from __future__ import annotations

import json

import pytest

from srope.lab import provenance
from srope.lab.report.folders import folder_tables
from tests.lab.report.conftest import FIRST_COMMIT, copying_runs, run, synth

COPY_CFG = {"steps": 10, "batch_size": 4, "min_len": 2, "max_len": 64, "eval_lengths": "2-512:30", "model": {"hidden_size": 8}}


def _folder(tmp_path, name: str, data: dict):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def _summarised(data: dict) -> dict:
    """What the runner writes once a sweep is done (the report reads ``summary``)."""
    from srope.lab.tasks.summary import summarize

    return {**data, "summary": summarize(data["runs"])}


def test_rows_name_their_commit_and_mark_stale_and_unknown(tmp_path):
    head = provenance._git("rev-parse", "HEAD")
    if head is None or provenance.last_change() is None:
        pytest.skip("not a git checkout")
    settings = [{"name": "copy", "params": {}, "max_len": 420}]
    current = _folder(tmp_path, "a", _summarised(synth("copying", "nope", copying_runs((0.1,)), COPY_CFG, settings, head)))
    stale = _folder(tmp_path, "b", _summarised(synth("copying", "rope", copying_runs((0.0,)), COPY_CFG, settings, FIRST_COMMIT)))
    unknown = _folder(tmp_path, "c", _summarised(synth("copying", "selective_rope", copying_runs((0.5,)), COPY_CFG, settings, None)))
    text = folder_tables([current, stale, unknown])
    assert f"| gla/nope [{head[:7]}] |" in text
    assert f"| gla/rope [{FIRST_COMMIT[:7]} stale†] |" in text and "† stale" in text
    assert "| gla/selective_rope [unknown‡] |" in text and "‡ provenance unknown" in text


def test_mad_rows_sit_beside_table_1(tmp_path):
    from srope.lab.tasks import mad

    runs = [run("in-context-recall/baseline", 0, 0.9)]
    settings = [{"name": "in-context-recall/baseline", "params": {}, "max_len": 128}]
    data = _summarised(synth("mad", "rope", runs, {"model": {"hidden_size": 8}}, settings, None))
    data["aggregate"] = mad.aggregate(data["summary"])
    text = folder_tables([_folder(tmp_path, "mad", data)])
    assert "| paper: GLA RoPE | 85.2 | 7.5 | 92.6 | 61.4 | 91.9 | 96.4 | 72.5 |" in text
    assert "gla/rope [unknown‡] (1/66 settings)" in text


def test_a_state_tracking_row_shows_its_last_evaluation_beside_the_best(tmp_path):
    """select=best: the reported accuracies are the best evaluation's; the row also shows the
    last evaluation's, so a run that learned and lost it is seen at once (mean over seeds)."""
    cfg = {"group": "S2", "train_len": 128, "eval_len": 512, "model": {"hidden_size": 8}}
    settings = [{"name": "S2", "params": {}, "max_len": 129}]
    runs = [{**run("S2", seed, 0.5, {"seq_acc_at_train_len": 1.0}), "final": {"score": 0.0, "seq_acc_at_train_len": last}}
            for seed, last in ((0, 0.2), (1, 0.4))]
    folder = _folder(tmp_path, "st", _summarised(synth("state_tracking", "selective_rope", runs, cfg, settings, None)))
    row = next(line for line in folder_tables([folder]).splitlines() if line.startswith("| gla/selective_rope"))
    assert "| 100.0 | 50.0 |" in row and "| 30.0 / 0.0 |" in row


@pytest.mark.parametrize("text", ["a log line\n", "[1, 2]", "{\"runs\": []}"])
def test_a_file_that_is_not_a_synth_result_is_an_error_naming_it(tmp_path, text):
    stray = tmp_path / "run.log"
    stray.write_text(text)
    with pytest.raises(ValueError, match="not a srope synth result") as error:
        folder_tables([stray])
    assert str(stray) in str(error.value)


def test_by_folder_puts_the_tables_on_the_task_pages(fixture_dir, tmp_path):
    from srope.lab.report.write import write_report

    write_report([fixture_dir], tmp_path / "plain", plots=False)
    write_report([fixture_dir], tmp_path / "folders", plots=False, by_folder=True)
    for name in ("copying", "mqar", "state_tracking", "mad"):
        plain, folders = ((tmp_path / out / f"{name}.md").read_text() for out in ("plain", "folders"))
        assert folders.startswith(plain) and "\n## Result folders, one row each\n\n### " in folders[len(plain):]
    assert "| paper: GLA RoPE | 85.2 |" in (tmp_path / "folders" / "mad.md").read_text()
    assert (tmp_path / "plain" / "lm.md").read_text() == (tmp_path / "folders" / "lm.md").read_text()


def test_srope_synth_report_points_at_srope_report(tmp_path, capsys):
    from srope.lab.cli import main

    assert main(["synth", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "srope report DIR..." in err, err
