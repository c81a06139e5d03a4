"""Checkpoints that survive stops of every kind and load nothing but data: a planned stop
(--stop-after, SIGTERM, SIGINT) writes one; SIGKILL in the middle of writing one leaves the
previous one usable; a checkpoint whose files differ from its manifest is skipped for the one
before; a tampered, truncated or malformed file is a one-line error naming it; a full disk
leaves no partial checkpoint."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import srope.lab.train.checkpoint as ckpt
from srope.lab.cli import main
from srope.lab.train.checkpoint import CheckpointError, latest_checkpoint
from srope.lab.train.stops import StopRequested
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import train
from tests.lab.train.test_trainer import SMALL, losses

ROOT = Path(__file__).resolve().parents[3]
# The run of these tests; checkpoint_every is the default (100) unless a test says otherwise.
RUN = {k: v for k, v in SMALL.items() if k != "checkpoint_every"}


def _argv(store: str, out: Path, max_steps: int, **settings) -> list[str]:
    sets = {**{k: v for k, v in RUN.items() if k != "preset"}, **settings}
    return ["train", "--preset", RUN["preset"], "--data", store, "--max-steps", str(max_steps), "--out", str(out)] + [
        f"--set={k}={json.dumps(v)}" for k, v in sets.items()
    ]


def _same_run(a: Path, b: Path) -> None:
    assert losses(a) == losses(b)  # bitwise
    wa, wb = (load_file(run / "model" / "model.safetensors") for run in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_stop_after_writes_a_checkpoint_with_default_settings(store, tmp_path):
    config = TrainConfig(data=store, max_steps=6, lr=3e-3, **RUN)
    train(config, tmp_path / "whole")
    train(config, tmp_path / "split", stop_after=3)  # 3 is not a multiple of checkpoint_every (100)
    assert latest_checkpoint(tmp_path / "split").name == "step_00000003" and not (tmp_path / "split" / "model").exists()
    train(config, tmp_path / "split", resume=True)
    _same_run(tmp_path / "whole", tmp_path / "split")


def _child(argv: list[str], patch: str = "") -> subprocess.Popen:
    """``srope train`` in a new process (its own signals), optionally with test-only code run first."""
    code = f"import sys\n{patch}\nfrom srope.lab.cli import main\nsys.exit(main({argv!r}))"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(out: Path, steps: int, process: subprocess.Popen, timeout: float = 120) -> None:
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run did not get going"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_with_a_checkpoint(store, tmp_path, signum):
    max_steps = 40
    process = _child(_argv(store, tmp_path / "split", max_steps))
    _wait_for_steps(tmp_path / "split", 2, process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    line = err.strip().splitlines()[-1]
    assert f"stopped by {signal.Signals(signum).name} after step" in line and "continue with --resume" in line, err
    stopped = latest_checkpoint(tmp_path / "split")
    assert stopped is not None and int(stopped.name.split("_")[1]) < max_steps
    assert main([*_argv(store, tmp_path / "split", max_steps), "--resume"]) == 0
    train(TrainConfig(data=store, max_steps=max_steps, **{**RUN, "lr": None}), tmp_path / "whole")
    _same_run(tmp_path / "whole", tmp_path / "split")


def test_sigkill_while_writing_a_checkpoint_resumes_from_the_last_complete_one(store, tmp_path):
    """The process kills itself right after the weights of step 4's checkpoint are written
    (its optimiser state, RNG and trainer state are not): the .tmp folder is ignored and the
    run resumes from step 2."""
    patch = (
        "import os, signal\n"
        "import srope.lab.train.checkpoint as ckpt\n"
        "original = ckpt.save_file\n"
        "def save_file(tensors, path, *args, **kwargs):\n"
        "    original(tensors, path, *args, **kwargs)\n"
        "    if 'step_00000004.tmp' in str(path) and str(path).endswith('model.safetensors'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "ckpt.save_file = save_file"
    )
    argv = _argv(store, tmp_path / "split", 6, checkpoint_every=2)
    process = _child(argv, patch)
    process.communicate(timeout=180)
    assert process.returncode == -signal.SIGKILL
    assert (tmp_path / "split" / "checkpoints" / "step_00000004.tmp").is_dir()
    assert latest_checkpoint(tmp_path / "split").name == "step_00000002"
    assert main([*argv, "--resume"]) == 0
    assert not (tmp_path / "split" / "checkpoints" / "step_00000004.tmp").exists()
    train(TrainConfig(data=store, max_steps=6, **{**RUN, "lr": None, "checkpoint_every": 2}), tmp_path / "whole")
    _same_run(tmp_path / "whole", tmp_path / "split")


class _Payload:
    """Unpickling this runs code: a checkpoint from elsewhere must never get that far."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    "damage, file",
    [
        ("truncate", "model.safetensors"),
        ("truncate", "optimizer.pt"),
        ("truncate", "rng_rank0.safetensors"),
        ("garbage", "rng_rank0.json"),
        ("garbage", "trainer_state.json"),
        ("delete", "model.safetensors"),
        ("pickle", "optimizer.pt"),
        ("flip", "model.safetensors"),
    ],
)
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(store, tmp_path, capsys, damage, file):
    argv = _argv(store, tmp_path / "run", 4)
    train(TrainConfig(data=store, max_steps=4, **{**RUN, "lr": None}), tmp_path / "run", stop_after=2)
    target = latest_checkpoint(tmp_path / "run") / file
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif damage == "garbage":
        target.write_text("{not json")
    elif damage == "delete":
        target.unlink()
    elif damage == "flip":
        _flip(target)
    else:
        torch.save({"state": _Payload()}, target)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0], captured.err
    assert "pwned" not in captured.out + captured.err
    with pytest.raises(CheckpointError, match=file.replace(".", r"\.")):
        train(TrainConfig(data=store, max_steps=4, **{**RUN, "lr": None}), tmp_path / "run", resume=True)


def test_stop_requested_is_a_keyboard_interrupt_with_its_signal():
    stop = StopRequested(signal.SIGTERM, "stopped")
    assert isinstance(stop, KeyboardInterrupt) and stop.signum == signal.SIGTERM and str(stop) == "stopped"


def _flip(path: Path) -> None:
    """One flipped byte at the end of the file (in the data, where nothing else notices it)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _reseal(checkpoint: Path) -> None:
    """Make the manifest agree with the files again, as a tool other than srope train might."""
    manifest = checkpoint / "manifest.json"
    if manifest.exists():
        listed = json.loads(manifest.read_text())
        for name, entry in listed["files"].items():
            data = (checkpoint / name).read_bytes()
            entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        manifest.write_text(json.dumps(listed))


def test_a_checkpoint_lists_its_files_sha256_and_is_synced_before_the_rename(store, tmp_path, monkeypatch):
    events = []
    fsync, rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_ino)) or fsync(fd))
    monkeypatch.setattr(os, "rename", lambda a, b: events.append(("rename", str(a))) or rename(a, b))
    train(TrainConfig(data=store, max_steps=2, **{**RUN, "lr": None}), tmp_path, stop_after=1)
    final = latest_checkpoint(tmp_path)
    listed = json.loads((final / "manifest.json").read_text())["files"]
    assert set(listed) == {p.name for p in final.iterdir()} - {"manifest.json"} >= {"model.safetensors", "optimizer.pt", "trainer_state.json"}
    for name, entry in listed.items():
        data = (final / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    renamed = events.index(("rename", f"{final}.tmp"))
    synced_before = {ino for kind, ino in events[:renamed] if kind == "fsync"}
    assert {p.stat().st_ino for p in [final, *final.iterdir()]} <= synced_before
    assert ("fsync", final.parent.stat().st_ino) in events[renamed:]  # the rename itself is durable


@pytest.mark.parametrize("damage", ["flipped weight byte", "edited step"])
def test_a_checkpoint_that_fails_verification_falls_back_to_the_previous_one(store, tmp_path, damage):
    config = TrainConfig(data=store, max_steps=6, **{**RUN, "lr": None, "checkpoint_every": 2})
    train(config, tmp_path / "whole")
    train(config, tmp_path / "split", stop_after=4)
    newest = latest_checkpoint(tmp_path / "split")
    if damage == "flipped weight byte":
        _flip(newest / "model.safetensors")
    else:
        state = json.loads((newest / "trainer_state.json").read_text())
        (newest / "trainer_state.json").write_text(json.dumps({**state, "step": 3}, indent=2))
    warning = re.escape(f"skipping checkpoint {newest}: ") + ".*sha256.*" + re.escape(f"resuming from {newest.with_name('step_00000002')}")
    with pytest.warns(UserWarning, match=warning):
        train(config, tmp_path / "split", resume=True)
    _same_run(tmp_path / "whole", tmp_path / "split")


def test_stale_tmp_checkpoints_are_ignored_and_removed_at_start(store, tmp_path, capsys):
    out = tmp_path / "run"
    argv = _argv(store, out, 4, checkpoint_every=2)
    train(TrainConfig(data=store, max_steps=4, **{**RUN, "lr": None, "checkpoint_every": 2}), out, stop_after=2)
    stale = out / "checkpoints" / "step_00000009.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(out).name == "step_00000002"
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr()
    assert not stale.exists() and f"removed {stale}" in printed.out + printed.err


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_full_disk_while_checkpointing_is_a_one_line_error_and_leaves_no_tmp(store, tmp_path, monkeypatch, capsys, writer):
    out = tmp_path / "run"
    argv = _argv(store, out, 6, checkpoint_every=2)
    if writer == "safetensors":
        original = ckpt.save_file

        def save_file(tensors, path, *args, **kwargs):
            if "step_00000004.tmp" in str(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return original(tensors, path, *args, **kwargs)

        monkeypatch.setattr(ckpt, "save_file", save_file)
    else:
        original = torch.save

        def save(obj, path, *args, **kwargs):
            if "step_00000004.tmp" in str(path):  # what torch raises on a full disk
                raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 4416 vs 4304")
            return original(obj, path, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after the progress bar's
    assert "Traceback" not in err and line.startswith("srope train: error: ") and "step_00000004" in line and "--resume" in line, err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]
    monkeypatch.undo()
    assert main([*argv, "--resume"]) == 0
    assert latest_checkpoint(out).name == "step_00000006"


def _malform(checkpoint: Path, how: str) -> Path:
    """Change one file of ``checkpoint`` the way ``how`` says; return the file."""
    if how == "alias of a missing tensor":
        target = checkpoint / "model.safetensors"
        save_file(load_file(target), target, metadata={"aliases": json.dumps({"lm_head.weight": "missing.weight"})})
    else:
        target = checkpoint / "trainer_state.json"
        state = json.loads(target.read_text())
        if how == "string step":
            state["step"] = str(state["step"])
        else:
            del state["config"]
        target.write_text(json.dumps(state))
    _reseal(checkpoint)
    return target


@pytest.mark.parametrize("how, expected", [("string step", "step"), ("no config", "config"), ("alias of a missing tensor", "missing.weight")])
def test_a_malformed_checkpoint_is_a_one_line_error(store, tmp_path, capsys, how, expected):
    out = tmp_path / "run"
    train(TrainConfig(data=store, max_steps=4, **{**RUN, "lr": None}), out, stop_after=2)
    target = _malform(latest_checkpoint(out), how)
    capsys.readouterr()
    assert main([*_argv(store, out, 4), "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0] and expected in lines[0], lines
    with pytest.raises(CheckpointError):
        train(TrainConfig(data=store, max_steps=4, **{**RUN, "lr": None}), out, resume=True)
