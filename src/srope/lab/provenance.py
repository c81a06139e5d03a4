"""Where a result came from: the commit, the command, the environment, the date.

Every result srope writes records :func:`record`. :func:`is_stale` tells whether a result
was produced by code older than the last change to the code it depends on (the model and
op code by default), so that a report can mark it.

The commit is the environment variable ``SROPE_COMMIT`` when whoever copied the tree set it
(a copy, as on a lent GPU machine, may carry no ``.git`` or an older one than the files it
holds), else git's HEAD where srope runs from a checkout.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout, when srope runs from one
MODEL_CODE = ("src/srope/ops", "src/srope/modules", "src/srope/layers", "src/srope/models")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def commit() -> tuple[str | None, bool | None]:
    """``(commit, dirty)``: ``$SROPE_COMMIT`` (dirty unknown) when set, else HEAD of the
    checkout and whether its ``src/`` has uncommitted changes, else ``(None, None)``."""
    if os.environ.get("SROPE_COMMIT"):
        return os.environ["SROPE_COMMIT"], None
    head = _git("rev-parse", "HEAD") if (ROOT / ".git").exists() else None
    if head:
        return head, bool(_git("status", "--porcelain", "--", "src"))
    return None, None


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in ("srope", "torch", "triton", "numpy", "transformers", "fla-core", "flash-linear-attention", "lm-eval"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def environment(device) -> dict:
    """Where a run ran: the device, its name, torch's CPU threads and the package versions."""
    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"device": str(device), "device_name": name, "threads": torch.get_num_threads(), "versions": versions()}


def record(command: str | list[str] | None = None, *, source: tuple[str | None, bool | None] | None = None, **extra) -> dict:
    """The provenance of a result made now: commit, dirty flag, command (default: this
    process's), versions, host and date; ``extra`` (seeds, device, wall_s, ...) added.
    ``source``: :func:`commit` taken when the run began (a commit made while it ran is not
    the code it ran); default: now."""
    head, dirty = commit() if source is None else source
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]]
    return {
        "commit": head,
        "dirty": dirty,
        "command": command if isinstance(command, str) else " ".join(command),
        "versions": versions(),
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }


def last_change(paths: tuple[str, ...] = MODEL_CODE) -> str | None:
    """The newest commit that changed ``paths`` (None outside a checkout)."""
    return _git("log", "-1", "--format=%H", "--", *paths) if (ROOT / ".git").exists() else None


def subject(commit: str) -> str | None:
    """The first line of ``commit``'s message (None outside a checkout)."""
    return _git("log", "-1", "--format=%s", commit) if (ROOT / ".git").exists() else None


def is_stale(result_commit: str | None, paths: tuple[str, ...] = MODEL_CODE) -> bool | None:
    """True when ``paths`` changed after ``result_commit`` (or it is unknown), False when
    the result's code is current, None when this is not a checkout (cannot tell)."""
    newest = last_change(paths)
    if newest is None:
        return None
    if not result_commit:
        return True
    if _git("cat-file", "-e", f"{result_commit}^{{commit}}") is None:
        return True  # a commit this checkout does not have
    return _git("merge-base", "--is-ancestor", newest, result_commit) is None
