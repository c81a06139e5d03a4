"""Train and evaluate one configuration of a synthetic task, with its sweep, and write results.

``run_synthetic(task, model_factory, out=DIR, overrides={...})`` resolves the task's preset,
then for every setting x learning rate x weight decay x seed builds a fresh model with
``model_factory(request)`` (:class:`srope.tasks.common.ModelRequest`), trains it with the
protocol's optimiser, schedule and early stopping, evaluates it, and writes
``DIR/results.json`` (after every run, so partial sweeps survive) and ``DIR/results.png``.

The training loop (one function, :func:`train_run`) is shared by every task: AdamW over all
parameters (the protocols decay every weight), cross-entropy on the targets that are not
``IGNORE``, bf16 autocast on CUDA (float32 elsewhere), optional gradient clipping, the
learning rate set each step from the schedule, an evaluation after every epoch, and the
stopping rule of the preset (see :class:`srope.tasks.common.TrainConfig`). A preset's
``threads`` (0: torch's default; the ``cpu`` presets: 1) sets torch's CPU threads for the run.

Summary: for every setting the optimiser point (lr, weight decay) with the best mean score
over seeds is chosen (MAD's "best over the grid"); its mean, spread and curves are reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from srope.tasks import copying, mad, mqar, state_tracking
from srope.tasks.common import IGNORE, ModelRequest, Prepared, Setting, apply_overrides, default_cache_dir, preset_dict, rng_for

TASKS = {"mqar": mqar, "mad": mad, "copying": copying, "state_tracking": state_tracking}
ModelFactory = Callable[[ModelRequest], nn.Module]
RESULTS_FILE, PLOT_FILE = "results.json", "results.png"


def get_task(name: str):
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def preset_names(task: str) -> list[str]:
    """The task's preset names, its default first."""
    module = get_task(task)
    return [module.DEFAULT_PRESET, *(name for name in module.PRESETS if name != module.DEFAULT_PRESET)]


def presets_line(task: str) -> str:
    """One line naming the task's presets, for ``srope synth TASK --dry-run`` to print."""
    default, *others = preset_names(task)
    return f"presets for {task}: {default} (default){''.join(', ' + name for name in others)}; pick one with --preset NAME"


def resolve_preset(task: str, preset: str | None = None, overrides: dict[str, Any] | None = None):
    """The task's preset (``None``: its default) with ``overrides`` applied and checked."""
    module = get_task(task)
    name = module.DEFAULT_PRESET if preset is None else preset
    if name not in module.PRESETS:
        raise ValueError(f"unknown preset {name!r} for {task}; choose one of {', '.join(preset_names(task))}")
    cfg = apply_overrides(module.PRESETS[name], overrides)
    module.check(cfg)
    if getattr(cfg, "threads", 0) < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's default), got {cfg.threads}")
    return cfg


def model_request(task: str, cfg, setting: Setting) -> ModelRequest:
    position = {"type": cfg.position_type, **cfg.position.get(cfg.position_type, {})}
    return ModelRequest(task=task, setting=setting.name, vocab_size=setting.vocab_size, max_len=setting.max_len, mixer=cfg.mixer,
                        model={**cfg.model, **setting.model}, position=position)


def as_logits(output: Any) -> torch.Tensor:
    """A model's logits: the output itself, its ``.logits``, or ``output["logits"]``."""
    if isinstance(output, torch.Tensor):
        return output
    if getattr(output, "logits", None) is not None:
        return output.logits
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    raise TypeError(f"the model must return logits (a tensor or an output with .logits), got {type(output).__name__}")


def learning_rate(cfg, base: float, step: int, total: int, epoch: int, epochs: int) -> float:
    """The schedule's learning rate for optimiser step ``step`` (0-based) of ``total``."""
    if cfg.schedule == "constant":
        return base
    if cfg.schedule == "cosine":
        return cfg.min_lr + (base - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * step / total))
    if cfg.schedule == "cosine_epoch":
        return cfg.min_lr + (base - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    if cfg.schedule == "linear_warmup":  # transformers' get_linear_schedule_with_warmup
        warm = int(cfg.warmup * total)
        factor = step / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
        return base * factor
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "curves"}


def train_run(task: str, cfg, setting: Setting, prepared: Prepared, model_factory: ModelFactory, *, lr: float, weight_decay: float,
              seed: int, device: torch.device, progress: bool = True) -> dict:
    """Train one model on one setting with one optimiser point and seed; return its record."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = model_factory(model_request(task, cfg, setting))
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_factory must return an nn.Module, got {type(model).__name__}")
    model.to(device)
    if prepared.wrap_model is not None:
        model = prepared.wrap_model(model).to(device)
    vocab = setting.vocab_size

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        logits = as_logits(model(x))
        if logits.dim() != 3 or logits.shape[:2] != x.shape or logits.shape[-1] < vocab:
            raise ValueError(f"logits must be [B, T, >= {vocab}] for input {tuple(x.shape)}, got {tuple(logits.shape)}")
        return logits[..., :vocab]

    def predict(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), _autocast(device):
            return logits_of(x.to(device)).argmax(-1).cpu()

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=weight_decay)
    per_epoch = prepared.train.steps_per_epoch
    total = per_epoch * cfg.epochs
    for cap in (prepared.total_steps, cfg.max_steps):
        total = total if cap is None else min(total, cap)
    epochs = math.ceil(total / per_epoch)
    shuffle_rng = rng_for(seed, "shuffle", task, setting.name)
    history, best, last = [], None, None
    since_best, step, stopped, diverged = 0, 0, None, False
    bar = tqdm(total=total, desc=f"{setting.name} lr={lr:g} wd={weight_decay:g} seed={seed}", disable=not progress, leave=False, dynamic_ncols=True)
    for epoch in range(epochs):
        model.train()
        loss_sum, loss_count = torch.zeros((), device=device), 0
        for x_np, y_np in prepared.train.epoch(epoch, shuffle_rng):
            if step >= total:
                break
            x, y = torch.as_tensor(x_np, device=device), torch.as_tensor(y_np, device=device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(cfg, lr, step, total, epoch, epochs)
            with _autocast(device):
                logits = logits_of(x)
            # mean over the scored positions (a batch without any gives 0, not NaN)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1), ignore_index=IGNORE, reduction="sum") / (y != IGNORE).sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            loss_sum += loss.detach()
            loss_count += 1
            step += 1
            bar.update(1)
            if step % 50 == 0:  # synchronise with the device only now and then
                mean_loss = float(loss_sum) / loss_count
                if not math.isfinite(mean_loss):
                    break
                bar.set_postfix(loss=f"{mean_loss:.4f}", score=f"{last['score']:.3f}" if last else "-")
        mean_loss = float(loss_sum) / loss_count if loss_count else None
        if mean_loss is not None and not math.isfinite(mean_loss):
            diverged, stopped, mean_loss = True, "diverged", None
        model.eval()
        last = prepared.evaluate(predict)
        history.append({"epoch": epoch + 1, "step": step, "train_loss": mean_loss, "score": last["score"]})
        if best is None or last["score"] > best["score"]:
            best, since_best = last, 0
        else:
            since_best += 1
        if diverged:
            break
        if cfg.stop_at is not None and (last["score"] >= cfg.stop_at if cfg.stop_inclusive else last["score"] > cfg.stop_at):
            stopped = "threshold"
            break
        if cfg.patience is not None and since_best >= cfg.patience:
            stopped = "patience"
            break
    bar.close()
    chosen = best if cfg.select == "best" else last
    return {
        "setting": setting.name, "group": setting.group, "x": setting.x, "lr": lr, "weight_decay": weight_decay, "seed": seed,
        "score": chosen["score"], "metrics": chosen, "final": _scalars(last), "best": _scalars(best),
        "steps": step, "planned_steps": total, "epochs": len(history), "stopped": stopped, "diverged": diverged,
        "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(time.perf_counter() - start, 3), "history": history,
    }


def _curve_stats(records: list[dict]) -> dict:
    out = {}
    for name, first in records[0]["metrics"].get("curves", {}).items():
        ys = np.array([r["metrics"]["curves"][name]["y"] for r in records], dtype=np.float64)
        out[name] = {"x": first["x"], "mean": ys.mean(0).tolist(), "min": ys.min(0).tolist(), "max": ys.max(0).tolist()}
    return out


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per setting: the optimiser point with the best mean score over seeds, and its stats."""
    by_setting: dict[str, dict[tuple, list[dict]]] = {}
    for run in runs:
        by_setting.setdefault(run["setting"], {}).setdefault((run["lr"], run["weight_decay"]), []).append(run)
    summary = {}
    for name, grid in by_setting.items():
        means = {point: float(np.mean([r["score"] for r in recs])) for point, recs in grid.items()}
        point = max(means, key=means.get)
        recs = grid[point]
        scores = [r["score"] for r in recs]
        scalar_keys = [k for k, v in recs[0]["metrics"].items() if k != "curves" and isinstance(v, (int, float))]
        summary[name] = {
            "group": recs[0]["group"], "x": recs[0]["x"], "lr": point[0], "weight_decay": point[1],
            "score_mean": float(np.mean(scores)), "score_std": float(np.std(scores)), "scores": scores, "seeds": [r["seed"] for r in recs],
            "scalars": {k: float(np.mean([r["metrics"][k] for r in recs])) for k in scalar_keys},
            "curves": _curve_stats(recs),
            "grid": [{"lr": p[0], "weight_decay": p[1], "score_mean": m} for p, m in sorted(means.items())],
        }
    return summary


def environment(device: torch.device) -> dict:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for package in ("srope", "triton", "flash-linear-attention", "fla-core", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"device": str(device), "device_name": name, "threads": torch.get_num_threads(), "versions": versions}


def default_label(cfg) -> str:
    label = f"{cfg.mixer}/{cfg.position_type}"
    if cfg.position_type == "selective_rope":
        opts = cfg.position.get("selective_rope", {})
        label += "+gate" if opts.get("gate") else ""
        label += "+bias" if opts.get("bias") else ""
    return label


def run_synthetic(task: str, model_factory: ModelFactory, *, out: Path | str, overrides: dict[str, Any] | None = None, preset: str | None = None,
                  device: str | torch.device | None = None, cache_dir: Path | str | None = "default", label: str | None = None,
                  progress: bool = True, plot: bool = True) -> dict:
    """Run ``task`` (``"mqar"``, ``"mad"``, ``"copying"``, ``"state_tracking"``) for one model.

    ``overrides`` are ``--set`` style (``{"lrs": "1e-3", "model.hidden_size": 64,
    "position_type": "rope"}``; unknown keys raise ValueError). ``cache_dir="default"`` uses
    ``$SROPE_CACHE`` or ``~/.cache/srope``; ``None`` keeps data in memory only. Returns the
    results dict that is also written to ``out/results.json``.
    """
    module = get_task(task)
    preset_name = module.DEFAULT_PRESET if preset is None else preset
    cfg = resolve_preset(task, preset_name, overrides)
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is visible")
    cache = default_cache_dir() if cache_dir == "default" else cache_dir
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with cpu_threads(getattr(cfg, "threads", 0), dev):
        return _run(task, module, preset_name, cfg, model_factory, out, overrides, dev, cache, label, progress, plot)


@contextlib.contextmanager
def cpu_threads(threads: int, device: torch.device):
    """On the CPU, run torch with ``threads`` threads (0: leave its setting), then restore it.

    The small models of the ``cpu`` presets are chains of small ops that a second thread
    barely speeds up, and while another process holds a core, threads that wait for each
    other make every op slow: on a 2-core machine with one core busy, one training step
    of a one-layer GLA of width 32 took about 23 ms on one thread and 0.9-2.3 s on two.
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


def _run(task, module, preset_name, cfg, model_factory, out, overrides, dev, cache, label, progress, plot) -> dict:
    """The sweep of :func:`run_synthetic` once its arguments are resolved."""
    settings = module.settings(cfg)
    results: dict[str, Any] = {
        "task": task, "preset": preset_name, "label": label or default_label(cfg), "mixer": cfg.mixer, "position_type": cfg.position_type,
        "overrides": {k: str(v) for k, v in (overrides or {}).items()}, "config": preset_dict(cfg),
        "settings": [dataclasses.asdict(s) for s in settings], **environment(dev), "complete": False, "runs": [],
    }
    start = time.perf_counter()
    grid = [(lr, wd, seed) for lr in cfg.lrs for wd in cfg.weight_decays for seed in cfg.seeds]
    outer = tqdm(total=len(settings) * len(grid), desc=f"{task} {results['label']}", disable=not progress, dynamic_ncols=True)
    for setting in settings:
        prepared = module.prepare(cfg, setting, cache)
        for lr, wd, seed in grid:
            record = train_run(task, cfg, setting, prepared, model_factory, lr=lr, weight_decay=wd, seed=seed, device=dev, progress=progress)
            results["runs"].append(record)
            results["seconds"] = round(time.perf_counter() - start, 3)
            _write(out, results)
            outer.update(1)
            outer.set_postfix(score=f"{record['score']:.3f}")
    outer.close()
    results["summary"] = summarize(results["runs"])
    if hasattr(module, "aggregate"):
        results["aggregate"] = module.aggregate(results["summary"])
    results["complete"] = True
    results["seconds"] = round(time.perf_counter() - start, 3)
    _write(out, results)
    if plot:
        from srope.tasks.report import plot_results

        plot_results(results, out / PLOT_FILE)
    return results


def _write(out: Path, results: dict) -> None:
    tmp = out / (RESULTS_FILE + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / RESULTS_FILE)


def report(dirs) -> str:
    """Markdown tables comparing the runs in ``dirs`` (see :func:`srope.tasks.report.report`)."""
    from srope.tasks.report import report as _report

    return _report(dirs)
