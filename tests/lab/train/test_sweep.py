"""``srope sweep-lr``: one run per learning rate, selection by held-out perplexity, a diverged
learning rate recorded (not a crash), resume of a partial sweep, bad arguments."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import srope.lab.train.sweep as sweep_module
from srope.lab.cli import build_parser
from srope.lab.train.sweep import PAPER_LRS, choose, parse_lrs, run_dir_name, sweep_lr
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import train

SMALL = dict(preset="gla-tiny", seq_len=32, global_batch_size=4, max_steps=4, checkpoint_every=2, eval_rows=8, tensorboard=False, model={"hidden_size": 32, "num_heads": 2})
DIVERGES = 1e12  # AdamW steps of ~1e12 per weight: the loss is non-finite by the second step


def _final(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    return build_parser()


def test_sweep_command_selects_the_lowest_val_ppl_and_records_divergence(store, tmp_path, capsys):
    out = tmp_path / "sweep"
    sets = [f"--set={k}={json.dumps(v)}" for k, v in SMALL.items() if k not in ("preset", "max_steps")]
    args = _parser().parse_args(["sweep-lr", "--preset", "gla-tiny", "--data", store, "--max-steps", "4", "--out", str(out), "--lrs", f"3e-4,{DIVERGES:g},3e-3,1e-2", *sets])
    assert args.func(args) == 0
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["lrs"] == [3e-4, DIVERGES, 3e-3, 1e-2] and summary["base_config"]["max_steps"] == 4
    runs = {r["lr"]: r for r in summary["runs"]}
    assert runs[DIVERGES]["status"] == "diverged" and "non-finite" in runs[DIVERGES]["error"]
    assert (out / run_dir_name(DIVERGES) / "diverged.json").is_file() and not (out / run_dir_name(DIVERGES) / "model").exists()
    # The finished runs' numbers are their own metrics.jsonl's final evaluation; the lowest val ppl wins.
    finished = {lr: _final(out / run_dir_name(lr)) for lr in (3e-4, 3e-3, 1e-2)}
    for lr, metrics in finished.items():
        assert runs[lr]["status"] == "ok" and runs[lr]["val_ppl"] == metrics["val_ppl"] and runs[lr]["source"] == "trained"
        assert json.loads((out / run_dir_name(lr) / "train_config.json").read_text())["lr"] == lr
    best = min(finished, key=lambda lr: finished[lr]["val_ppl"])
    assert len({m["val_ppl"] for m in finished.values()}) == 3, "the learning rates must give different results"
    assert summary["chosen"]["lr"] == best and summary["chosen"]["val_ppl"] == finished[best]["val_ppl"]
    assert summary["chosen_at_grid_edge"] == (best == 3e-4)  # 1e12 is the grid's top, and it diverged
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "<- chosen" in printed and "diverged" in printed


def test_resume_skips_finished_and_diverged_runs_and_continues_a_partial_one(store, tmp_path, monkeypatch):
    config = TrainConfig(data=store, **SMALL)
    out = tmp_path / "sweep"
    sweep_lr(config, out, [1e-3, DIVERGES], plot=False)
    # A run killed after step 3 (its last checkpoint is step 2).
    train(TrainConfig(data=store, lr=2e-3, **SMALL), out / run_dir_name(2e-3), stop_after=3)
    assert not (out / run_dir_name(2e-3) / "model").exists()
    calls = []
    real_train = sweep_module.train

    def recording_train(cfg, folder, *, resume=False, stop_after=None):
        calls.append((Path(folder).name, resume))
        return real_train(cfg, folder, resume=resume, stop_after=stop_after)

    monkeypatch.setattr(sweep_module, "train", recording_train)
    summary = sweep_lr(config, out, [1e-3, 2e-3, DIVERGES, 4e-3])
    assert calls == [(run_dir_name(2e-3), True), (run_dir_name(4e-3), False)]
    assert [(r["lr"], r["status"], r["source"]) for r in summary["runs"]] == [
        (1e-3, "ok", "earlier"), (2e-3, "ok", "resumed"), (DIVERGES, "diverged", "earlier"), (4e-3, "ok", "trained"),
    ]  # fmt: skip
    # The resumed run equals an uninterrupted one (the trainer's resume is exact).
    whole = train(TrainConfig(data=store, lr=2e-3, **SMALL), tmp_path / "whole")
    assert summary["runs"][1]["val_ppl"] == whole["val_ppl"]
    assert summary["chosen"]["lr"] == min((r for r in summary["runs"] if r["status"] == "ok"), key=lambda r: r["val_ppl"])["lr"]
    # A third call trains nothing.
    calls.clear()
    again = sweep_lr(config, out, [1e-3, 2e-3, DIVERGES, 4e-3], plot=False)
    assert calls == [] and {r["source"] for r in again["runs"]} == {"earlier"}
    assert [(r["lr"], r["status"], r["val_ppl"]) for r in again["runs"]] == [(r["lr"], r["status"], r["val_ppl"]) for r in summary["runs"]]
    assert again["chosen"]["lr"] == summary["chosen"]["lr"]


def test_a_run_folder_with_other_settings_is_not_reused(store, tmp_path):
    out = tmp_path / "sweep"
    sweep_lr(TrainConfig(data=store, **SMALL), out, [1e-3], plot=False)
    with pytest.raises(ValueError, match=r"other settings \(seq_len: 32 there, 16 now\)"):
        sweep_lr(TrainConfig(data=store, **(SMALL | {"seq_len": 16})), out, [1e-3], plot=False)


def test_a_run_folder_that_recorded_a_relative_data_path_is_reused(store, tmp_path, monkeypatch):
    """An older srope recorded --data as given: read from the current directory, the recorded
    path names the same store, so the run is the sweep's (with a warning); from another
    directory it names another and the folder is not reused."""
    config = TrainConfig(data=store, lr=1e-3, **SMALL).resolved()
    folder = tmp_path / run_dir_name(1e-3)
    folder.mkdir()
    (folder / "train_config.json").write_text(json.dumps({**config.to_dict(), "data": Path(store).name}))
    monkeypatch.chdir(Path(store).parent)
    with pytest.warns(UserWarning, match=f"recorded a relative data path {Path(store).name!r}"):
        sweep_module._check_same_settings(folder, config)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="other settings"):
        sweep_module._check_same_settings(folder, config)


def test_choose_and_bad_arguments(store, tmp_path):
    runs = [{"lr": 1e-3, "status": "ok", "val_loss": 2.0}, {"lr": 2e-3, "status": "ok", "val_loss": 1.5}, {"lr": 4e-3, "status": "diverged", "val_loss": None}]
    assert choose(runs)["lr"] == 2e-3 and choose(runs[2:]) is None
    assert choose([{"lr": 2e-3, "status": "ok", "val_loss": 1.0}, {"lr": 1e-3, "status": "ok", "val_loss": 1.0}])["lr"] == 1e-3
    assert parse_lrs("5e-4, 1e-3,1.6e-2") == [5e-4, 1e-3, 1.6e-2] and list(PAPER_LRS) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    with pytest.raises(ValueError, match="comma-separated numbers"):
        parse_lrs("1e-3,fast")
    for bad in ([], [0.0], [-1e-3], [float("nan")], [1e-3, 0.001]):
        with pytest.raises(ValueError):
            sweep_lr(TrainConfig(data=store, **SMALL), tmp_path / "bad", bad)
    with pytest.raises(TypeError, match="TrainConfig"):
        sweep_lr({"preset": "gla-tiny"}, tmp_path / "bad", [1e-3])
    with pytest.raises(ValueError, match="unknown preset"):
        sweep_lr(TrainConfig(preset="gpt5"), tmp_path / "bad", [1e-3])
    args = _parser().parse_args(["sweep-lr", "--preset", "gla-tiny", "--max-steps", "2", "--out", str(tmp_path / "bad"), "--set", "lr=0.1"])
    with pytest.raises(ValueError, match="--lrs"):
        args.func(args)
    assert not (tmp_path / "bad").exists()


def test_a_run_cut_off_before_its_first_checkpoint_starts_again(store, tmp_path):
    """A run folder with the run's settings but no checkpoint yet (killed early): the sweep
    trains that learning rate from step 0 rather than stopping at the used folder."""
    config = TrainConfig(data=store, lr=1e-3, **SMALL)
    folder = tmp_path / "sweep" / run_dir_name(1e-3)
    folder.mkdir(parents=True)
    (folder / "train_config.json").write_text(json.dumps(config.resolved().to_dict()))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 99.0}) + "\n")
    summary = sweep_lr(config, tmp_path / "sweep", [1e-3], plot=False)
    assert summary["runs"][0]["status"] == "ok" and [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
