"""One run of a synthetic task: :func:`train_run` trains one model on one setting with one
optimiser point and seed and returns its record.

The training loop is the same for every task: AdamW over all parameters (the protocols
decay every weight), cross-entropy on the targets that are not ``IGNORE``, bf16 autocast on
CUDA (float32 elsewhere), optional gradient clipping, the learning rate set each step from
the schedule, an evaluation after every epoch, and the stopping rule of the preset (see
:class:`srope.lab.tasks.common.TaskConfig`).
"""

from __future__ import annotations

import hashlib
import json
import math
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

from srope.lab.graphed import graphed_optimizer_step
from srope.lab.loop import optimizer_step, train_steps
from srope.lab.schedule import task_schedule
from srope.lab.tasks import numerics
from srope.lab.tasks.common import IGNORE, ModelRequest, Prepared, Setting, rng_for
from srope.lab.tasks.numerics import autocast
from srope.lab.tasks.presets import get_task
from srope.lab.train.checkpoint import CheckpointError, load_checkpoint, remove_unfinished, save_checkpoint, usable_checkpoint
from srope.lab.train.distributed import World
from srope.lab.train.optim import adamw

ModelFactory = Callable[[ModelRequest], nn.Module]
WEIGHTS_FILE = "model.safetensors"
# A run in progress: its evaluations so far, beside (not in) its checkpoints, so that output packed
# without the checkpoints still shows where a run cut off by a timeout or a lost machine had got to.
EVALUATIONS_FILE = "evaluations.json"
# What a run's checkpoint state must hold (name: type), checked on load.
_STATE_FIELDS = {"run": dict, "epoch": int, "position": int, "rng_epoch": dict, "rng_now": dict, "loss_sum": (int, float), "loss_count": int,
                 "history": list, "since_best": int, "seconds": (int, float)}  # fmt: skip
# The most logits an evaluation computes in one forward pass (1 GiB as float32): larger test
# batches run in parts, whose predictions are the same. MQAR's 256 x 512 x 8,192 (2 GiB in bf16,
# twice that as float32) ran concurrent runs on one GPU out of memory.
EVAL_LOGITS = 1 << 28


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


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stderr)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
