"""Small helpers shared by the theory commands: output folder, JSON, figures, fits."""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
import time
from typing import Any

import numpy as np
import torch


def prepare_out_dir(out_dir: pathlib.Path | str) -> pathlib.Path:
    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a folder, got the file {out}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    return seed


def start_run(out_dir: pathlib.Path | str, seed: Any) -> tuple[int, pathlib.Path, float, torch.Generator]:
    """What every theory script's ``run`` begins with: the checked seed, the output folder,
    the start time and a generator seeded with it."""
    seed = check_seed(seed)
    return seed, prepare_out_dir(out_dir), time.perf_counter(), torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def single_thread():
    """Run torch on one thread, then restore the setting. The theory commands are loops of
    small ops, which a second thread only slows down (and on a shared 2-core machine, a lot)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step_rel_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """``‖a_t − b_t‖ / ‖b_t‖`` for every leading index t (``‖a_t − b_t‖`` where ``b_t = 0``)."""
    diff = (actual - expected).reshape(actual.shape[0], -1).abs().square().sum(-1).sqrt()
    norm = expected.reshape(expected.shape[0], -1).abs().square().sum(-1).sqrt()
    return torch.where(norm > 0, diff / torch.where(norm > 0, norm, torch.ones_like(norm)), diff)


def _plain(value: Any) -> Any:
    """JSON-safe copy: tensors and numpy values become lists/floats, non-finite floats None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _plain(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def write_json(out: pathlib.Path, name: str, data: dict) -> dict:
    """Write ``out/<name>.json`` and return the JSON-safe dict that was written."""
    plain = _plain(data)
    (out / f"{name}.json").write_text(json.dumps(plain, indent=1, allow_nan=False) + "\n")
    return plain


def new_figure(rows: int, cols: int, size: tuple[float, float]):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global backend state)."""
    from srope.lab import plotting

    fig = plotting.figure("srope theory's plots", figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def save_figure(fig, out: pathlib.Path, name: str, dpi: int = 90) -> pathlib.Path:
    """Save ``out/<name>.png`` as a 256-colour palette PNG (line plots lose nothing visible,
    and the file is a third of the RGBA size)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    buffer.seek(0)
    path = out / f"{name}.png"
    Image.open(buffer).convert("RGB").quantize(colors=256).save(path, optimize=True)
    return path


def loglog_slope(x, y) -> float:
    """Least-squares slope of log(y) against log(x)."""
    x = np.log(np.asarray(x, dtype=np.float64))
    y = np.log(np.asarray(y, dtype=np.float64))
    return float(np.polyfit(x, y, 1)[0])


def golden_section_min(fn, low: torch.Tensor, high: torch.Tensor, iters: int = 200) -> torch.Tensor:
    """Minimise a unimodal, elementwise function on ``[low, high]`` (vectorised over the
    elements of ``low``/``high``) by golden-section search; returns the minimiser."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low.clone(), high.clone()
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = fn(c), fn(d)
    for _ in range(iters):
        left = fc < fd  # the minimum lies in [a, d]
        b = torch.where(left, d, b)
        a = torch.where(left, a, c)
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        fc, fd = fn(c), fn(d)  # both re-evaluated: simple, and the objectives here are cheap
    return (a + b) / 2


def script(run, name: str) -> None:
    """``python -m srope.lab.theory.<name> [--out DIR] [--seed N]``: one study as a script."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m srope.lab.theory.{name}", description=run.__module__)
    parser.add_argument("--out", default="out/theory", help="folder for <name>.json and <name>.png (default: out/theory)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run(pathlib.Path(args.out), seed=args.seed)
