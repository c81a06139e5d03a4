"""Train and evaluate one configuration of a synthetic task, with its sweep, and write results.

``run_synthetic(task, model_factory, out=DIR, overrides={...})`` resolves the task's preset,
then for every setting x learning rate x weight decay x seed builds a fresh model with
``model_factory(request)`` (:class:`srope.lab.tasks.common.ModelRequest`), trains it with the
protocol's optimiser, schedule and early stopping, evaluates it, and writes
``DIR/results.json`` (after every run, so partial sweeps survive) and ``DIR/results.png``.

The training of one run (:func:`train_run`, the same for every task) is in
:mod:`srope.lab.tasks.training`, the resolution of a run's settings (:func:`resolve_preset`)
in :mod:`srope.lab.tasks.presets`; both are importable from here too. A preset's ``threads``
(0: torch's default; the ``cpu`` presets: 1) sets torch's CPU threads for the sweep.

Summary: for every setting the optimiser point (lr, weight decay) with the best mean score
over seeds is chosen (MAD's "best over the grid"); its mean, spread and curves are reported.

Stopping and resuming: a run in progress writes a checkpoint every ``checkpoint_every``
steps and at a planned stop (SIGINT/SIGTERM, ``stop_after_steps``) into
``DIR/runs/NAME/checkpoints/`` (:mod:`srope.lab.train.checkpoint`: safetensors, JSON and a
``weights_only`` optimiser file). ``resume=True`` keeps the finished runs of
``results.json``, continues the others from their checkpoints and gives the results and
weights (each record's ``weights_sha256``) of a sweep never stopped, bitwise. A run's
checkpoints are deleted once its record is in ``results.json``; until then
``DIR/runs/NAME/evaluations.json`` holds its evaluations so far (they survive where the
checkpoints are not kept). ``jobs=N`` trains N runs
at once (:mod:`srope.lab.tasks.parallel`). ``results["provenance"]`` lists every call's
:func:`srope.lab.provenance.record` (commit, command, seeds, device, wall time), the first first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from srope.lab import provenance
from srope.lab.tasks import release
from srope.lab.tasks.common import Setting, default_cache_dir
from srope.lab.tasks.parallel import LocalControl
# The presets' and the single run's names are importable from the runner too (callers import them from here).
from srope.lab.tasks.presets import get_task, preset_names, presets_line, read_synth_config, recorded_settings, resolve_preset, resolve_run  # noqa: F401
from srope.lab.tasks.registry import check_task
from srope.lab.tasks.summary import summarize
from srope.lab.tasks.training import (  # noqa: F401
    EVALUATIONS_FILE, ModelFactory, _say, _write_json, head_at_targets, model_request, scored_positions, task_loss, train_run, weights_digest,
)
from srope.lab.train.checkpoint import latest_checkpoint
from srope.lab.train.run_folder import RunFolder

RESULTS_FILE, PLOT_FILE, RUNS_DIR = "results.json", "results.png", "runs"
LOSS_PLOT_FILE = "loss.png"
# Settings a resumed sweep may change: they change no number it computes.
RESUME_MAY_CHANGE = frozenset({"checkpoint_every", "save_weights"})


def default_label(cfg) -> str:
    label = f"{cfg.mixer}/{cfg.position_type}"
    if cfg.position_type == "selective_rope":
        opts = cfg.position.get("selective_rope", {})
        label += "+gate" if opts.get("gate") else ""
        label += "+bias" if opts.get("bias") else ""
    return label


def run_synthetic(task: str, model_factory: ModelFactory, *, out: Path | str, overrides: dict[str, Any] | None = None, preset: str | None = None,
                  device: str | torch.device | None = None, cache_dir: Path | str | None = "default", label: str | None = None,
                  progress: bool = True, plot: bool = True, resume: bool = False, jobs: int = 1, stop_after_steps: int | None = None,
                  autotune: str | None = None, config: str | Path | None = None, recipe: dict | None = None) -> dict:
    """Run ``task`` (``"mqar"``, ``"mad"``, ``"copying"``, ``"state_tracking"``) for one model.

    ``overrides`` are ``--set`` style (``{"lrs": "1e-3", "model.hidden_size": 64,
    "position_type": "rope"}``; unknown keys raise ValueError), applied over the settings of the
    ``config`` file, if any (``srope synth --config``: :func:`resolve_run`), which are applied over
    the preset (``preset``, else the file's, else the task's default). ``cache_dir="default"`` uses
    ``$SROPE_CACHE`` or ``~/.cache/srope``; ``None`` keeps data in memory only. Returns the
    results dict that is also written to ``out/results.json``.

    The call holds ``out`` as ``srope train`` holds its run folder (:mod:`srope.lab.train.run_folder`):
    a second call into it while this one runs is refused, naming the holder's pid, and changes
    nothing there. ``out`` must be new or empty unless ``resume``: then the sweep in ``out`` continues with
    the same settings (a difference raises ValueError naming it): its finished runs are
    kept, the runs in progress continue from their checkpoints (``out/runs/NAME/``), and
    the result equals that of a sweep never stopped, bitwise. ``jobs`` runs that many runs
    at once in worker processes (:mod:`srope.lab.tasks.parallel`), with the same results.
    ``stop_after_steps`` ends this call after about that many optimiser steps, with
    checkpoints, and returns the partial results (``"complete": False``); a SIGINT or
    SIGTERM ends it after the step in progress the same way and raises
    ``srope.lab.train.stops.StopRequested``. ``autotune`` (``"full"`` or ``"first"``; default
    ``$SROPE_AUTOTUNE`` or full) is how much Triton autotunes (:mod:`srope.lab.tasks.autotune`).
    Each call appends its provenance (:func:`srope.lab.provenance.record`, with the autotune
    mode) to ``results["provenance"]``. ``recipe`` (``{"name", "arm", "version"}``: what
    ``srope synth --recipe`` runs, :meth:`srope.lab.recipes.Recipe.record`) is recorded as
    ``results["recipe"]``; resuming a recipe's sweep under another recipe, arm or version is
    refused like a changed setting (a sweep begun without a recipe may resume under one whose
    settings it has).
    """
    from srope.lab.tasks import autotune as autotuning

    autotune = autotuning.apply(autotune)
    preset_name, cfg = resolve_run(task, preset, overrides, config)
    module = check_task(task).load()
    for name, value in (("jobs", jobs), ("stop_after_steps", stop_after_steps)):
        if (value is not None or name == "jobs") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is visible")
    if cfg.cuda_graph == "on" and dev.type != "cuda":
        raise ValueError(f"cuda_graph='on' needs a CUDA device, got {dev}")
    if jobs > 1:
        from srope.lab.tasks.parallel import check_picklable

        check_picklable(model_factory, jobs)
    if plot:
        from srope.lab import plotting

        plotting.require("srope synth's plots (or call run_synthetic(..., plot=False))")  # before the runs, not after
    cache = default_cache_dir() if cache_dir == "default" else cache_dir
    out = Path(out)
    with RunFolder(out) as folder:  # one sweep per folder: a second start into it is refused, naming the holder
        try:
            results = _previous_results(out, task, preset_name, cfg, resume, recipe)
        except Exception:
            if folder.created:
                shutil.rmtree(folder.created_root, ignore_errors=True)
            raise
        if results is not None and results.get("complete"):
            return results
        # On the CPU a worker of a concurrent sweep runs on one thread: see srope.lab.tasks.parallel.
        threads = getattr(cfg, "threads", 0) or (0 if jobs == 1 else 1 if dev.type == "cpu" else max(1, (os.cpu_count() or 1) // jobs))
        try:
            with cpu_threads(threads if jobs == 1 else 0, dev):
                if results is None:
                    results = {
                        "task": task, "preset": preset_name, "label": label or default_label(cfg), "mixer": cfg.mixer, "position_type": cfg.position_type,
                        "overrides": {k: str(v) for k, v in (overrides or {}).items()}, "recipe": recipe, "config": cfg.to_dict(),
                        "release_differences": release.differences(module, preset_name, cfg),
                        "settings": [dataclasses.asdict(s) for s in module.settings(cfg)], **provenance.environment(dev), "complete": False, "runs": [], "provenance": [],
                    }  # fmt: skip
                    if jobs > 1:
                        results["threads"] = threads
                else:
                    if label is not None:
                        results["label"] = label
                    if recipe is not None:
                        results["recipe"] = recipe
                return _sweep(task, module, cfg, model_factory, out, results, dev, cache, progress, plot, resume, jobs, threads, stop_after_steps, autotune)
        except Exception:
            if not resume and not _has_progress(out):  # a failed start leaves nothing behind (the lock says nobody else wrote here)
                if folder.created:
                    shutil.rmtree(folder.created_root, ignore_errors=True)
                else:
                    (out / RESULTS_FILE).unlink(missing_ok=True)
                    shutil.rmtree(out / RUNS_DIR, ignore_errors=True)
            raise


def _recipe_text(recipe: dict | None) -> str:
    if recipe is None:
        return "(none)"
    return f"{recipe['name']}{':' + recipe['arm'] if recipe.get('arm') else ''} version {recipe['version']}"


def _previous_results(out: Path, task: str, preset_name: str, cfg, resume: bool, recipe: dict | None = None) -> dict | None:
    """The results of the sweep in ``out`` to continue (``resume``), or None to start one;
    refuses to start over a sweep, and to resume nothing or with other settings."""
    path = out / RESULTS_FILE
    if not resume:
        if path.exists() or (out / RUNS_DIR).exists():
            raise FileExistsError(f"{out} already holds a srope synth run: pass --resume to continue it, or choose another --out")
        return None
    if not path.exists():
        raise FileNotFoundError(f"--resume: {out} holds no {RESULTS_FILE} of a srope synth run to continue; start without --resume")
    try:
        results = json.loads(path.read_text())
        before = {"task": results["task"], "preset": results["preset"], **results["config"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--resume: {path} is not the results of a srope synth run ({type(error).__name__}: {error})") from None
    now = {"task": task, "preset": preset_name, **cfg.to_dict()}
    # a setting added after the run started ran as its default then
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    before = {**defaults, **recorded_settings(before)}
    changed = [f"{key} {before.get(key, '(unset)')!r} -> {now.get(key, '(unset)')!r}"
               for key in dict.fromkeys([*before, *now]) if key not in RESUME_MAY_CHANGE and before.get(key) != now.get(key)]
    if recipe is not None and results.get("recipe") is not None and results["recipe"] != recipe:
        changed.append(f"recipe {_recipe_text(results['recipe'])} -> {_recipe_text(recipe)}")
    if changed:
        raise ValueError(f"--resume: settings differ from the run in {out} (the run's -> now): {'; '.join(changed)}; resume with the same settings or choose another --out")
    return results


def _has_progress(out: Path) -> bool:
    """Whether a sweep in ``out`` finished a run or wrote a checkpoint."""
    try:
        finished = json.loads((out / RESULTS_FILE).read_text()).get("runs")
    except (OSError, ValueError):
        finished = None
    return bool(finished) or any(latest_checkpoint(run) is not None for run in (out / RUNS_DIR).glob("*"))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: what :func:`run_one` needs, picklable for a worker process."""

    index: int  # in grid order: settings, then learning rates, weight decays, seeds
    task: str
    cfg: Any
    setting: Setting
    cache: Path | str | None
    lr: float
    weight_decay: float
    seed: int
    run_dir: Path  # its checkpoints, and its weights with save_weights

    @property
    def key(self) -> tuple:
        return (self.setting.name, self.lr, self.weight_decay, self.seed)


def _record_key(record: dict) -> tuple:
    return (record["setting"], record["lr"], record["weight_decay"], record["seed"])


def run_name(index: int, setting: str, lr: float, weight_decay: float, seed: int) -> str:
    """The run's folder name under ``DIR/runs``: its grid index, then its setting and point."""
    return f"{index:04d}-{re.sub(r'[^A-Za-z0-9.=_-]+', '_', setting)}-lr{lr:g}-wd{weight_decay:g}-seed{seed}"


def run_one(spec: RunSpec, model_factory: ModelFactory, device: torch.device, control, prepared_by_setting: dict, progress: bool) -> dict | None:
    """Train ``spec`` (continuing from its checkpoint if it has one); its setting's data is
    prepared once and kept in ``prepared_by_setting`` for the runs that follow."""
    prepared = prepared_by_setting.get(spec.setting.name)
    if prepared is None:
        prepared_by_setting.clear()
        prepared = prepared_by_setting[spec.setting.name] = get_task(spec.task).prepare(spec.cfg, spec.setting, spec.cache)
    try:
        return train_run(spec.task, spec.cfg, spec.setting, prepared, model_factory, lr=spec.lr, weight_decay=spec.weight_decay, seed=spec.seed,
                         device=device, progress=progress, run_dir=spec.run_dir, control=control)
    finally:
        _release_run_memory(device)


def _release_run_memory(device: torch.device) -> None:
    """Free a finished run's model, optimiser and CUDA graph before the next run starts.

    A model caught in a reference cycle (torch.fx.wrap leaves one through the frames of a
    first import) lives until the garbage collector's rare full pass, and with it the
    run's captured step and its memory pool: the next seed of a sweep then found the GPU
    full, could not capture its step and trained eagerly, or ran out of memory. The cached
    blocks go back to the device too, for the other processes that share it."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def cpu_threads(threads: int, device: torch.device):
    """On the CPU, run torch with ``threads`` threads (0: leave its setting), then restore it.

    The small models of the ``cpu`` presets are chains of small ops that a second thread
    barely speeds up, and while another process holds a core, threads that wait for each
    other make every op slow (on a 2-core machine with one core busy, a small model's step
    is about 40-100x slower on two threads than on one).
    """
    if not threads or device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sweep(task, module, cfg, model_factory, out, results, dev, cache, progress, plot, resume, jobs, threads, stop_after_steps, autotune) -> dict:
    """The sweep of :func:`run_synthetic` once its arguments are resolved and checked."""

    specs, grid = [], [(lr, wd, seed) for lr in cfg.lrs for wd in cfg.weight_decays for seed in cfg.seeds]
    for setting in module.settings(cfg):
        for lr, wd, seed in grid:
            specs.append(RunSpec(len(specs), task, cfg, setting, cache, lr, wd, seed, out / RUNS_DIR / run_name(len(specs), setting.name, lr, wd, seed)))
    done = {_record_key(record): record for record in results["runs"]}
    pending = [spec for spec in specs if spec.key not in done]
    began = time.perf_counter()
    call = provenance.record(seeds=list(cfg.seeds), device=str(dev), wall_s=0.0, jobs=jobs, threads=threads or torch.get_num_threads(), resumed=resume,
                             autotune=autotune)
    results.setdefault("provenance", []).append(call)
    outer = tqdm(total=len(specs), initial=len(specs) - len(pending), desc=f"{task} {results['label']}", disable=not progress, dynamic_ncols=True)

    def write() -> None:
        call["wall_s"] = round(time.perf_counter() - began, 3)
        results["runs"] = [done[spec.key] for spec in specs if spec.key in done]
        results["seconds"] = round(sum(p.get("wall_s", 0.0) for p in results["provenance"]), 3)
        _write(out, results)

    def finished(spec: RunSpec, record: dict) -> None:
        done[spec.key] = record
        write()
        shutil.rmtree(spec.run_dir / "checkpoints", ignore_errors=True)  # only once results.json holds the record
        (spec.run_dir / EVALUATIONS_FILE).unlink(missing_ok=True)
        _remove_if_empty(spec.run_dir)
        outer.update(1)
        outer.set_postfix(score=f"{record['score']:.3f}")

    write()  # from the first moment, so that --resume finds the sweep
    signum = None
    if pending and jobs == 1:
        signum = _run_here(pending, model_factory, dev, stop_after_steps, finished, progress)
    elif pending:
        from srope.lab.tasks.parallel import run_pool

        signum = run_pool(run_one, pending, model_factory, dev, jobs=jobs, threads=threads, stop_after_steps=stop_after_steps, on_done=finished, say=_say)
    outer.close()
    if len(done) < len(specs):
        write()
        message = f"{len(done)} of {len(specs)} runs done, the runs in progress checkpointed under {out / RUNS_DIR}; continue with --resume"
        if signum is not None:
            from srope.lab.train.stops import StopRequested

            raise StopRequested(signum, f"stopped by {signal.Signals(signum).name}: {message}")
        results["stopped"] = f"stopped after --stop-after-steps {stop_after_steps}: {message}"
        return results
    results.pop("stopped", None)
    results["summary"] = summarize(results["runs"])
    if hasattr(module, "aggregate"):
        results["aggregate"] = module.aggregate(results["summary"])
    results["complete"] = True
    write()
    _remove_if_empty(out / RUNS_DIR)
    if plot:
        from srope.lab.tasks.sweep_plots import plot_loss_curves, plot_results

        plot_results(results, out / PLOT_FILE)
        plot_loss_curves(results, out / LOSS_PLOT_FILE)
    return results


def _run_here(specs: list[RunSpec], model_factory, device, stop_after_steps, finished, progress) -> int | None:
    """The sweep's runs one after another in this process; the number of the signal that stopped it, or None."""
    from srope.lab.train.stops import StopSignals

    prepared: dict = {}
    with StopSignals(_say) as signals:
        control = LocalControl(signals, stop_after_steps)
        for spec in specs:
            if control.requested():
                break
            record = run_one(spec, model_factory, device, control, prepared, progress)
            if record is None:
                break
            finished(spec, record)
    return signals.signum


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def _write(out: Path, results: dict) -> None:
    _write_json(out / RESULTS_FILE, results)


def report(dirs) -> str:
    """Markdown tables of the runs in ``dirs``, one row per folder (:func:`srope.lab.report.folders.folder_tables`)."""
    from srope.lab.report.folders import folder_tables

    return folder_tables(dirs)
