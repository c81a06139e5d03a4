"""``srope demo``'s entry points: :func:`run_demo` (one seed) and :func:`run_demo_seeds`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srope.lab import plotting, provenance
from srope.lab.demo.config import DEVICES, GROUP, POSITIONS, PRESETS, DemoConfig
from srope.lab.demo.data import eval_sets
from srope.lab.demo.evaluation import check_targets
from srope.lab.demo.report import PLOT_PURPOSE, format_seed_table, format_table, plot, plot_seeds
from srope.lab.demo.workers import _cpu_seconds, _progress, _train_all

RESULTS_FILE, PLOT_FILE = "results.json", "parity.png"


def check_args(out: Any, device: Any, seed: Any, preset: Any = None, workers: Any = None) -> None:
    """Validate :func:`run_demo`'s arguments (TypeError / ValueError with the expected form)."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a folder path (str or os.PathLike), got {type(out).__name__}")
    if not str(out):
        raise ValueError("out must be a non-empty folder path")
    if not isinstance(device, str):
        raise TypeError(f"device must be a string, one of {DEVICES}, got {type(device).__name__}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' needs a visible CUDA GPU; none is available (run on the CPU with device='cpu')")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)} or None (by device), got {preset!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= len(POSITIONS)):
        raise ValueError(f"workers must be None (automatic) or an integer in [1, {len(POSITIONS)}], got {workers!r}")


def default_workers(device: str, cores: int) -> int:
    """How many of the three models :func:`run_demo` trains at once by default.

    On the CPU the models are small enough that a second thread speeds one up little, so
    three single-thread processes sharing 2 cores finish sooner than three runs one after
    another with both (docs/demo.md has the times). On CUDA one model at a time fills the
    GPU."""
    return len(POSITIONS) if device == "cpu" and cores >= 2 else 1


def run_demo(out: str | os.PathLike = "out/demo", device: str = "cpu", seed: int = 0, *, preset: str | None = None,
             config: DemoConfig | None = None, workers: int | None = None, progress: bool = True) -> dict:
    """Train NoPE, RoPE and Selective RoPE GLAs on parity; print a table, write
    ``out/results.json`` and ``out/parity.png``; return the results.

    Args:
        out: output folder (created).
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds the weights, the training stream and the evaluation sets.
        preset: ``"cpu"`` or ``"cuda"`` (default: the device's); ignored when ``config`` is given.
        config: a :class:`DemoConfig` to run instead of a preset (tests use a tiny one).
        workers: how many models train at once, each in its own process with
            ``cores // workers`` threads (at least 1). Default (:func:`default_workers`):
            1 on CUDA; on the CPU all three at once when there are 2 cores or more. The
            worker processes import the calling script again, so a script must keep its
            top level under ``if __name__ == "__main__":`` (as for any multiprocessing).
        progress: show a progress bar.
    """
    return _run_demo(out, device, seed, preset=preset, config=config, workers=workers, progress=progress, source=provenance.commit())


def _run_demo(out, device, seed, *, preset, config, workers, progress, source: tuple[str | None, bool | None]) -> dict:
    """:func:`run_demo` with ``source``, the commit taken when the whole command began: the
    worker processes run the code imported then, whatever is committed while they train."""
    check_args(out, device, seed, preset, workers)
    plotting.require(PLOT_PURPOSE)  # before minutes of training, not after
    if config is None:
        config = PRESETS[preset or device]
    elif not isinstance(config, DemoConfig):
        raise TypeError(f"config must be a DemoConfig, got {type(config).__name__}")
    config.check()
    seed = int(seed)
    cores = os.cpu_count() or 1
    workers = default_workers(device, cores) if workers is None else workers
    threads = max(1, cores // workers)
    start, cpu_start = time.perf_counter(), _cpu_seconds()

    data = eval_sets(config, seed)
    bars = _progress(config, seed, progress)
    try:
        runs = _train_all(config, seed, device, data, workers, threads, bars)
    finally:
        for bar in bars.values():
            bar.close()

    # Workers count their own CPU time (fork-server children are not this process's children).
    cpu_workers = sum(run["cpu_seconds"] for run in runs.values()) if workers > 1 else 0.0
    results = {
        "task": "parity",
        "group": GROUP,
        "train_len": config.train_len,
        "eval_len": config.eval_len,
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(_cpu_seconds() - cpu_start + cpu_workers, 3),
        "device": device,
        "seed": seed,
        "preset": config.name,
        "workers": workers,
        "threads_per_worker": threads,
        "cores": cores,
        "eval_sequences": {"train": len(data["train"][0]), "eval": len(data["eval"][0]),
                           "dropped_seen_in_training": data["dropped_seen_in_training"]},
        "config": config.to_dict(),
        "environment": provenance.environment(device),
        "provenance": provenance.record(source=source, seeds=[seed], device=device, wall_s=round(time.perf_counter() - start, 3)),
        "results": {kind: runs[kind] for kind in POSITIONS},
    }
    results["targets"] = check_targets(results)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / RESULTS_FILE).write_text(json.dumps(results, indent=1))
    plot(results, path / PLOT_FILE)
    print(format_table(results))
    print(f"wrote {path / RESULTS_FILE} and {path / PLOT_FILE}")
    return results


def run_demo_seeds(out: str | os.PathLike = "out/demo", device: str = "cpu", seeds: Any = (0, 1, 2, 3, 4), *,
                   preset: str | None = None, config: DemoConfig | None = None, workers: int | None = None,
                   progress: bool = True) -> dict:
    """:func:`run_demo` once per seed (into ``out/seed<N>``), then a summary across seeds:
    ``out/summary.json`` (each seed's sequence accuracies and targets, how many seeds meet
    all of them, wall time) and ``out/seeds.png`` (accuracy against length, every seed).

    The demo's targets ask for the default seed and at least 4 of 5 seeds: ``srope demo
    --seeds 0-4`` checks exactly that.
    """
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise TypeError(f"seeds must be a sequence of integers, got {type(seeds).__name__}")
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be non-empty and distinct, got {seeds}")
    for seed in seeds:
        check_args(out, device, seed, preset, workers)
    start, source = time.perf_counter(), provenance.commit()
    runs = {seed: _run_demo(Path(out) / f"seed{seed}", device, seed, preset=preset, config=config, workers=workers, progress=progress,
                            source=source)
            for seed in seeds}
    per_seed = {str(seed): {"seq_acc": {kind: run["results"][kind]["seq_acc"] for kind in POSITIONS},
                            "targets": run["targets"], "meets_all": all(run["targets"].values()), "seconds": run["seconds"]}
                for seed, run in runs.items()}
    summary = {
        "task": "parity", "device": device, "preset": next(iter(runs.values()))["preset"], "seeds": seeds,
        "train_len": next(iter(runs.values()))["train_len"], "eval_len": next(iter(runs.values()))["eval_len"],
        "meets_all": sum(entry["meets_all"] for entry in per_seed.values()),
        "selective_rope_learns": sum(entry["targets"]["selective_rope_learns"] for entry in per_seed.values()),
        "seconds": round(time.perf_counter() - start, 3), "per_seed": per_seed,
        "provenance": provenance.record(source=source, seeds=seeds, device=device, wall_s=round(time.perf_counter() - start, 3)),
    }
    path = Path(out)
    (path / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_seeds(runs, path / "seeds.png")
    print(format_seed_table(summary))
    print(f"wrote {path / 'summary.json'} and {path / 'seeds.png'}")
    return summary
