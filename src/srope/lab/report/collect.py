"""Find result files and turn them into one :class:`Run` per trained model (per seed).

What is read (recognised by content, so folders may be arranged freely):

- ``results.json`` of ``srope synth`` (``task`` one of the synthetic tasks, ``runs``): every
  run (setting x optimiser point x seed) is pooled with the runs of other files that share
  the protocol and the variant, so a sweep split over several folders reads as one; per
  setting the optimiser point with the best mean score over seeds is kept (the runner's
  rule, MAD's "best over the grid").
- ``results.json`` of ``srope demo`` (``task`` "parity"): one run per position encoding.
  ``summary.json`` of ``srope demo --seeds`` repeats the per-seed files beside it and is
  not read.
- ``srope train`` run folders: ``run.json`` (provenance, config, final metrics), or for runs
  that predate it ``train_config.json`` + ``metrics.jsonl``. Inside an ``srope sweep-lr``
  folder (``sweep.json``) only the chosen learning rate's run is a row.
- ``srope eval`` JSON (``contexts``) and lm-evaluation-harness results (``results`` with
  ``acc,none``-style keys): attached to the training run whose folder holds them or whose
  model folder they name.

Anything else is listed as skipped. Provenance (``"provenance"`` in the JSON, see
:mod:`srope.lab.provenance`) is kept per file; files without it are "provenance unknown".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from srope.lab.report.collect_lm import lm_runs
from srope.lab.report.collect_synth import demo_runs, synthetic_runs
from srope.lab.report.records import Collected
from srope.lab.tasks.registry import tasks


SKIP_DIRS = {"checkpoints", "tensorboard", "model", "__pycache__", "node_modules", "site-packages"}  # and every hidden folder
# The walk's bounds: folders this deep below a given one (results sit 1-5 deep: out/sweep/RUN/lr_X/run.json)
# and trees that never hold results (a given folder that is one of them is refused).
MAX_DEPTH = 8
SYSTEM_DIRS = {Path(p) for p in ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/snap", "/sys", "/usr", "/var")}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _json_files(roots: list[Path]) -> list[Path]:
    """The ``.json`` files under ``roots`` (files are taken as they are), at most :data:`MAX_DEPTH`
    folders deep, skipping hidden folders, :data:`SKIP_DIRS`, system trees and folders already seen
    (a symlink loop); a root that is the filesystem's or a system folder is refused."""
    found: list[Path] = []
    seen: set[Path] = set()
    for root in roots:
        if root.is_file():
            found.append(root)
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"no such result folder: {root}")
        if root.resolve() in SYSTEM_DIRS:
            raise ValueError(f"{root} is a system folder (or the filesystem's root), not a result folder: pass the folders srope's commands wrote (e.g. out/)")
        stack = [(root, 0)]
        while stack:
            folder, depth = stack.pop()
            real = folder.resolve()
            if real in seen or real in SYSTEM_DIRS:
                continue
            seen.add(real)
            try:
                entries = sorted(folder.iterdir())
            except OSError:  # unreadable: not ours
                continue
            for entry in entries:
                if entry.is_dir():
                    if depth < MAX_DEPTH and entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                        stack.append((entry, depth + 1))
                elif entry.is_file() and entry.suffix == ".json":
                    found.append(entry)
    return sorted(dict.fromkeys(p.resolve() for p in found))


def _kind(path: Path, data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    task = data.get("task")
    if path.name == "results.json" and isinstance(task, str) and task in tasks and isinstance(data.get("runs"), list):
        return "synth"
    if task == "parity" and isinstance(data.get("results"), dict) and "config" in data:
        return "demo"
    if task == "parity" and "per_seed" in data:
        return "demo-summary"
    if path.name == "run.json" and isinstance(data.get("config"), dict) and "metrics" in data:
        return "train"
    if path.name == "train_config.json" and "preset" in data and "max_steps" in data:
        return "train-legacy"
    if path.name == "sweep.json" and isinstance(data.get("runs"), list) and "lrs" in data:
        return "sweep"
    if isinstance(data.get("contexts"), list) and "model" in data:
        return "eval"
    results = data.get("results")
    if isinstance(results, dict) and any(isinstance(v, dict) and any("," in k for k in v) for v in results.values()):
        return "lm-eval"
    return None


def collect(dirs: list[Path | str]) -> Collected:
    """Every result under ``dirs`` (folders, searched recursively, or files)."""
    files = _json_files([Path(d) for d in dirs])
    by_kind: dict[str, list[tuple[Path, dict]]] = {}
    read, skipped = [], []
    for path in files:
        data = _read_json(path)
        kind = _kind(path, data)
        if kind is None:
            if path.parent.name != "model" and path.name != "config.json":
                skipped.append(path)
            continue
        by_kind.setdefault(kind, []).append((path, data))
        if kind != "demo-summary":
            read.append(path)
    runs = synthetic_runs(by_kind.get("synth", []))
    runs += demo_runs(by_kind.get("demo", []))
    runs += lm_runs(by_kind.get("train", []), by_kind.get("train-legacy", []), by_kind.get("sweep", []), by_kind.get("eval", []), by_kind.get("lm-eval", []))
    return Collected(runs, read, skipped)
