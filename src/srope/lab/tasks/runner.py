"""Train and evaluate one configuration of a synthetic task, with its sweep, and write results.

``run_synthetic(task, model_factory, out=DIR, overrides={...})`` resolves the task's preset,
then for every setting x learning rate x weight decay x seed builds a fresh model with
``model_factory(request)`` (:class:`srope.lab.tasks.common.ModelRequest`), trains it with the
protocol's optimiser, schedule and early stopping, evaluates it, and writes
``DIR/results.json`` (after every run, so partial sweeps survive) and ``DIR/results.png``.

The training loop (one function, :func:`train_run`) is shared by every task: AdamW over all
parameters (the protocols decay every weight), cross-entropy on the targets that are not
``IGNORE``, bf16 autocast on CUDA (float32 elsewhere), optional gradient clipping, the
learning rate set each step from the schedule, an evaluation after every epoch, and the
stopping rule of the preset (see :class:`srope.lab.tasks.common.TaskConfig`). A preset's
``threads`` (0: torch's default; the ``cpu`` presets: 1) sets torch's CPU threads for the run.

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
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from srope.lab import provenance
from srope.lab.graphed import graphed_optimizer_step
from srope.lab.loop import optimizer_step, train_steps
from srope.lab.schedule import task_schedule
from srope.lab.train.optim import adamw
from srope.lab.tasks import numerics, release
from srope.lab.config import apply_config_file, apply_overrides, read_config_file
from srope.lab.tasks.numerics import autocast
from srope.lab.tasks.common import IGNORE, ModelRequest, Prepared, Setting, default_cache_dir, rng_for
from srope.lab.tasks.parallel import LocalControl
from srope.lab.tasks.registry import check_task
from srope.lab.tasks.summary import summarize
from srope.lab.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, remove_unfinished, save_checkpoint, usable_checkpoint
from srope.lab.train.distributed import World
from srope.lab.train.run_folder import RunFolder
from srope.registry import model_presets

ModelFactory = Callable[[ModelRequest], nn.Module]
RESULTS_FILE, PLOT_FILE, RUNS_DIR, WEIGHTS_FILE = "results.json", "results.png", "runs", "model.safetensors"
LOSS_PLOT_FILE = "loss.png"
# A run in progress: its evaluations so far, beside (not in) its checkpoints, so that output packed
# without the checkpoints still shows where a run cut off by a timeout or a lost machine had got to.
EVALUATIONS_FILE = "evaluations.json"
# What a run's checkpoint state must hold (name: type), checked on load.
_STATE_FIELDS = {"run": dict, "epoch": int, "position": int, "rng_epoch": dict, "rng_now": dict, "loss_sum": (int, float), "loss_count": int,
                 "history": list, "since_best": int, "seconds": (int, float)}  # fmt: skip
# Settings a resumed sweep may change: they change no number it computes.
RESUME_MAY_CHANGE = frozenset({"checkpoint_every", "save_weights"})
# What a run whose results.json predates a setting ran with, where that is not the setting's
# default today (cuda_graph's and head_at_targets' were "off" until they were checked and measured).
SETTINGS_BEFORE_THEY_EXISTED = {"cuda_graph": "off", "head_at_targets": "off"}
# Values a setting was once recorded as, and what they are called now.
RENAMED_VALUES = {"head_at_targets": {True: "on", False: "off"}}
# The most logits an evaluation computes in one forward pass (1 GiB as float32): larger test
# batches run in parts, whose predictions are the same. MQAR's 256 x 512 x 8,192 (2 GiB in bf16,
# twice that as float32) ran concurrent runs on one GPU out of memory.
EVAL_LOGITS = 1 << 28


def get_task(name: str):
    """The module of synthetic task ``name`` (:data:`srope.lab.tasks.registry.tasks`)."""
    return check_task(name).load()


def preset_names(task: str) -> list[str]:
    """The task's preset names, its default first."""
    return list(check_task(task).presets)


def presets_line(task: str) -> str:
    """One line naming the task's presets, for ``srope synth TASK --dry-run`` to print."""
    default, *others = preset_names(task)
    return f"presets for {task}: {default} (default){''.join(', ' + name for name in others)}; pick one with --preset NAME"


def resolve_preset(task: str, preset: str | None = None, overrides: dict[str, Any] | None = None, config: str | Path | None = None):
    """The task's preset with ``overrides`` applied and checked (:func:`resolve_run`)."""
    return resolve_run(task, preset, overrides, config)[1]


def resolve_run(task: str, preset: str | None = None, overrides: dict[str, Any] | None = None, config: str | Path | None = None) -> tuple[str, Any]:
    """The preset's name and the run's settings: the task's preset (``preset``, else the one
    the ``config`` file names, else the task's default) < the ``config`` file's settings
    (:func:`read_synth_config`) < ``overrides``, checked."""
    file_preset, settings = (None, {}) if config is None else read_synth_config(config, task)
    entry = check_task(task, preset or file_preset)
    name = preset or file_preset or entry.default_preset
    module = entry.load()
    cfg = module.PRESETS[name] if config is None else apply_config_file(module.PRESETS[name], settings, config)
    cfg = apply_overrides(cfg, overrides)
    module.check(cfg)
    if getattr(cfg, "threads", 0) < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's default), got {cfg.threads}")
    return name, cfg


def read_synth_config(path: str | Path, task: str) -> tuple[str | None, dict[str, Any]]:
    """The preset (None if it names none) and the settings of ``srope synth TASK --config FILE``:
    a sweep's ``results.json`` (its ``task``, ``preset`` and ``config``) or a JSON/TOML object of
    the task's settings, with ``task`` and ``preset`` optional. A file of another task or of
    ``srope train`` raises naming it."""
    values = read_config_file(path)
    if isinstance(values.get("config"), dict) and "runs" in values:  # a sweep's record
        values = {"task": values.get("task"), "preset": values.get("preset"), **recorded_settings(values["config"])}
    preset = values.pop("preset", None)
    if "task" not in values and isinstance(preset, str) and preset in model_presets:
        raise ValueError(f"--config {path}: a srope train config (preset {preset!r}), not srope synth's; give it to srope train --config")
    kind = values.pop("task", task)
    if kind != task:
        raise ValueError(f"--config {path}: a config of srope synth {kind}, not {task}")
    try:
        check_task(task, preset)
    except ValueError as error:
        raise ValueError(f"--config {path}: {error}") from None
    return preset, values


def recorded_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` config as today's settings: one added since ran as
    ``SETTINGS_BEFORE_THEY_EXISTED`` says, a value recorded under an older name has its new one."""
    config = {**SETTINGS_BEFORE_THEY_EXISTED, **config}
    config.update({key: names.get(config[key], config[key]) for key, names in RENAMED_VALUES.items() if key in config})
    return config


def model_request(task: str, cfg, setting: Setting) -> ModelRequest:
    position = {"type": cfg.position_type, **cfg.position.get(cfg.position_type, {})}
    return ModelRequest(task=task, setting=setting.name, vocab_size=setting.vocab_size, max_len=setting.max_len, mixer=cfg.mixer,
                        model={**cfg.model, **setting.model}, position=position, architecture=cfg.architecture)


def as_logits(output: Any) -> torch.Tensor:
    """A model's logits: the output itself, its ``.logits``, or ``output["logits"]``."""
    if isinstance(output, torch.Tensor):
        return output
    if getattr(output, "logits", None) is not None:
        return output.logits
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    raise TypeError(f"the model must return logits (a tensor or an output with .logits), got {type(output).__name__}")


def task_logits(model: nn.Module, x: torch.Tensor, vocab: int) -> torch.Tensor:
    """The model's logits for ``x [B, T]``, cut to the task's ``vocab``."""
    logits = as_logits(model(x))
    if logits.dim() != 3 or logits.shape[:2] != x.shape or logits.shape[-1] < vocab:
        raise ValueError(f"logits must be [B, T, >= {vocab}] for input {tuple(x.shape)}, got {tuple(logits.shape)}")
    return logits[..., :vocab]


def head_at_targets(cfg, task: str, model: nn.Module, device: torch.device) -> bool:
    """Whether the training loss runs the head at the scored positions only (``cfg.head_at_targets``;
    ``on`` with a model without ``.model`` and ``.lm_head`` raises)."""
    has_head = all(isinstance(getattr(model, name, None), nn.Module) for name in ("model", "lm_head"))
    if cfg.head_at_targets == "on" and not has_head:
        raise ValueError(f"head_at_targets needs a model with .model (its body, returning last_hidden_state) and .lm_head, as SRopeForCausalLM; "
                         f"got {type(model).__name__}")  # fmt: skip
    if cfg.head_at_targets == "auto":
        return has_head and device.type == "cuda" and getattr(get_task(task), "FEW_TARGETS", False)
    return cfg.head_at_targets == "on"


def task_loss(model: nn.Module, vocab: int, device: torch.device, precision: str = "autocast") -> Callable[..., torch.Tensor]:
    """The runner's training loss ``loss(x, y, scored=None)``: the mean cross-entropy over the
    scored positions (a batch without any gives 0, not NaN), under bf16 autocast on CUDA unless
    ``precision`` is ``"float32"`` (:mod:`srope.lab.tasks.numerics`).
    With ``scored`` (the flat indices of the positions that have targets) the head runs at
    those positions only: the same mean, without the other positions' logits."""

    def loss(x: torch.Tensor, y: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
        if scored is None:
            with autocast(device, precision):
                logits = task_logits(model, x, vocab)
            return F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1), ignore_index=IGNORE, reduction="sum") / (y != IGNORE).sum().clamp(min=1)
        with autocast(device, precision):
            hidden = model.model(x).last_hidden_state.flatten(0, 1).index_select(0, scored)
            logits = model.lm_head(hidden)[:, :vocab]
        return F.cross_entropy(logits.float(), y.reshape(-1).index_select(0, scored), reduction="sum") / max(int(scored.numel()), 1)

    return loss


def scored_positions(targets: np.ndarray, device: torch.device) -> torch.Tensor:
    """The flat indices of the positions that have targets, from the batch's host copy (so
    nothing waits on the device)."""
    return torch.as_tensor(np.flatnonzero(targets.reshape(-1) != IGNORE), device=device)



def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "curves"}


def train_run(task: str, cfg, setting: Setting, prepared: Prepared, model_factory: ModelFactory, *, lr: float, weight_decay: float,
              seed: int, device: torch.device, progress: bool = True, run_dir: Path | str | None = None, control: Any = None) -> dict | None:
    """Train one model on one setting with one optimiser point and seed; return its record.

    With ``run_dir`` the run writes a checkpoint to ``run_dir/checkpoints`` every
    ``cfg.checkpoint_every`` steps and, when it finds one there, continues from the latest
    as if it had never stopped: the weights, the optimiser, torch's RNG states (through
    :mod:`srope.lab.train.checkpoint`), the batch stream's RNG and position in its epoch, the
    epoch's loss sums, the evaluations so far and the stopping rule's counters. With
    ``cfg.save_weights`` the final weights go to ``run_dir/model.safetensors``; the record
    carries their sha256 either way.

    ``control`` (see :mod:`srope.lab.tasks.parallel`) is told of every step and asked after every
    evaluation whether to stop; on a stop the run checkpoints (with ``run_dir``) and
    returns None.
    """
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = model_factory(model_request(task, cfg, setting))
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_factory must return an nn.Module, got {type(model).__name__}")
    numerics.initialise(model, cfg.init)
    model = numerics.store(model, cfg.precision).to(device)
    if prepared.wrap_model is not None:
        model = prepared.wrap_model(model).to(device)
    vocab = setting.vocab_size
    at_targets = head_at_targets(cfg, task, model, device)
    loss_of = task_loss(model, vocab, device, cfg.precision)

    def predict_rows(x: torch.Tensor, targets: torch.Tensor | None):
        with torch.no_grad(), autocast(device, cfg.precision):
            logits = task_logits(model, x.to(device), vocab)
        preds = logits.argmax(-1).cpu()
        if targets is None:
            return preds, 0.0, 0
        targets = targets.to(device)
        nll = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return preds, float(nll), int((targets != IGNORE).sum())

    fitting_rows = None  # set when a forward pass ran out of device memory: the rows that fit since

    def predict(x: torch.Tensor, targets: torch.Tensor | None = None):
        nonlocal fitting_rows
        rows = max(1, EVAL_LOGITS // max(1, x.shape[-1] * vocab))  # the rows of one forward pass
        parts, i = [], 0
        while i < len(x):
            rows = min(rows, fitting_rows or rows, len(x) - i)
            try:
                part = predict_rows(x[i : i + rows], None if targets is None else targets[i : i + rows])
            except torch.OutOfMemoryError:
                if rows == 1:
                    raise
                part = None  # recovered outside the handler, whose traceback holds the failed pass's tensors
            if part is not None:
                parts.append(part)
                i += rows
                continue
            fitting_rows = rows // 2
            if device.type == "cuda":
                torch.cuda.empty_cache()
            warnings.warn(f"evaluation ran out of device memory with {rows} rows of {x.shape[-1]} tokens in one forward pass; "
                          f"continuing with at most {fitting_rows} rows (the same predictions up to rounding)", stacklevel=2)
        preds = torch.cat([p for p, _, _ in parts])
        return preds if targets is None else (preds, sum(n for _, n, _ in parts), sum(c for _, _, c in parts))

    optimizer = adamw([p for p in model.parameters() if p.requires_grad], lr=lr, betas=tuple(cfg.betas), eps=cfg.eps,
                      weight_decay=weight_decay)
    if cfg.cuda_graph != "off" and device.type == "cuda":
        step_fn = graphed_optimizer_step(model, optimizer, loss_of, grad_clip=cfg.grad_clip, strict=cfg.cuda_graph == "on")
    else:
        step_fn = optimizer_step(model, optimizer, loss_of, grad_clip=cfg.grad_clip)
    stream = prepared.train
    per_epoch = stream.steps_per_epoch
    protocol_steps = per_epoch * cfg.epochs if prepared.total_steps is None else min(per_epoch * cfg.epochs, prepared.total_steps)
    total = protocol_steps if cfg.max_steps is None else min(protocol_steps, cfg.max_steps)
    epochs = math.ceil(total / per_epoch)
    shuffle_rng = rng_for(seed, "shuffle", task, setting.name)
    history, best, last, lowest = [], None, None, None  # lowest: the eval of least test loss
    since_best, step, stopped, diverged = 0, 0, None, False
    identity = {"task": task, "setting": setting.name, "lr": lr, "weight_decay": weight_decay, "seed": seed}
    first_epoch, seconds_before, resumed, eval_seconds, graph_steps_before = 0, 0.0, None, 0.0, 0
    curve, window, window_count = [], torch.zeros((), device=device), 0  # the loss curve and the steps since its last point
    run_dir = None if run_dir is None else Path(run_dir)
    if run_dir is not None:
        for stale in remove_unfinished(run_dir):
            _say(f"removed {stale} (a checkpoint whose writing never finished)")
    if run_dir is not None and (latest := usable_checkpoint(run_dir)) is not None:
        resumed = load_checkpoint(latest, model, optimizer, World(), strict_optimizer=False, fields=_STATE_FIELDS)
        if resumed.get("run") != identity:
            raise CheckpointError(f"{latest}: a checkpoint of the run {resumed.get('run')}, not of {identity}; remove it or choose another --out")
        step, first_epoch, seconds_before = resumed["step"], resumed["epoch"], resumed["seconds"]
        eval_seconds, graph_steps_before = resumed.get("eval_seconds", 0.0), resumed.get("graph_steps", 0)
        history, best, last, since_best = resumed["history"], resumed["best"], resumed["last"], resumed["since_best"]
        lowest = resumed.get("lowest")
        curve, window_count = resumed.get("loss_curve", []), resumed.get("window_count", 0)
        window = torch.full((), resumed.get("window_sum", 0.0), device=device)
        # an epoch's order is drawn when it begins; sampled batches are drawn one by one
        shuffle_rng.bit_generator.state = resumed["rng_epoch"] if getattr(stream, "replays_epoch_start", True) else resumed["rng_now"]

    def checkpoint(epoch: int, position: int, rng_epoch: dict, loss_sum: float, loss_count: int) -> None:
        state = {
            "run": identity, "epoch": epoch, "position": position, "rng_epoch": rng_epoch, "rng_now": shuffle_rng.bit_generator.state,
            "loss_sum": loss_sum, "loss_count": loss_count, "history": history, "best": best, "last": last, "since_best": since_best,
            "lowest": lowest, "seconds": seconds_before + time.perf_counter() - start, "eval_seconds": eval_seconds,
            "graph_steps": graph_steps(), "loss_curve": curve, "window_sum": float(window), "window_count": window_count,
        }  # fmt: skip
        save_checkpoint(run_dir, step, model, optimizer, state, World())

    def graph_steps() -> int:  # steps replayed from a CUDA graph: whether cuda_graph="auto" captured
        return graph_steps_before + getattr(step_fn, "replayed", 0)

    max_seconds = getattr(cfg, "max_seconds", None)

    def out_of_time() -> bool:
        return max_seconds is not None and seconds_before + time.perf_counter() - start >= max_seconds

    bar = tqdm(total=total, initial=step, desc=f"{setting.name} lr={lr:g} wd={weight_decay:g} seed={seed}", disable=not progress, leave=False, dynamic_ncols=True)
    for epoch in range(first_epoch, epochs):
        if resumed is not None and epoch == first_epoch:  # the epoch in progress at the checkpoint
            position, rng_epoch, loss_count = resumed["position"], resumed["rng_epoch"], resumed["loss_count"]
            loss_sum = torch.full((), resumed["loss_sum"], device=device)
        else:
            position, rng_epoch, loss_count = 0, shuffle_rng.bit_generator.state, 0
            loss_sum = torch.zeros((), device=device)
        model.train()

        def batches():
            for x_np, y_np in stream.epoch(epoch, shuffle_rng, start=position):
                if step >= total:
                    return
                batch = (torch.as_tensor(x_np, device=device), torch.as_tensor(y_np, device=device))
                if at_targets:
                    batch += (scored_positions(y_np, device),)
                yield step, *batch

        def after(_: int, loss: torch.Tensor) -> str | None:
            nonlocal loss_sum, loss_count, step, position, window, window_count
            loss_sum += loss
            loss_count += 1
            window += loss
            window_count += 1
            step += 1
            position += 1
            bar.update(1)
            if cfg.loss_every and step % cfg.loss_every == 0:
                mean = float(window) / window_count
                curve.append([step, mean if math.isfinite(mean) else None])
                window.zero_()
                window_count = 0
            if step % 50 == 0:  # synchronise with the device only now and then
                mean_loss = float(loss_sum) / loss_count
                if not math.isfinite(mean_loss):
                    return "diverged"
                bar.set_postfix(loss=f"{mean_loss:.4f}", score=f"{last['score']:.3f}" if last else "-")
            stop = control is not None and control.step_done()
            if run_dir is not None and (stop or step % cfg.checkpoint_every == 0):
                checkpoint(epoch, position, rng_epoch, float(loss_sum), loss_count)
            if stop:
                return "control"
            return "time" if out_of_time() else None

        def lr_at(at: int) -> float:
            return task_schedule(cfg.schedule, lr, at, total, epoch=epoch, epochs=epochs, min_lr=cfg.min_lr, warmup=cfg.warmup)

        ended = train_steps(batches(), step_fn, lr_at=lr_at, after=after)
        if ended == "control":
            bar.close()
            return None
        if ended == "time":
            stopped = "time"
        mean_loss = float(loss_sum) / loss_count if loss_count else None
        if mean_loss is not None and not math.isfinite(mean_loss):
            diverged, stopped, mean_loss = True, "diverged", None
        model.eval()
        if progress:
            bar.write(f"evaluating after step {step} ({setting.name} lr={lr:g} wd={weight_decay:g} seed={seed})", file=sys.stderr)
        began = time.perf_counter()
        last = {**prepared.evaluate(predict), "step": step}
        eval_seconds += time.perf_counter() - began
        if device.type == "cuda":
            # the blocks of the evaluation and of the epoch's last, smaller batch (run eagerly,
            # outside a captured step's pool) would stay reserved through the training that
            # follows: memory that other runs sharing the GPU need
            torch.cuda.empty_cache()
        if progress:
            bar.write(f"evaluated after step {step} in {time.perf_counter() - began:.0f} s: score {last['score']:.4f}", file=sys.stderr)
        history.append({"epoch": epoch + 1, "step": step, "train_loss": mean_loss, "score": last["score"], **({"loss": last["loss"]} if "loss" in last else {})})
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            _write_json(run_dir / EVALUATIONS_FILE, {"run": identity, "steps": step, "planned_steps": total, "history": history})
        if best is None or last["score"] >= best["score"]:
            # a tie goes to the later evaluation: a run whose scores are all 0 reports the model
            # it ended with, not its first evaluation; patience counts only improvements
            since_best = 0 if best is None or last["score"] > best["score"] else since_best + 1
            best = last
        else:
            since_best += 1
        if cfg.select == "min_loss":
            if "loss" not in last:
                raise ValueError(f"select='min_loss' needs the task's evaluation to report 'loss'; {task} reports {sorted(last)}")
            if lowest is None or not last["loss"] >= lowest["loss"]:  # a NaN loss is never the lowest, unless the first
                lowest = last
        if diverged or stopped == "time":
            break
        if out_of_time() and epoch + 1 < epochs:
            stopped = "time"
            break
        if cfg.stop_at is not None and (last["score"] >= cfg.stop_at if cfg.stop_inclusive else last["score"] > cfg.stop_at):
            stopped = "threshold"
            break
        if cfg.patience is not None and since_best >= cfg.patience:
            stopped = "patience"
            break
        if control is not None and epoch + 1 < epochs and control.requested():  # a long evaluation may have outlasted a signal
            if run_dir is not None:
                checkpoint(epoch + 1, 0, shuffle_rng.bit_generator.state, 0.0, 0)
            bar.close()
            return None
    bar.close()
    chosen = {"best": best, "final": last, "min_loss": lowest}[cfg.select]
    record = {
        "setting": setting.name, "group": setting.group, "x": setting.x, "lr": lr, "weight_decay": weight_decay, "seed": seed,
        "score": chosen["score"], "metrics": {k: v for k, v in chosen.items() if k != "step"}, "reported_step": chosen.get("step"),
        "final": _scalars(last), "best": _scalars(best),
        **({"min_loss": _scalars(lowest)} if lowest is not None else {}),
        "steps": step, "planned_steps": total, "protocol_steps": protocol_steps, "epochs": len(history), "stopped": stopped, "diverged": diverged, "head_at_targets": at_targets,
        "graph_steps": graph_steps(),
        "parameters": sum(p.numel() for p in model.parameters()), "weights_sha256": weights_digest(model),
        "seconds": round(seconds_before + time.perf_counter() - start, 3), "eval_seconds": round(eval_seconds, 3), "history": history,
        **({"loss_curve": curve} if cfg.loss_every else {}),
    }
    if run_dir is not None and cfg.save_weights:
        from safetensors.torch import save_model

        run_dir.mkdir(parents=True, exist_ok=True)
        save_model(model, str(run_dir / WEIGHTS_FILE))
    return record


def weights_digest(model: nn.Module) -> str:
    """sha256 over the model's state dict (names, dtypes, shapes and bytes, in order): equal
    digests mean bitwise equal weights."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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
                  autotune: str | None = None, config: str | Path | None = None) -> dict:
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
    mode) to ``results["provenance"]``.
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
            results = _previous_results(out, task, preset_name, cfg, resume)
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
                        "overrides": {k: str(v) for k, v in (overrides or {}).items()}, "config": cfg.to_dict(),
                        "release_differences": release.differences(module, preset_name, cfg),
                        "settings": [dataclasses.asdict(s) for s in module.settings(cfg)], **provenance.environment(dev), "complete": False, "runs": [], "provenance": [],
                    }  # fmt: skip
                    if jobs > 1:
                        results["threads"] = threads
                elif label is not None:
                    results["label"] = label
                return _sweep(task, module, cfg, model_factory, out, results, dev, cache, progress, plot, resume, jobs, threads, stop_after_steps, autotune)
        except Exception:
            if not resume and not _has_progress(out):  # a failed start leaves nothing behind (the lock says nobody else wrote here)
                if folder.created:
                    shutil.rmtree(folder.created_root, ignore_errors=True)
                else:
                    (out / RESULTS_FILE).unlink(missing_ok=True)
                    shutil.rmtree(out / RUNS_DIR, ignore_errors=True)
            raise


def _previous_results(out: Path, task: str, preset_name: str, cfg, resume: bool) -> dict | None:
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


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stderr)


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
        from srope.lab.tasks.report import plot_loss_curves, plot_results

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


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def report(dirs) -> str:
    """Markdown tables comparing the runs in ``dirs`` (see :func:`srope.lab.tasks.report.report`)."""
    from srope.lab.tasks.report import report as _report

    return _report(dirs)
