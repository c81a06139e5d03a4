"""One run per folder: a second `srope train` into a folder in use is refused (and deletes
nothing), a used folder is refused without --resume, and --resume on a finished run changes
nothing."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from srope.lab.cli import main
from srope.lab.train import train_config, trainer
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import train
from tests.lab.train.conftest import make_text
from tests.lab.train.test_checkpoint import RUN, _argv, _child, _wait_for_steps
from tests.lab.train.test_trainer import losses


def _held_child(store: str, out: Path, tmp_path: Path, max_steps: int = 4):
    """`srope train` into ``out`` in another process, held at its data loading until ``tmp_path/go`` exists."""
    started, go = tmp_path / "started", tmp_path / "go"
    patch = (
        "import pathlib, time\n"
        "import srope.lab.train.trainer as trainer\n"
        "original = trainer.load_corpus\n"
        "def load_corpus(*args, **kwargs):\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        f"    while not pathlib.Path({str(go)!r}).exists():\n"
        "        time.sleep(0.05)\n"
        "    return original(*args, **kwargs)\n"
        "trainer.load_corpus = load_corpus"
    )
    process = _child(_argv(store, out, max_steps), patch)
    while not started.exists():
        assert process.poll() is None, process.communicate()
    return process, go


def _refused_for(out: Path, holder: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and f"pid {holder}" in lines[0], err


def test_a_failed_start_beside_a_running_run_deletes_nothing(store, tmp_path, monkeypatch, capsys):
    """The second run fails at start-up after the first has begun training into the folder:
    the first run's folder survives and the first run finishes."""
    out = tmp_path / "run"
    first, go = _held_child(store, out, tmp_path)

    def fail_after_the_first_trains(*args, **kwargs):
        go.touch()
        _wait_for_steps(out, 1, first)
        raise ValueError("this start fails")

    monkeypatch.setattr(trainer, "load_corpus", fail_after_the_first_trains)
    capsys.readouterr()
    assert main(_argv(store, out, 4)) == 2
    go.touch()
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err
    assert [step for step, _ in losses(out)] == [1, 2, 3, 4]
    _refused_for(out, first.pid, capsys.readouterr().err)


def test_two_runs_into_one_folder_the_second_is_refused(store, tmp_path, capsys):
    out = tmp_path / "run"
    first, go = _held_child(store, out, tmp_path)
    capsys.readouterr()
    try:
        assert main(_argv(store, out, 4)) == 2
    finally:
        go.touch()
    _refused_for(out, first.pid, capsys.readouterr().err)
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err
    assert [step for step, _ in losses(out)] == [1, 2, 3, 4]  # one run's metrics, not two interleaved
    assert json.loads((out / "run.json").read_text())["complete"]


def test_a_used_folder_is_refused_without_resume(store, tmp_path):
    config = TrainConfig(data=store, max_steps=2, **{**RUN, "lr": 3e-3})
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"not empty .*notes\.txt.*choose another --out"):
        train(config, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # untouched, no lock file left behind
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(config, out, resume=True)  # not a run of srope train
    empty = tmp_path / "empty"
    empty.mkdir()
    train(config, empty)  # an empty folder is fine


def test_resume_restarts_a_run_that_stopped_before_its_first_checkpoint(store, tmp_path):
    config = TrainConfig(data=store, max_steps=2, **{**RUN, "lr": 3e-3})
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_config.json").write_text(json.dumps(config.resolved().to_dict()))
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 99.0}) + "\n")
    with pytest.raises(FileExistsError, match=r"not empty .*--resume"):
        train(config, out)
    train(config, out, resume=True)
    train(config, tmp_path / "whole")
    assert losses(out) == losses(tmp_path / "whole")


def test_resume_on_a_finished_run_says_so_and_changes_nothing(store, tmp_path, capsys):
    out = tmp_path / "run"
    argv = _argv(store, out, 2)
    assert main(argv) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr()
    *said, final = (printed.err + printed.out).strip().splitlines()
    assert len(said) == 1 and "finished" in said[0] and str(out) in said[0], printed
    assert json.loads(final) == json.loads(before[out / "run.json"])["metrics"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_run_killed_after_its_last_checkpoint_finishes_on_resume(store, tmp_path):
    config = TrainConfig(data=store, max_steps=2, **{**RUN, "lr": 3e-3})
    final = train(config, tmp_path)
    (tmp_path / "run.json").unlink()  # killed after its last checkpoint, before run.json
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])  # and before its last metrics line
    resumed = train(config, tmp_path, resume=True)
    assert resumed["val_loss"] == final["val_loss"] and resumed["step"] == 2
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["complete"] and run["metrics"]["val_loss"] == final["val_loss"]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]


def test_a_run_that_recorded_relative_paths_resumes_with_a_warning(tokenizer_dir, tmp_path, monkeypatch):
    """Runs from before paths were stored absolute recorded --data and --tokenizer as given, and
    resuming them was refused as "settings differ". A recorded relative path is resolved against
    the current directory (as that code read it): the same files resume, with a one-line
    warning; from another directory they name other files and are still refused."""
    rng = random.Random(5)
    (tmp_path / "corpus").mkdir()
    for i in range(40):
        (tmp_path / "corpus" / f"doc{i:02d}.txt").write_text(make_text(rng, rng.randint(40, 300)), encoding="utf-8")
    tokenizer = os.path.relpath(tokenizer_dir, tmp_path)
    config = lambda data, tokenizer: TrainConfig(data=data, tokenizer=tokenizer, cache=str(tmp_path / "cache"), val_fraction=0.2, max_steps=2,
                                                 **{**RUN, "lr": 3e-3})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as before:
        before.setattr(train_config, "_absolute", lambda spec: spec)  # what srope train recorded then
        train(config("corpus", tokenizer), tmp_path / "run", stop_after=1)
    recorded = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert (recorded["data"], recorded["tokenizer"]) == ("corpus", tokenizer)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="settings differ"):
        train(config(str(tmp_path / "corpus"), str(tokenizer_dir)), tmp_path / "run", resume=True)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning) as warned:
        train(config("corpus", tokenizer), tmp_path / "run", resume=True)
    said = [str(w.message) for w in warned if "relative" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith(f"the run recorded a relative data path 'corpus' and a relative tokenizer path {tokenizer!r}"), said
    assert f"they name {tmp_path / 'corpus'} and {tokenizer_dir}, what this run reads" in said[0], said
    train(config("corpus", tokenizer), tmp_path / "whole")
    assert losses(tmp_path / "run") == losses(tmp_path / "whole")
