"""The ``cpu`` presets: one small, named setting per task family for a laptop CPU.

Their full runs (about a minute each) are left to the README; here they must resolve, stay
small, print with ``--dry-run``, and one of them runs end to end with its sizes cut down.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from srope.lab.cli import srope_model_factory
from srope.lab.tasks import mad, mqar
from srope.lab.tasks.cli import add_synth_arguments, run_synth_command
from srope.lab.tasks.common import parse_lengths
from srope.lab.tasks.registry import tasks
from srope.lab.tasks.runner import get_task, preset_names, presets_line, resolve_preset

# Tokens through the model in training: each preset stays far below its paper preset.
TOKEN_BUDGET = 2_000_000


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_synth_arguments(parser)
    return parser.parse_args(argv)


def training_tokens(task: str, cfg) -> int:
    """Tokens the preset trains on (every setting, optimiser point and seed)."""
    runs = len(cfg.lrs) * len(cfg.weight_decays) * len(cfg.seeds)
    if task == "state_tracking":
        per_run = [cfg.epochs * cfg.train_size * (cfg.train_len + 1)]
    elif task == "copying":
        per_run = [cfg.steps * cfg.batch_size * cfg.context_len]
    elif task == "mqar":
        per_run = [cfg.epochs * cfg.train_examples * mqar.parse_config(c)[0] for c in cfg.configs for _ in cfg.d_models]
    else:
        per_run = [cfg.epochs * min(s.params["num_train_examples"], cfg.max_train_examples or s.params["num_train_examples"]) * s.max_len
                   for s in mad.settings(cfg)]
    return runs * sum(per_run)


@pytest.mark.parametrize("task", list(tasks))
def test_cpu_preset_resolves_and_is_small(task):
    cfg = resolve_preset(task, "cpu")
    settings = get_task(task).settings(cfg)
    assert len(settings) <= 2 and len(cfg.lrs) == len(cfg.weight_decays) == len(cfg.seeds) == 1
    assert cfg.threads == 1 and cfg.mixer == "gla" and cfg.position_type == "selective_rope"
    assert set(cfg.position) == {"rope", "selective_rope"}
    for setting in settings:
        assert setting.max_len <= 128
        assert {**cfg.model, **setting.model}["hidden_size"] <= 64
    assert training_tokens(task, cfg) <= TOKEN_BUDGET
    assert "cpu" in preset_names(task) and preset_names(task)[0] == tasks[task].default_preset
    line = presets_line(task)
    assert line.startswith(f"presets for {task}: {tasks[task].default_preset} (default)") and "cpu" in line
    if task == "copying":
        assert max(parse_lengths(cfg.eval_lengths)) == 2 * cfg.max_len  # evaluated up to twice the training lengths
    if task == "state_tracking":
        assert cfg.group == "S2" and cfg.eval_len == 2 * cfg.train_len


@pytest.mark.parametrize("task", list(tasks))
def test_cpu_preset_dry_run(task, capsys):
    assert run_synth_command(_parse([task, "--preset", "cpu", "--dry-run"]), srope_model_factory) == 0
    printed = capsys.readouterr().out
    first, rest = printed.split("\n", 1)
    assert first.startswith(f"presets for {task}: ") and "cpu" in first  # the presets, then the resolved one
    config = json.loads(rest[: rest.rindex("}") + 1])
    assert config["threads"] == 1 and config["position_type"] == "selective_rope"
    n_settings = len(get_task(task).settings(resolve_preset(task, "cpu")))
    assert f"{n_settings} settings x 1 runs each:" in printed


def test_other_presets_keep_torch_threads_and_threads_is_checked():
    for task in tasks:
        for name in preset_names(task):
            assert resolve_preset(task, name).threads == (1 if name == "cpu" else 0)
    with pytest.raises(ValueError, match="threads"):
        resolve_preset("mqar", "cpu", {"threads": "-1"})
    with pytest.raises(ValueError, match="zoology, paper, cpu"):
        resolve_preset("mqar", "laptop")


def test_cpu_preset_runs_end_to_end_with_its_sizes_cut(tmp_path):
    """The state-tracking cpu preset through the CLI handler, a few steps long: it runs on
    one thread and gives torch its thread count back."""
    cut = {"train_size": 256, "eval_size": 64, "epochs": 1, "batch_size": 64}
    argv = ["state_tracking", "--preset", "cpu", "--position", "nope", "--out", str(tmp_path / "run"), "--no-progress", "--cache-dir", "none"]
    argv += [f"--set={k}={v}" for k, v in cut.items()]
    before = torch.get_num_threads()
    assert run_synth_command(_parse(argv), srope_model_factory) == 0
    assert torch.get_num_threads() == before
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["complete"] and saved["preset"] == "cpu" and saved["label"] == "gla/nope" and saved["threads"] == 1
    assert saved["config"]["train_len"] == 16 and saved["config"]["eval_len"] == 32
    run = saved["runs"][0]
    assert run["steps"] == 4 and 0.0 <= run["score"] <= 1.0 and "seq_acc_at_train_len" in run["metrics"]
    assert (tmp_path / "run" / "results.png").exists()
