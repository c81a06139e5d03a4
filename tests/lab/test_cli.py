"""The ``srope`` command as a new user meets it: help at once without heavy imports, and every
user error as one line on stderr with exit code 2 (``--debug``: the traceback)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from srope.lab.cli import build_parser, main

COMMANDS = ["demo", "models", "data", "data prepare", "train", "sweep-lr", "eval", "lm-eval", "report", "synth", "theory", "bench", "info"]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_import_srope_loads_neither_torch_nor_transformers():
    result = _fresh("import sys, srope; print(json.dumps(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)))".replace("json.dumps", "__import__('json').dumps"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    # the op and the modules import torch, still not transformers
    result = _fresh("import sys; from srope import SelectiveRoPE, selective_rope; assert 'torch' in sys.modules; print('transformers' in sys.modules)")
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize("command", [""] + COMMANDS)
def test_help_answers_without_torch(command):
    argv = [*command.split(), "--help"]
    code = (
        "import sys, time; began = time.perf_counter()\n"
        "from srope.lab.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "print('SECONDS', time.perf_counter() - began, 'HEAVY', heavy)"
    )
    began = time.perf_counter()
    result = _fresh(code)
    wall = time.perf_counter() - began
    assert result.returncode == 0, result.stderr
    assert "usage: srope" in result.stdout
    assert result.stdout.strip().endswith("HEAVY []"), result.stdout[-300:]
    print(f"srope {command} --help: {wall:.2f} s in a fresh process (CI benchmark, not asserted)")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--data", "no/such/file.txt"], "no such file or folder"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--data", "data/nope.txt"], "'data/nope.txt': no such file or folder"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--data", "owner/corpus"], "did you mean hf:owner/corpus?"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "lr=fast"], "--set lr: expected a number, got 'fast'"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "learning_rate=1"], "unknown setting 'learning_rate'"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "model.hidden_size=big"], "model.hidden_size: expected an integer"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "model.hidden=8"], "unknown model setting 'model.hidden'"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "position.gate=bogus"], "gate must be one of"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "position.projection_gain=big"], "position.projection_gain: expected a number"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--resume"], "--resume: no checkpoint"),
        (["train", "--preset", "gla-tiny"], "--max-steps is required (or a --config FILE that gives it)"),
        (["synth", "copying", "--set", "bogus=1"], "bogus"),
        (["synth", "parity"], "unknown synthetic task 'parity'"),
        (["synth", "mqar", "--preset", "relese"], "unknown preset 'relese' for mqar; choose one of release, zoology, paper, cpu"),
        (["eval", "--model", "no/such/run"], "no/such/run"),
        (["lm-eval", "--model", "no/such/run", "--tasks", "piqa"], "no/such/run"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith(f"srope {argv[0]}: error: ") and expected in line, line
    assert not (tmp_path / "out").exists()  # a failed start leaves no run folder behind


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--preset", "gla-tiny", "--max-steps", "0"], "expected a positive integer, got 0"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--val-fraction", "2"], "expected a number in (0, 1)"),
        (["trian"], "invalid choice: 'trian'"),
        (["train", "--preset", "gla-tin", "--max-steps", "3"], "argument --preset: invalid choice: 'gla-tin'"),
        (["sweep-lr", "--preset", "gla-tin", "--max-steps", "3"], "argument --preset: invalid choice: 'gla-tin'"),
        (["train", "--preset", "gla-tiny", "--max-steps", "3", "--position", "ropee"], "argument --position: invalid choice: 'ropee'"),
        (["demo", "--seeds", "4-1"], "expected seeds like 0-4"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert expected in _error_line(capsys)


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="expected a number"):
        main(["--debug", "train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "lr=fast"])
    with pytest.raises(ValueError, match="expected a number"):
        main(["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "lr=fast", "--debug"])
    monkeypatch.setenv("SROPE_DEBUG", "1")
    with pytest.raises(ValueError, match="expected a number"):
        main(["train", "--preset", "gla-tiny", "--max-steps", "3", "--set", "lr=fast"])


def test_version_prints_the_package_version_without_torch():
    import srope

    code = (
        "import sys\nfrom srope.lab.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    )
    result = _fresh(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"srope {srope.__version__}", "HEAVY []"]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--preset", "gla-tyni", "--max-steps", "3"],  # issue 75: 6 s to refuse this, torch imported first
        ["sweep-lr", "--preset", "gla-tyni", "--max-steps", "3"],
        ["train", "--preset", "gla-tiny", "--max-steps", "3", "--position", "ropee"],
        ["synth", "mqar", "--preset", "relese"],
        ["synth", "mqr"],
        ["synth", "--recipe", "copying-fig"],
        ["trian"],
    ],
)
def test_a_misspelt_name_is_refused_before_torch_is_imported(argv):
    code = (
        "import sys\nfrom srope.lab.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print('EXIT', code, 'HEAVY', sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    )
    result = _fresh(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("EXIT 2 HEAVY []"), (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only user errors become one line: anything else is srope's fault and must show where."""
    import srope.lab.cli as cli

    def broken(args):
        raise KeyError("internal")

    parser = build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["info"].set_defaults(func=broken)
    with pytest.raises(KeyError, match="internal"):
        main(["info"])


def test_sweep_default_grid_is_the_papers():
    from srope.lab.train.sweep import PAPER_LRS

    args = build_parser().parse_args(["sweep-lr", "--preset", "gla-tiny", "--max-steps", "1"])
    assert args.lrs is None and PAPER_LRS == (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # the help text names this grid


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--position", "rope", "--set", "position=nope"], "--position 'rope' and --set position=nope disagree"),
        (["--position", "rope", "--set", 'position={"type": "selective_rope"}'], "--position 'rope' and --set position="),
        (["--set", "preset=gla-370m"], "--preset 'gla-tiny' and --set preset=gla-370m disagree"),
        (["--set", "max_steps=5"], "--max-steps 3 and --set max_steps=5 disagree"),
        (["--val-fraction", "0.1", "--set", "val_fraction=0.2"], "--val-fraction 0.1 and --set val_fraction=0.2 disagree"),
        (["--data", "a.txt", "--set", "data=b.txt"], "--data 'a.txt' and --set data=b.txt disagree"),
    ],
)
def test_an_option_and_a_set_that_disagree_are_refused(argv, expected, tmp_path, capsys, monkeypatch):
    """--set position=nope overrode --position rope while the run folder was named ...-rope."""
    monkeypatch.chdir(tmp_path)
    for command in ("train", "sweep-lr"):
        assert main([command, "--preset", "gla-tiny", "--max-steps", "3", *argv]) == 2
        line = _error_line(capsys)
        assert line.startswith(f"srope {command}: error: ") and expected in line, line
    assert not (tmp_path / "out").exists()


def test_the_run_folder_is_named_from_the_settings_that_run(tmp_path, monkeypatch):
    """One source for each setting: --set alone names the folder, an option with the same value
    or with options of its encoding agrees."""
    import srope.lab.train.sweep as sweep
    import srope.lab.train.trainer as trainer

    calls = []
    monkeypatch.setattr(trainer, "train", lambda config, out, **kw: calls.append((config, out)) or {})
    monkeypatch.setattr(sweep, "sweep_lr", lambda config, out, lrs: calls.append((config, out)) or {"chosen": None})
    monkeypatch.setattr(sweep, "format_table", lambda summary: "")
    monkeypatch.chdir(tmp_path)
    base = ["--preset", "gla-tiny", "--max-steps", "3"]
    for extra, folder, position in (
        (["--set", "position=nope"], "gla-tiny-nope", {"type": "nope"}),
        (["--set", "preset=gdn-tiny", "--preset", "gdn-tiny"], "gdn-tiny-selective_rope", "selective_rope"),
        (["--position", "rope", "--set", "position=rope"], "gla-tiny-rope", {"type": "rope"}),
        (["--position", "selective_rope", "--set", "position.gate=null"], "gla-tiny-selective_rope", {"type": "selective_rope", "gate": None}),
        ([], "gla-tiny-selective_rope", "selective_rope"),
    ):
        main(["train", *base, *extra])
        main(["sweep-lr", *base, *extra])
        (train_config, train_out), (sweep_config, sweep_out) = calls[-2:]
        assert train_out == f"out/train/{folder}" and sweep_out == f"out/sweep/{folder}", (extra, train_out, sweep_out)
        assert train_config.position == sweep_config.position == position


@pytest.mark.parametrize("argv, expected", [(["--position", "rope", "--set", "position_type=nope"], "--position 'rope' and --set position_type=nope disagree"),
                                            (["--mixer", "gla", "--set", "mixer=attention"], "--mixer 'gla' and --set mixer=attention disagree")])
def test_synth_refuses_an_option_and_a_set_that_disagree(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["synth", "copying", "--preset", "cpu", *argv, "--dry-run"]) == 2
    line = _error_line(capsys)
    assert line.startswith("srope synth: error: ") and expected in line, line


# --config FILE: what each file holds, and the one line its error must say.
UNREADABLE = [("missing.json", None, "--config missing.json: no such file"), ("broken.json", '{"lr": 1e-3,', "--config broken.json: not valid JSON (")]
CONFIG_ERRORS = [
    *UNREADABLE,
    ("broken.toml", "lr = = 1", "--config broken.toml: not valid TOML ("),
    ("list.json", "[1, 2]", "--config list.json: expected a JSON object of settings, got list"),
    ("unknown.json", '{"preset": "gla-tiny", "max_steps": 3, "learning_rate": 1}', "--config unknown.json: unknown setting 'learning_rate' for TrainConfig"),
    ("unknown.toml", 'preset = "gla-tiny"\nmax_steps = 3\n[model]\nhidden = 8', "--config unknown.toml: unknown model setting 'model.hidden'"),
    ("badvalue.json", '{"preset": "gla-tiny", "max_steps": "many"}', "--config badvalue.json: --set max_steps: expected an integer, got 'many'"),
    ("nosteps.json", '{"preset": "gla-tiny"}', "--max-steps is required: --config nosteps.json does not give max_steps"),
    ("synth.json", '{"task": "copying", "preset": "cpu", "lrs": [0.001]}', "--config synth.json: a srope synth config (task 'copying'), not srope train's"),
]
SYNTH_CONFIG_ERRORS = [
    *UNREADABLE,
    ("unknown.toml", "lrs = [0.001]\nbogus = 1", "--config unknown.toml: unknown setting 'bogus' for CopyingPreset"),
    ("preset.json", '{"preset": "relese"}', "--config preset.json: unknown preset 'relese' for copying"),
    ("mqar.json", '{"task": "mqar", "preset": "cpu"}', "--config mqar.json: a config of srope synth mqar, not copying"),
    ("train_config.json", '{"preset": "gla-tiny", "max_steps": 3, "seq_len": 32}', "--config train_config.json: a srope train config (preset 'gla-tiny'), not srope synth's"),
]


@pytest.mark.parametrize("argv, cases", [(["train"], CONFIG_ERRORS), (["sweep-lr"], CONFIG_ERRORS), (["synth", "copying", "--dry-run"], SYNTH_CONFIG_ERRORS)])
def test_a_bad_config_file_is_one_line_naming_it(argv, cases, tmp_path, capsys, monkeypatch):
    """A missing file, one that is not JSON/TOML or not an object, an unknown key, a bad value or
    a file of the other command: one line naming the file (and the key), exit code 2, no run folder."""
    monkeypatch.chdir(tmp_path)
    for name, text, expected in cases:
        if text is not None:
            (tmp_path / name).write_text(text)
        assert main([*argv, "--config", name]) == 2, name
        line = _error_line(capsys)
        assert line.startswith(f"srope {argv[0]}: error: {expected}"), line
    assert not (tmp_path / "out").exists()


def test_train_config_precedence_is_file_then_options_then_set(tmp_path, monkeypatch):
    """Preset defaults < --config FILE < options < --set; JSON and TOML files alike; the settings
    the file does not give keep their defaults."""
    import srope.lab.train.trainer as trainer
    from srope.lab.train.train_config import TrainConfig

    calls = []
    monkeypatch.setattr(trainer, "train", lambda config, out, **kw: calls.append((config, out)) or {})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"preset": "gla-tiny", "max_steps": 5, "lr": 0.001, "seed": 3, "position": "rope", "model": {"hidden_size": 32}}))
    (tmp_path / "run.toml").write_text('preset = "gla-tiny"\nmax_steps = 5\nlr = 0.001\nseed = 3\nposition = "rope"\n[model]\nhidden_size = 32\n')
    for file in ("run.json", "run.toml"):
        assert main(["train", "--config", file, "--out", "a"]) == 0
        assert calls[-1][0] == TrainConfig(preset="gla-tiny", max_steps=5, lr=0.001, seed=3, position="rope", model={"hidden_size": 32})
        assert main(["train", "--config", file, "--max-steps", "7", "--preset", "gdn-tiny", "--set", "lr=0.002", "--set", "model.num_heads=2",
                     "--set", "position.theta=500"]) == 0  # fmt: skip
        config, out = calls[-1]
        assert config == TrainConfig(preset="gdn-tiny", max_steps=7, lr=0.002, seed=3, position={"type": "rope", "theta": 500.0},
                                     model={"hidden_size": 32, "num_heads": 2})  # fmt: skip
        assert out == "out/train/gdn-tiny-rope"  # named from the settings that run
        assert main(["train", "--config", file, "--position", "nope", "--out", "a"]) == 0 and calls[-1][0].position == "nope"


def test_sweep_lr_config_takes_back_a_sweeps_own_record_and_a_runs_settings(tmp_path, monkeypatch):
    """srope sweep-lr --config: the sweep.json a sweep wrote gives the same settings and grid back
    (the same sweep, to resume or to run elsewhere); a run's train_config.json gives its settings,
    its lr left to the grid; options and --set go over the file, as for srope train."""
    import srope.lab.train.sweep as sweep

    calls, real = [], sweep.sweep_lr
    monkeypatch.setattr(sweep, "run_one", lambda config, folder: sweep._record(config.lr, folder, "diverged", error="not run"))
    monkeypatch.setattr(sweep, "sweep_lr", lambda config, out, lrs: calls.append((config, out, lrs)) or real(config, out, lrs, plot=False))
    monkeypatch.chdir(tmp_path)
    argv = ["--preset", "gla-tiny", "--max-steps", "5", "--position", "rope", "--set", "seed=3", "--set", "model.hidden_size=32", "--lrs", "1e-3,2e-3"]
    assert main(["sweep-lr", *argv]) == 1  # no run finished: nothing chosen
    config, out, lrs = calls[-1]
    assert main(["sweep-lr", "--config", f"{out}/sweep.json"]) == 1
    assert (calls[-1][0].resolved(), calls[-1][1:]) == (config.resolved(), (out, lrs))
    (tmp_path / "train_config.json").write_text(json.dumps({**config.resolved().to_dict(), "lr": 4e-3}))
    assert main(["sweep-lr", "--config", "train_config.json", "--lrs", "5e-4", "--max-steps", "7", "--set", "seed=4"]) == 1
    again, again_out, again_lrs = calls[-1]
    assert again.resolved() == dataclasses.replace(config.resolved(), lr=4e-3, max_steps=7, seed=4) and again_lrs == [5e-4]
