"""Whether a run may start or resume in a folder, and whether a resume has the run's settings."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from srope.lab.train.checkpoint import latest_checkpoint
from srope.lab.train.corpus import local_path
from srope.lab.train.run_folder import used_entries
from srope.lab.train.tokenizer import MISTRAL_V1
from srope.lab.train.train_config import TrainConfig

# Settings a resumed run may change (they do not affect the numbers computed).
RESUME_MAY_CHANGE = {"checkpoint_every", "log_every", "eval_every", "tensorboard", "device", "cache", "cuda_graph"}
# Settings that are local paths: recorded absolute (resolve_recorded_paths reads older runs' relative ones).
PATH_SETTINGS = ("data", "tokenizer", "cache")


def _check_folder(out: Path, config: TrainConfig, resume: bool) -> dict | None:
    """Refuse a folder this run must not write into; return the finished run's ``run.json``
    when ``resume`` finds one (nothing is left to do), else None."""
    used = used_entries(out)
    if not resume:
        if latest_checkpoint(out) is not None:
            raise FileExistsError(f"{out} already holds checkpoints: pass --resume to continue, or choose another --out")
        if used:
            restart = "; or pass --resume to start its run again from step 0" if "train_config.json" in used else ""
            raise FileExistsError(f"{out} is not empty ({', '.join(used[:4])}{', ...' if len(used) > 4 else ''}) and holds no checkpoint: "
                                  f"choose another --out, or empty it{restart}")  # fmt: skip
        return None
    finished = _finished_run(out)
    if finished is not None:
        _check_same_settings(finished.get("config", {}), config)
        return finished
    if latest_checkpoint(out) is None and "train_config.json" not in used:
        raise FileNotFoundError(f"--resume: no checkpoint and no srope train run under {out}; start without --resume")
    return None


def _finished_run(out: Path) -> dict | None:
    """``run.json`` of a run that reached ``max_steps``, or None."""
    try:
        run = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) and run.get("complete") is True else None


def _check_same_settings(before: dict, config: TrainConfig) -> None:
    now = config.to_dict()
    before = resolve_recorded_paths(before, now)
    changed = {k: (v, now[k]) for k, v in before.items() if k not in RESUME_MAY_CHANGE and now.get(k) != v}
    if changed:
        raise ValueError(f"--resume: settings differ from the run's: {changed} (started with, now); resume with the same settings")


def resolve_recorded_paths(before: dict, now: dict) -> dict:
    """``before`` (a run's recorded settings) with each relative path in ``PATH_SETTINGS`` that
    names, from the current directory, the absolute path ``now`` has, replaced by it, with a
    one-line warning. Runs from before paths were recorded absolute kept them as given, and
    read them against the directory they ran in."""
    same = {key: before[key] for key in PATH_SETTINGS if _names_the_same(before.get(key), now.get(key), key)}
    if same:
        recorded = " and ".join(f"a relative {key} path {old!r}" for key, old in same.items())
        warnings.warn(f"the run recorded {recorded} (srope recorded paths as given then); from the current directory "
                      f"{'they name' if len(same) > 1 else 'it names'} {' and '.join(now[key] for key in same)}, what this run reads, so it resumes",
                      stacklevel=3)  # fmt: skip
    return {**before, **{key: now[key] for key in same}}


def _names_the_same(old, new, key: str) -> bool:
    """Whether the recorded ``old`` is a path other than ``new`` in text that names it from the current directory."""
    if not (isinstance(old, str) and isinstance(new, str)) or old == new:
        return False
    if key == "tokenizer" and old == MISTRAL_V1:
        return False  # a name, not a path
    path = local_path(old)
    return path is not None and str(path) == new
