"""Stopping and resuming a sweep, and running its runs concurrently: both give the results
and weights of one uninterrupted sequential sweep, bitwise."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from srope.lab import trainer as lab_trainer  # every run's checkpoints are read there
from srope.lab.cli import srope_model_factory
from srope.lab.tasks import run_synthetic
from srope.lab.tasks.cli import add_synth_arguments, run_synth_command
from srope.lab.tasks.runner import EVALUATIONS_FILE
from srope.lab.train.checkpoint import load_checkpoint
from tests.lab.tasks.standin import gru_factory
from tests.lab.tasks.test_runner import SMOKE

ROOT = Path(__file__).resolve().parents[3]
REAL = {"model.hidden_size": 16, "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
TIMING = ("seconds", "eval_seconds")


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_synth_arguments(parser)
    return parser.parse_args(argv)


def numbers(results: dict) -> dict:
    """Everything a sweep computed (records with their weights' sha256, summary, aggregate), without wall times."""
    runs = [{k: v for k, v in run.items() if k not in TIMING} for run in results["runs"]]
    return {"runs": runs, "summary": results.get("summary"), "aggregate": results.get("aggregate"), "complete": results["complete"]}


def checkpoints(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("runs/*/checkpoints/step_*") if not p.name.endswith(".tmp"))


# Each family through stops at every kind of place (inside an epoch, at its end, between
# runs), every other one resumed from the checkpoint before the last (as after a kill).
CASES = {
    "mqar": ({**SMOKE["mqar"], **REAL}, srope_model_factory),  # the real model once
    "mad": ({**SMOKE["mad"], "model.hidden_size": 8}, gru_factory),  # compression leaves the head without gradients
    "copying": ({**SMOKE["copying"], "steps": 15, "epochs": 5, "patience": 2, "checkpoint_every": 3, "model.hidden_size": 8}, gru_factory),
    "state_tracking": ({**SMOKE["state_tracking"], "model.hidden_size": 8, "model.dropout": 0.3}, gru_factory),  # torch RNG every step
}


@pytest.mark.parametrize("task", list(CASES))
def test_stopped_and_resumed_equals_uninterrupted(task, tmp_path):
    overrides, factory = CASES[task]
    overrides = {"threads": 1, "checkpoint_every": 2, "save_weights": "true", "loss_every": 2, **overrides}  # curve points across stops
    whole = run_synthetic(task, factory, out=tmp_path / "whole", overrides=overrides, cache_dir=None, progress=False, plot=False)
    assert all(len(run["loss_curve"]) == run["steps"] // 2 >= 1 for run in whole["runs"])
    out = tmp_path / "cut"
    calls, kept, partial = 0, {}, []
    while True:
        results = run_synthetic(task, factory, out=out, overrides=overrides, cache_dir=None, progress=False, plot=False, resume=calls > 0,
                                stop_after_steps=2 + calls % 2)
        calls += 1
        saved = json.loads((out / "results.json").read_text())
        assert saved["runs"] == results["runs"] and saved["complete"] == results["complete"]
        for run in saved["runs"]:  # a finished run is kept as it was, not trained again
            kept.setdefault((run["setting"], run["lr"], run["weight_decay"], run["seed"]), run)
            assert kept[(run["setting"], run["lr"], run["weight_decay"], run["seed"])] == run
        if results["complete"]:
            break
        assert "--resume" in results["stopped"] and len(checkpoints(out)) >= 1
        partial += [json.loads(path.read_text()) for path in out.glob(f"runs/*/{EVALUATIONS_FILE}")]
        older = checkpoints(out)[:-1]
        if calls % 2 == 0 and older and older[-1].parent == checkpoints(out)[-1].parent:
            for newer in checkpoints(out)[len(older):]:
                os.rename(newer, newer.with_name(newer.name + ".tmp"))  # as if killed while writing it
    assert calls >= 3 and numbers(results) == numbers(whole)
    assert not (out / "runs").exists() or not checkpoints(out)  # a finished run's checkpoints are gone
    assert not list(out.glob(f"runs/*/{EVALUATIONS_FILE}"))  # and so are its evaluations in progress
    # a run cut off kept its evaluations so far, which the finished run's record begins with
    finals = {(r["setting"], r["lr"], r["weight_decay"], r["seed"]): r for r in whole["runs"]}
    assert partial
    for evaluations in partial:
        run = evaluations["run"]
        history = finals[(run["setting"], run["lr"], run["weight_decay"], run["seed"])]["history"]
        assert evaluations["history"] == history[: len(evaluations["history"])] and evaluations["steps"] == evaluations["history"][-1]["step"]
    assert sorted(p.relative_to(out) for p in out.glob("runs/*/model.safetensors")) == sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").glob("runs/*/model.safetensors"))
    for weights in (tmp_path / "whole").glob("runs/*/model.safetensors"):
        ours, theirs = load_file(out / weights.relative_to(tmp_path / "whole")), load_file(weights)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    calls_made = results["provenance"]
    assert len(calls_made) == calls and [c["resumed"] for c in calls_made] == [False] + [True] * (calls - 1)
    for call in calls_made:
        assert call["seeds"] == list(whole["config"]["seeds"]) and call["device"] == "cpu" and call["wall_s"] > 0 and "commit" in call and call["command"]
    assert results["seconds"] == pytest.approx(sum(c["wall_s"] for c in calls_made), abs=1e-2)


def _wait_for_checkpoint(process: subprocess.Popen, out: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not checkpoints(out):
        if process.poll() is not None:
            raise AssertionError(f"the run ended before its first checkpoint: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("no checkpoint in time")
        time.sleep(0.05)


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_sigterm_then_resume_through_the_cli(tmp_path, monkeypatch):
    """`srope synth` (the real model) stops on SIGTERM after its step with a checkpoint and
    exit code 143; `--resume` then ends where an uninterrupted run ends, also in another
    folder holding only the latest checkpoint (a run carried to the next GPU session)."""
    sets = {**SMOKE["state_tracking"], "batch_size": 16, "epochs": 4, "stop_at": "null", "threads": 1, "checkpoint_every": 1000}
    argv = ["state_tracking", "--mixer", "gla", "--position", "selective_rope", "--no-progress", "--cache-dir", "none"]
    argv += [f"--set={k}={v}" for k, v in {**sets, **{k: v for k, v in REAL.items() if k.startswith("model.")}}.items()]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "srope", "synth", *argv, "--set=checkpoint_every=1", "--out", str(out)]  # soon a checkpoint to wait for
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    _wait_for_checkpoint(process, out)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "srope synth: stopped by SIGTERM" in err and "continue with --resume" in err, err
    stopped = json.loads((out / "results.json").read_text())
    assert not stopped["complete"] and checkpoints(out) and "synth state_tracking" in stopped["provenance"][0]["command"]
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(out, moved, ignore=lambda folder, names: [n for n in names if n.endswith(".tmp")])
    for older in checkpoints(moved)[:-1]:
        shutil.rmtree(older)
    shutil.rmtree(out)
    out, latest, loaded = moved, checkpoints(moved)[-1], []
    monkeypatch.setattr(lab_trainer, "load_checkpoint", lambda path, *a, **k: loaded.append(path) or load_checkpoint(path, *a, **k))

    assert run_synth_command(_parse([*argv, "--out", str(out), "--resume"]), srope_model_factory) == 0  # checkpoint_every may change
    assert loaded == [latest]  # continued from there, not begun again
    whole = run_synthetic("state_tracking", srope_model_factory, out=tmp_path / "whole", overrides=_overrides(argv), cache_dir=None, progress=False, plot=False)
    resumed = json.loads((out / "results.json").read_text())
    assert numbers(resumed) == numbers(whole) and resumed["complete"]
    assert [call["resumed"] for call in resumed["provenance"]] == [False, True]
    assert (out / "results.png").exists() and not (out / "runs").exists()


def _overrides(argv):
    from srope.lab.tasks.cli import synth_overrides

    return synth_overrides(_parse(argv))


def test_concurrent_equals_sequential_and_stops_on_sigterm(tmp_path, monkeypatch):
    """--jobs 2 gives the sequential sweep's results in grid order; SIGTERM to its parent
    makes the workers checkpoint after their step, and the sweep resumed concurrently
    again still equals the sequential one."""
    monkeypatch.delenv("SROPE_AUTOTUNE", raising=False)  # the mode a call sets stays in this process's environment
    grid = {**SMOKE["mqar"], "epochs": 24, "model.hidden_size": 8, "threads": 1, "checkpoint_every": 1000}  # 4 runs
    run = lambda out, **kw: run_synthetic("mqar", gru_factory, out=out, overrides=grid, cache_dir=None, progress=False, plot=False, **kw)
    sequential = run(tmp_path / "sequential")
    both = run(tmp_path / "both", jobs=2, autotune="first")  # the workers take the mode too
    assert numbers(both) == numbers(sequential) and both["provenance"][0]["jobs"] == 2 and both["threads"] == 1
    assert sequential["provenance"][0]["autotune"] == "full" and both["provenance"][0]["autotune"] == "first"
    assert [(r["setting"], r["lr"]) for r in both["runs"]] == [(r["setting"], r["lr"]) for r in sequential["runs"]]  # grid order

    out = tmp_path / "stopped"
    script = textwrap.dedent(f"""
        import sys
        from srope.lab.tasks import run_synthetic
        from tests.lab.tasks.standin import gru_factory
        try:
            run_synthetic("mqar", gru_factory, out={str(out)!r}, overrides={ {**grid, "checkpoint_every": 1}!r}, cache_dir=None, progress=False,
                          plot=False, jobs=2)
        except KeyboardInterrupt as stop:
            print(stop, file=sys.stderr)
            sys.exit(3)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    _wait_for_checkpoint(process, out)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 3 and "stopped by SIGTERM" in err, err
    assert not json.loads((out / "results.json").read_text())["complete"] and checkpoints(out)
    assert numbers(run(out, jobs=2, resume=True)) == numbers(sequential)


def test_a_sweep_records_its_recipe_and_resumes_only_under_that_version(tmp_path):
    o = {**SMOKE["state_tracking"], "seeds": "0", "epochs": 1, "model.hidden_size": 8}
    run = lambda recipe, out="run", **kw: run_synthetic("state_tracking", gru_factory, out=tmp_path / out, overrides=o, cache_dir=None, progress=False,
                                                        plot=False, recipe=recipe, **kw)
    first = {"name": "st-gla-s2", "arm": "srope", "version": 1}
    assert run(first, stop_after_steps=1)["recipe"] == first
    assert json.loads((tmp_path / "run" / "results.json").read_text())["recipe"] == first
    with pytest.raises(ValueError, match=r"^--resume: settings differ .*: recipe st-gla-s2:srope version 1 -> st-gla-s2:srope version 2; resume with"):
        run({**first, "version": 2}, resume=True)
    with pytest.raises(ValueError, match="recipe st-gla-s2:srope version 1 -> st-gla-s2:nope version 1"):
        run({**first, "arm": "nope"}, resume=True)
    assert run(None, resume=True)["recipe"] == first  # the same settings given as options
    assert run(None, out="plain")["recipe"] is None


def test_refusals(tmp_path):
    o = {**SMOKE["state_tracking"], "seeds": "0", "epochs": 1, "model.hidden_size": 8}
    run = lambda out, **kw: run_synthetic("state_tracking", gru_factory, out=out, overrides=kw.pop("overrides", o), cache_dir=None, progress=False, plot=False, **kw)
    with pytest.raises(FileNotFoundError, match="--resume: .* holds no results.json"):
        run(tmp_path / "nothing", resume=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="start without --resume"):
        run(tmp_path / "empty", resume=True)
    run(tmp_path / "done")
    with pytest.raises(FileExistsError, match="pass --resume to continue it, or choose another --out"):
        run(tmp_path / "done")
    with pytest.raises(ValueError, match=r"^--resume: settings differ .*: lrs \[0\.0005\] -> \[0\.002\]; model .*; resume with the same settings") as error:
        run(tmp_path / "done", resume=True, overrides={**o, "lrs": "2e-3", "model.hidden_size": 4})
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="preset 'release' -> 'paper'"):
        run_synthetic("state_tracking", gru_factory, out=tmp_path / "done", overrides=o, preset="paper", cache_dir=None, resume=True)
    assert run(tmp_path / "done", resume=True, overrides={**o, "checkpoint_every": 7})["complete"]  # changes no number
    for bad in ({"jobs": 0}, {"jobs": True}, {"stop_after_steps": 0}, {"stop_after_steps": 1.5}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a positive integer"):
            run(tmp_path / "bad", **bad)
    with pytest.raises(TypeError, match="model factory must be picklable"):
        run_synthetic("state_tracking", lambda r: gru_factory(r), out=tmp_path / "bad", overrides=o, cache_dir=None, jobs=2)
    with pytest.raises(ValueError, match="checkpoint_every must be a positive"):
        run(tmp_path / "bad", overrides={**o, "checkpoint_every": 0})
    with pytest.raises(ValueError, match="logits must be"):  # a failed start leaves no folder behind
        run_synthetic("state_tracking", lambda r: torch.nn.Embedding(r.vocab_size, 2), out=tmp_path / "bad", overrides=o, cache_dir=None, progress=False)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):
        _parse(["mqar", "--jobs", "0"])
    args = _parse(["mqar", "--jobs", "3", "--stop-after-steps", "5", "--resume"])
    assert (args.jobs, args.stop_after_steps, args.resume) == (3, 5, True)


def test_a_second_synth_into_a_folder_in_use_is_refused_and_changes_nothing(tmp_path, capsys):
    """`srope synth` holds its --out as `srope train` does (srope.lab.train.run_folder): a second
    start while the first runs, with or without --resume, into a sweep in progress or a folder
    just made, is one line naming the folder and the holder's pid, and changes nothing there."""
    from srope.lab.cli import main
    from srope.lab.train.run_folder import RunFolder

    sets = {**SMOKE["state_tracking"], **REAL, "seeds": "0"}
    argv = lambda out: ["synth", "state_tracking", "--no-progress", "--cache-dir", "none", "--device", "cpu", "--out", str(out),
                        *(f"--set={k}={v}" for k, v in sets.items())]  # fmt: skip
    files = lambda out: {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    out, new = tmp_path / "sweep", tmp_path / "new"
    assert main([*argv(out), "--stop-after-steps", "1"]) == 0  # a sweep in progress: results.json and a checkpoint
    with RunFolder(out), RunFolder(new):  # the first runs, still running, in this process
        for folder in (out, new):
            before = files(folder)
            for resume in ([], ["--resume"]):
                capsys.readouterr()
                assert main([*argv(folder), *resume]) == 2
                err = capsys.readouterr().err.strip().splitlines()
                assert len(err) == 1 and str(folder) in err[0] and f"pid {os.getpid()}" in err[0], err
                assert files(folder) == before
    assert main([*argv(out), "--resume"]) == 0 and json.loads((out / "results.json").read_text())["complete"]
    assert not (out / ".lock").exists()


def test_a_run_started_before_a_setting_existed_resumes_with_what_it_ran(tmp_path):
    """A results.json without a setting added since ran as that setting's value then: eager for
    cuda_graph and the full head for head_at_targets, whose defaults are now "auto". Resuming
    with that value goes on; with another (today's default included) it is refused. A value
    recorded under an older name (head_at_targets: false) is that value."""
    overrides = {**SMOKE["state_tracking"], "model.hidden_size": 8, "seeds": "0"}
    run_synthetic("state_tracking", gru_factory, out=tmp_path, overrides=overrides, cache_dir=None, progress=False, plot=False, stop_after_steps=1)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["cuda_graph"] == saved["config"]["head_at_targets"] == "auto"  # today's defaults are recorded
    del saved["config"]["cuda_graph"], saved["config"]["head_at_targets"]
    (tmp_path / "results.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="cuda_graph 'off' -> 'auto'"):
        run_synthetic("state_tracking", gru_factory, out=tmp_path, overrides={**overrides, "head_at_targets": "off"}, cache_dir=None, progress=False,
                      plot=False, resume=True)  # fmt: skip
    with pytest.raises(ValueError, match="head_at_targets 'off' -> 'auto'"):
        run_synthetic("state_tracking", gru_factory, out=tmp_path, overrides={**overrides, "cuda_graph": "off"}, cache_dir=None, progress=False,
                      plot=False, resume=True)  # fmt: skip
    saved["config"]["head_at_targets"] = False
    (tmp_path / "results.json").write_text(json.dumps(saved))
    resumed = run_synthetic("state_tracking", gru_factory, out=tmp_path, overrides={**overrides, "cuda_graph": "off", "head_at_targets": "off"},
                            cache_dir=None, progress=False, plot=False, resume=True)  # fmt: skip
    assert resumed["complete"]


def test_a_checkpoint_that_fails_verification_falls_back_to_the_previous_one(tmp_path):
    overrides = {**SMOKE["state_tracking"], "model.hidden_size": 8, "seeds": "0", "epochs": 4, "threads": 1, "checkpoint_every": 1}
    run = lambda out, **kw: run_synthetic("state_tracking", gru_factory, out=out, overrides=overrides, cache_dir=None, progress=False, plot=False, **kw)
    whole = run(tmp_path / "whole")
    run(tmp_path / "cut", stop_after_steps=3)
    *_, previous, newest = checkpoints(tmp_path / "cut")
    weights = bytearray((newest / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (newest / "model.safetensors").write_bytes(bytes(weights))
    with pytest.warns(UserWarning, match=re.escape(f"skipping checkpoint {newest}: ") + ".*" + re.escape(f"resuming from {previous}")):
        resumed = run(tmp_path / "cut", resume=True)
    assert numbers(resumed) == numbers(whole)
