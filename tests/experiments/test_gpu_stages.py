"""experiments/gpu.sh's synthetic stages on the CPU: the ``srope synth`` lines a stage starts (each
GPU call is scarce, so a wrong folder name or a lost option costs a session), resolved to the
settings they run. The script runs in a scratch copy with a stand-in for the device setup and a
``python3`` that only records its arguments (``python3 -c`` runs)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srope.lab.tasks.cli import resolve_synth_command

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("OUT", "AUTOTUNE", "BUDGET", "EVAL_MARGIN", "SEEDS", "JOBS", "SET", "TAG", "PART", "ONLY", "NEED_S", "WARM", "KEEP_CHECKPOINTS")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")


def run_stage(tmp_path: Path, stage: str, **env: str) -> list[list[str]]:
    """The argument lists of every python3 the stage started, in order."""
    (tmp_path / "experiments").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "experiments" / "gpu.sh", tmp_path / "experiments")
    (tmp_path / "benchmarks" / "device-env.sh").write_text('R=${OUT:-$PWD/out/gpu}\nmkdir -p "$R"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    stub = bin_dir / "python3"
    # one write per call: runs started at once must not interleave their lines
    stub.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\nline=$(printf "%s\\037" "$@")\nprintf "%s\\n" "$line" >> {calls}\n')
    stub.chmod(0o755)
    inherited = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    full_env = {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALL_S": "600", **env}
    done = subprocess.run(["bash", "experiments/gpu.sh", stage], cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split("\x1f")[:-1] for line in (calls.read_text() if calls.exists() else "").splitlines()]


def settings(args: list[str]):
    """What a recorded ``python3 -m srope synth ARGS`` runs: its settings (a TaskConfig)."""
    assert args[:3] == ["-m", "srope", "synth"], args
    return resolve_synth_command(args[3:])[2]


def value(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_state_tracking_runs_seeds_jobs_and_a_shorter_schedule_in_tagged_folders(tmp_path):
    calls = run_stage(tmp_path, "state-tracking", SEEDS="555,666,777", JOBS="3", TAG="-1k", SET="--set max_steps=1000")
    warm = [c for c in calls if "out/warm" in value(c, "--out")]
    runs = {value(c, "--out"): c for c in calls if "--label" in c}
    assert len(warm) == 2 and all(settings(c).max_steps == 1 for c in warm)  # one warm-up per recipe
    assert sorted(runs) == sorted(f"out/synth/st-{p}-1k-{e}" for p, e in
                                  [("attention-s2", "nope"), ("attention-s2", "rope"), ("attention-s2", "srope"),
                                   ("deltanet-a3", "nope"), ("deltanet-a3", "srope")])
    for out, args in runs.items():
        cfg = settings(args)
        assert cfg.seeds == (555, 666, 777) and cfg.max_steps == 1000 and cfg.eval_size == 16384
        assert value(args, "--jobs") == "3" and value(args, "--label") == out.split("/")[-1]
        assert 0 < cfg.max_seconds <= 600 - 40 - 60  # what is left of the call, less the margins
    attention = settings(runs["out/synth/st-attention-s2-1k-srope"])
    assert (attention.mixer, attention.model["num_hidden_layers"], attention.position_type) == ("attention", 1, "selective_rope")
    assert resolve_synth_command(runs["out/synth/st-deltanet-a3-1k-nope"][3:])[1] == "paper_a3"
    assert (tmp_path / "out" / "gpu" / "state-tracking.tgz").is_file()


def test_a_part_adds_seeds_in_its_own_folder_under_the_arms_label(tmp_path):
    calls = run_stage(tmp_path, "state-tracking", SEEDS="888", PART="-seed888", ONLY="st-deltanet-a3-srope-seed888")
    assert len(calls) == 1 and "--jobs" not in calls[0]  # ONLY keeps one run, which warms nothing
    args = calls[0]
    assert value(args, "--out") == "out/synth/st-deltanet-a3-srope-seed888" and value(args, "--label") == "st-deltanet-a3-srope"
    assert settings(args).seeds == (888,)


def test_st_gla_keeps_the_demos_encoding_and_the_authors_preset(tmp_path):
    calls = run_stage(tmp_path, "st-gla", SEEDS="0,1,2", JOBS="3", TAG="-1k", SET="--set max_steps=1000",
                      ONLY="st-gla-s2-1k-srope-demo-encoding", WARM="0")
    (args,) = calls
    task, preset, cfg = resolve_synth_command(args[3:])
    assert preset == "authors" and value(args, "--out") == "out/synth/st-gla-s2-1k-srope-demo-encoding"
    assert cfg.position["selective_rope"]["projection_gain"] == 8.0 and cfg.position["selective_rope"]["gate"] == "per-channel"
    assert cfg.max_steps == 1000 and cfg.seeds == (0, 1, 2)


def test_a_run_that_cannot_finish_its_schedule_is_not_begun(tmp_path):
    """NEED_S: with 600 s in the call, a run that needs 1,000 is neither warmed nor started."""
    assert run_stage(tmp_path, "state-tracking", SET="--set max_steps=1000", NEED_S="1000") == []
    calls = run_stage(tmp_path / "enough", "state-tracking", SET="--set max_steps=1000", NEED_S="300", ONLY="st-deltanet-a3-(nope|srope)")
    outs = [value(c, "--out") for c in calls]  # the warm-up first, then the runs it started at once
    assert outs[0] == "out/warm/st-deltanet-a3-nope" and sorted(outs[1:]) == ["out/synth/st-deltanet-a3-nope", "out/synth/st-deltanet-a3-srope"]


def test_a_run_alone_is_not_warmed_and_a_sweep_has_no_budget_unless_asked(tmp_path):
    """The warm-up's start-up came off the training of a lone MQAR run that had a time limit."""
    calls = run_stage(tmp_path, "mqar", ONLY="mqar-fig6-nope", BUDGET="left")
    assert [value(c, "--out") for c in calls] == ["out/synth/mqar-fig6-nope"]
    # the call's 600 s less both margins (40 + 60) and the seconds the stage itself took
    assert 400 <= settings(calls[0]).max_seconds <= 500
    (alone,) = run_stage(tmp_path / "protocol", "mqar", ONLY="mqar-fig6-srope")
    assert settings(alone).max_seconds is None and value(alone, "--jobs") == "3"  # the protocol's own length; the timeout stops it


def test_the_first_of_several_runs_warms_the_caches(tmp_path):
    calls = run_stage(tmp_path, "copying", ONLY="copying-release-arms-(srope|srope-gate-bias)")
    outs = [value(c, "--out") for c in calls]
    # the warm-up first; the runs after it start at once, so their order is the scheduler's
    assert outs[0] == "out/warm/copying-release-arms-srope"
    assert sorted(outs[1:]) == ["out/synth/copying-release-arms-srope", "out/synth/copying-release-arms-srope-gate-bias"]
    warm = settings(calls[0])
    assert warm.max_steps == 1 and warm.position_type == "selective_rope" and warm.eval_lengths == "2-8"
    assert all(settings(c).max_seconds <= 600 - 40 - 150 for c in calls[1:])  # copying keeps 150 s for its evaluation
    assert sorted(value(c, "--out") for c in run_stage(tmp_path / "off", "copying", ONLY="copying-release-arms-(srope|rope)", WARM="0")) == [
        "out/synth/copying-release-arms-rope", "out/synth/copying-release-arms-srope"]


def begun(root: Path, name: str) -> Path:
    """out/synth/NAME as a run in progress leaves it: results.json, two checkpoints, weights."""
    run = root / "out" / "synth" / name / "runs" / "a"
    for step in ("step_000100", "step_000200"):
        (run / "checkpoints" / step).mkdir(parents=True)
        (run / "checkpoints" / step / "model.safetensors").write_text("w")
    (run / "model.safetensors").write_text("w")
    (run.parents[1] / "results.json").write_text(json.dumps({"config": {"max_seconds": 321.0}}))
    return run


def test_a_run_begun_resumes_on_its_budget_and_comes_back_with_its_latest_checkpoint_if_asked(tmp_path):
    import tarfile

    begun(tmp_path, "st-gla-s2-nope")
    (args,) = run_stage(tmp_path, "st-gla", ONLY="st-gla-s2-nope")
    assert "--resume" in args and settings(args).max_seconds == 321.0
    with tarfile.open(tmp_path / "out" / "gpu" / "st-gla.tgz") as archive:
        assert "synth/st-gla-s2-nope/results.json" in archive.getnames() and not any("checkpoints" in n or n.endswith(".safetensors") for n in archive.getnames())
    begun(tmp_path / "keep", "st-gla-s2-nope")
    run_stage(tmp_path / "keep", "st-gla", ONLY="st-gla-s2-nope", KEEP_CHECKPOINTS="1")
    with tarfile.open(tmp_path / "keep" / "out" / "gpu" / "st-gla.tgz") as archive:
        kept = [n for n in archive.getnames() if n.endswith(".safetensors")]
    assert kept == ["synth/st-gla-s2-nope/runs/a/checkpoints/step_000200/model.safetensors"]


@pytest.mark.parametrize("stage", ["state-tracking", "st-gla", "copying", "mqar", "mad"])
def test_every_run_of_a_stage_resolves_and_ends_within_the_call(tmp_path, stage):
    calls = run_stage(tmp_path, stage, WARM="0")
    assert calls
    for args in calls:
        cfg = settings(args)
        assert cfg.max_seconds is None or 0 < cfg.max_seconds <= 600 - 40 - 60, (args, cfg.max_seconds)


def test_the_script_maps_stages_to_recipes_in_60_lines():
    assert len((ROOT / "experiments" / "gpu.sh").read_text().splitlines()) <= 60


def test_the_recipes_stage_runs_any_recipes_to_their_end(tmp_path):
    calls = run_stage(tmp_path, "recipes", RECIPES="st-release-tenth:nope st-release-tenth:srope", WARM="0")
    assert sorted(value(c, "--out") for c in calls) == ["out/synth/st-release-tenth-nope", "out/synth/st-release-tenth-srope"]
    for call in calls:
        cfg = settings(call)
        assert cfg.epochs == 10 and tuple(cfg.seeds) == (0, 1, 2) and cfg.max_seconds is None
    assert (tmp_path / "out" / "gpu" / "recipes.tgz").is_file()
