"""experiments/compare_repeats.py: equal repeats, differing ones, unfinished ones, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "compare_repeats.py"



def results(*runs):
    return {"runs": [{"setting": "S2", "lr": 5e-4, "weight_decay": 1e-6, "seed": seed, "steps": steps, "weights_sha256": sha,
                      "history": [{"train_loss": loss} for loss in losses]} for seed, steps, sha, losses in runs]}


def test_equal_and_differing_repeats(experiment):
    compare = experiment("compare_repeats").compare
    lines, equal = compare([results((0, 300, "a" * 64, [0.65, 0.60])), results((0, 300, "a" * 64, [0.65, 0.60]))])
    assert equal and lines[-1] == "all repeats bitwise equal (1 run(s) compared)" and "  weights equal; largest training-loss difference 0" in lines
    lines, equal = compare([results((0, 300, "a" * 64, [0.65, 0.60])), results((0, 300, "b" * 64, [0.65, 0.25]))])
    assert not equal and lines[-1] == "repeats differ (1 run(s) compared)" and "  weights differ; largest training-loss difference 0.35" in lines


def test_a_run_in_one_repeat_only_is_listed_not_compared(experiment):
    compare = experiment("compare_repeats").compare
    lines, equal = compare([results((0, 300, "a" * 64, [0.6]), (1, 300, "c" * 64, [0.6])), results((0, 300, "a" * 64, [0.6]))])
    assert equal and "  repeat 2: not in this repeat" in lines and "  in one repeat only: nothing to compare" in lines
    assert lines[-1] == "all repeats bitwise equal (1 run(s) compared)"
    with pytest.raises(ValueError, match="no run is in two repeats"):
        compare([results((0, 300, "a" * 64, [0.6])), results((1, 300, "a" * 64, [0.6]))])


def test_cli_reads_files_and_refuses_bad_input(tmp_path, experiment):
    for i in (1, 2):
        (tmp_path / f"{i}.json").write_text(json.dumps(results((0, 300, "a" * 64, [0.6]))))
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "1.json"), str(tmp_path / "2.json")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("all repeats bitwise equal (1 run(s) compared)")
    (tmp_path / "bad.json").write_text("{}")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "1.json"), str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert done.returncode == 2 and "is not a srope synth results.json" in done.stderr
    with pytest.raises(ValueError, match="at least two"):
        experiment("compare_repeats").compare([results((0, 300, "a" * 64, [0.6]))])
