"""experiments/gpu.sh's synthetic stages on the CPU: the ``srope synth`` lines a stage starts (each
GPU call is scarce, so a wrong folder name or a lost option costs a session). The script runs in a
scratch copy with a stand-in for the device setup and a ``python3`` that only records its
arguments."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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
    stub.write_text(f'#!/bin/sh\nprintf "%s\\037" "$@" >> {calls}\necho >> {calls}\n')
    stub.chmod(0o755)
    inherited = {k: v for k, v in os.environ.items() if k not in ("OUT", "DETACH", "SYNTH_ONLY", "BACKGROUND", "AUTOTUNE")}
    full_env = {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALL_S": "600", **env}
    done = subprocess.run(["bash", "experiments/gpu.sh", stage], cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split("\x1f")[:-1] for line in (calls.read_text() if calls.exists() else "").splitlines()]


def option(args: list[str], name: str) -> str:
    """The value after ``--set name=`` (the last one: later --set options win)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert values, f"no --set {name}= in {args}"
    return values[-1]


def test_state_tracking_runs_seeds_jobs_and_a_shorter_schedule_in_tagged_folders(tmp_path):
    calls = run_stage(tmp_path, "state-tracking", ST_SEEDS="555,666,777", ST_JOBS="3", ST_TAG="-1k", ST_SET="--set max_steps=1000")
    warm = [c for c in calls if "out/warm" in " ".join(c)]
    runs = {c[c.index("--out") + 1]: c for c in calls if "--label" in c}
    assert len(warm) == 2 and all(option(c, "max_steps") == "1" for c in warm)  # one warm-up per panel
    assert sorted(runs) == sorted(f"out/synth/st-{p}-1k-{e}" for p, e in
                                  [("attention-s2", "nope"), ("attention-s2", "rope"), ("attention-s2", "srope"),
                                   ("deltanet-a3", "nope"), ("deltanet-a3", "srope")])
    for out, args in runs.items():
        assert option(args, "seeds") == "555,666,777" and option(args, "max_steps") == "1000"
        assert args[args.index("--jobs") + 1] == "3" and args[args.index("--label") + 1] == out.split("/")[-1]
        assert int(option(args, "max_seconds")) > 0  # what is left of the call, not the placeholder
    attention = runs["out/synth/st-attention-s2-1k-srope"]
    assert "attention" in attention and option(attention, "model.num_hidden_layers") == "1" and "selective_rope" in attention
    assert option(runs["out/synth/st-deltanet-a3-1k-nope"], "eval_size") == "16384" and "paper_a3" in runs["out/synth/st-deltanet-a3-1k-nope"]
    assert (tmp_path / "out" / "gpu" / "state-tracking.tgz").is_file()


def test_a_part_adds_seeds_in_its_own_folder_under_the_arms_label(tmp_path):
    calls = run_stage(tmp_path, "state-tracking", ST_SEEDS="888", ST_PART="-seed888", SYNTH_ONLY="st-deltanet-a3-srope-seed888")
    assert len(calls) == 1 and "--jobs" not in calls[0]  # SYNTH_ONLY keeps one arm; no warm-up line matched
    args = calls[0]
    assert args[args.index("--out") + 1] == "out/synth/st-deltanet-a3-srope-seed888"
    assert args[args.index("--label") + 1] == "st-deltanet-a3-srope" and option(args, "seeds") == "888"


def test_st_gla_keeps_the_demos_encoding_and_the_authors_preset(tmp_path):
    calls = run_stage(tmp_path, "st-gla", ST_SEEDS="0,1,2", ST_JOBS="3", ST_TAG="-1k", ST_SET="--set max_steps=1000",
                      SYNTH_ONLY="st-gla-s2-1k-srope-demo-encoding", WARM="0")
    (args,) = calls
    assert args[args.index("--preset") + 1] == "authors" and args[args.index("--out") + 1] == "out/synth/st-gla-s2-1k-srope-demo-encoding"
    assert option(args, "position.projection_gain") == "8.0" and option(args, "position.gate") == "per-channel"
    assert option(args, "max_steps") == "1000" and option(args, "seeds") == "0,1,2"


def test_a_run_that_cannot_finish_its_schedule_is_not_begun(tmp_path):
    """NEED_S: with 600 s in the call, a run that needs 1,000 is neither warmed nor started."""
    assert run_stage(tmp_path, "state-tracking", ST_SET="--set max_steps=1000", NEED_S="1000") == []
    calls = run_stage(tmp_path / "enough", "state-tracking", ST_SET="--set max_steps=1000", NEED_S="300", SYNTH_ONLY="st-deltanet-a3-(nope|srope)")
    outs = [c[c.index("--out") + 1] for c in calls]  # the warm-up first, then the runs it started at once
    assert outs[0] == "out/warm/st-deltanet-a3-nope" and sorted(outs[1:]) == ["out/synth/st-deltanet-a3-nope", "out/synth/st-deltanet-a3-srope"]


def test_a_run_alone_is_not_warmed_even_where_its_line_is_marked(tmp_path):
    """The warm-up's start-up came off the training of a lone MQAR run that had a time limit."""
    calls = run_stage(tmp_path, "mqar", SYNTH_ONLY="mqar-nope", MQAR_WIDTHS="64", MQAR_SET="--set max_seconds=@LEFT@")
    assert [c[c.index("--out") + 1] for c in calls] == ["out/synth/mqar-nope"]
    # the call's 600 s less both margins (40 + 60) and the seconds the stage itself took
    assert 400 <= int(option(calls[0], "max_seconds")) <= 500


def test_the_first_of_several_runs_warms_the_caches_where_the_marked_line_is_left_out(tmp_path):
    calls = run_stage(tmp_path, "copying", SYNTH_ONLY="copying-(srope|srope-gate-bias)")
    outs = [c[c.index("--out") + 1] for c in calls]
    # the warm-up first; the runs after it start at once, so their order is the scheduler's
    assert outs[0] == "out/warm/copying-srope" and sorted(outs[1:]) == ["out/synth/copying-srope", "out/synth/copying-srope-gate-bias"]
    assert option(calls[0], "max_steps") == "1" and "selective_rope" in calls[0]
    assert sorted(c[c.index("--out") + 1] for c in run_stage(tmp_path / "off", "copying", SYNTH_ONLY="copying-(srope|rope)", WARM="0")) == [
        "out/synth/copying-rope", "out/synth/copying-srope"]
