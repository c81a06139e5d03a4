"""Extending the lab from one file: a position encoding and a synthetic task defined here, each
registered with one call, are then known to the ``srope`` command (its choices and checks) and
train through the path the command runs, with no other file of srope changed
(docs/extending.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pytest
import torch

from srope.lab.cli import build_parser, main
from srope.lab.tasks.common import IGNORE, ArrayStream, Prepared, Setting, TaskConfig, check_train_config, rng_for
from srope.lab.tasks.registry import register_task, tasks
from srope.modules import PositionEncoding
from srope.registry import positions, register_position
from tests.lab.train.conftest import sp_model, texts, tokenizer_dir  # noqa: F401  (the fixtures of a tiny tokenizer)

# --------------------------------------------------------------------------- a position encoding


class ScaledQueries(PositionEncoding):
    """A toy encoding: no rotation, the queries scaled by a fixed ``scale`` (an option)."""

    def __init__(self, head_dim: int, scale: float = 0.5):
        super().__init__()
        self.head_dim, self.scale = head_dim, float(scale)

    def forward(self, q, k, x=None, **batch):
        q, k, state = super().forward(q, k, x, **batch)  # the checks of every call, and no state
        return q * self.scale, k, state


# --------------------------------------------------------------------------- a synthetic task


@dataclasses.dataclass
class RecallPreset(TaskConfig):
    """Say the token before: the target at position t is the input at t - 1."""

    vocab: int = 8
    length: int = 12
    train_size: int = 128
    eval_size: int = 32
    data_seed: int = 0
    batch_size: int = 32
    lrs: tuple[float, ...] = (3e-3,)
    model: dict = dataclasses.field(default_factory=lambda: {"hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2})


class PreviousToken:
    """The task, as a task module would be: its presets and its three functions."""

    PRESETS = {"tiny": RecallPreset(), "longer": RecallPreset(length=24)}

    @staticmethod
    def check(cfg: RecallPreset) -> None:
        check_train_config(cfg)
        if cfg.vocab < 2 or cfg.length < 2:
            raise ValueError("vocab and length must be >= 2")

    @staticmethod
    def settings(cfg: RecallPreset) -> list[Setting]:
        return [Setting(name=f"L{cfg.length}", group="previous", vocab_size=cfg.vocab, max_len=cfg.length, params={"length": cfg.length})]

    @staticmethod
    def prepare(cfg: RecallPreset, setting: Setting, cache_dir) -> Prepared:
        def split(name: str, size: int) -> tuple[np.ndarray, np.ndarray]:
            inputs = rng_for(cfg.data_seed, "previous_token", name).integers(0, cfg.vocab, (size, cfg.length))
            targets = np.full_like(inputs, IGNORE)
            targets[:, 1:] = inputs[:, :-1]
            return inputs, targets

        test_x, test_y = split("test", cfg.eval_size)

        def evaluate(predict) -> dict:
            y = torch.as_tensor(test_y)
            scored = y != IGNORE
            return {"score": float((predict(torch.as_tensor(test_x))[scored] == y[scored]).float().mean())}

        return Prepared(train=ArrayStream(*split("train", cfg.train_size), cfg.batch_size), evaluate=evaluate)


class PreviousTokenReport:
    """Its page in ``srope report`` and the rule of its verdicts, as a task's report module would be."""

    RULE = "Reproduced when every encoding recalls the previous token (score >= 0.9)."

    @staticmethod
    def report_page(rows):
        from srope.lab.report.page import Page

        scores = ", ".join(f"{r.label}: {r.mean('score'):.2f}" for r in rows)
        return Page("previous_token", "Previous token", f"# Previous token\n\n{scores}\n", [], rows, source="ours")


@pytest.fixture
def registered():
    """The one call each, undone afterwards (the registries are the process's)."""
    register_position("scaled", label="Scaled queries", build=ScaledQueries)
    register_task("previous_token", module=PreviousToken, presets=("tiny", "longer"), report=PreviousTokenReport)
    yield
    positions.unregister("scaled")
    tasks.unregister("previous_token")


def _choices(command: str, option: str):
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in commands.choices[command]._actions if option in a.option_strings).choices


def test_the_command_knows_a_registered_encoding_and_task(registered, capsys):
    for command in ("train", "sweep-lr", "synth"):
        assert "scaled" in _choices(command, "--position")
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    assert "previous_token" in capsys.readouterr().out
    assert main(["synth", "previous_token", "--preset", "longest"]) == 2  # a misspelt preset names the registered ones
    assert "unknown preset 'longest' for previous_token; choose one of tiny, longer" in capsys.readouterr().err
    assert main(["synth", "previous_token", "--position", "scaled", "--dry-run"]) == 0
    assert "presets for previous_token: tiny (default), longer" in capsys.readouterr().out


def test_a_registered_encoding_trains_through_srope_train(registered, tokenizer_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"the king {i} and the queen {i * 7 % 11} speak" for i in range(300)), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--preset", "gla-tiny", "--position", "scaled", "--set", "position.scale=0.25", "--data", "corpus.txt",
            "--tokenizer", str(tokenizer_dir), "--cache", "cache", "--max-steps", "3", "--set", "seq_len=32", "--set", "global_batch_size=4",
            "--set", "tensorboard=false", "--set", 'model={"hidden_size": 32, "num_heads": 2}']  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "model  gla-tiny, gla + scaled: " in printed.out + printed.err
    run = json.loads((tmp_path / "out" / "train" / "gla-tiny-scaled" / "run.json").read_text())
    assert run["complete"] and run["metrics"]["step"] == 3 and run["config"]["position"] == {"type": "scaled", "scale": 0.25}


def test_a_registered_task_trains_through_srope_synth_with_a_registered_encoding(registered, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["synth", "previous_token", "--position", "scaled", "--set", "epochs=2", "--out", str(out), "--device", "cpu", "--no-progress",
            "--cache-dir", "none"]  # fmt: skip
    assert main(argv) == 0
    assert "| gla/scaled" in capsys.readouterr().out  # the report's table of any registered task
    saved = json.loads((out / "results.json").read_text())
    assert saved["complete"] and saved["task"] == "previous_token" and saved["preset"] == "tiny" and saved["label"] == "gla/scaled"
    (record,) = saved["runs"]
    assert record["steps"] == 2 * 4 and 0.0 <= record["score"] <= 1.0


def test_a_registered_task_brings_its_page_to_srope_report(registered, tmp_path):
    from srope.lab.report.write import write_report

    argv = ["synth", "previous_token", "--set", "epochs=1", "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress", "--cache-dir", "none"]
    assert main(argv) == 0
    written = write_report([tmp_path / "run"], tmp_path / "report", plots=False)
    assert "# Previous token\n\ngla/selective_rope: " in (tmp_path / "report" / "previous_token.md").read_text()
    index = written["index"].read_text()
    assert "| [Previous token](previous_token.md) | ours | no results |" in index
    assert f"\n- previous_token: {PreviousTokenReport.RULE}\n" in index  # its rule among the paper's
    assert index.index("(mad.md)") < index.index("(lm.md)") < index.index("(previous_token.md)")  # the paper's order, then the rest


def test_a_registered_task_without_a_page_shows_its_scores_in_srope_report(registered, tmp_path):
    from srope.lab.report.write import write_report

    register_task("previous_token", module=PreviousToken, presets=("tiny", "longer"), replace=True)
    argv = ["synth", "previous_token", "--set", "epochs=1", "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress", "--cache-dir", "none"]
    assert main(argv) == 0
    write_report([tmp_path / "run"], tmp_path / "report", plots=False, by_folder=True)
    page = (tmp_path / "report" / "previous_token.md").read_text()
    assert page.startswith("# previous_token\n\n## Runs without a counterpart in the paper\n") and "| gla/selective_rope | " in page
    assert "### previous_token\n\n| model | setting | score | lr | seeds |" in page  # --by-folder: each setting's score


def test_registering_a_name_twice_is_refused_unless_replaced(registered):
    with pytest.raises(ValueError, match="position encoding 'scaled' is already registered"):
        register_position("scaled", label="again", build=ScaledQueries)
    entry = register_position("scaled", label="again", build=ScaledQueries, replace=True)
    assert positions["scaled"] is entry and entry.label == "again"


def test_a_task_module_must_define_the_registered_presets(registered):
    register_task("previous_token", module=PreviousToken, presets=("tiny", "shorter"), replace=True)
    with pytest.raises(ValueError, match=r"registers the presets \('tiny', 'shorter'\), but its module defines \('tiny', 'longer'\)"):
        tasks["previous_token"].load()
