"""One run of a synthetic task: :func:`train_run` trains one model on one setting with one
optimiser point and seed and returns its record.

The run is a :class:`TaskTrainer` (the lab's :class:`~srope.lab.trainer.Trainer`), the same for
every task: AdamW over all parameters (the protocols
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

from srope.lab.schedule import task_schedule
from srope.lab.tasks import numerics
from srope.lab.tasks.common import IGNORE, ArrayStream, ModelRequest, Prepared, Setting, rng_for, to_device
from srope.lab.tasks.numerics import autocast
from srope.lab.tasks.presets import get_task
from srope.lab.train.checkpoint import CheckpointError
from srope.lab.trainer import Trainer

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
    """The flat indices of the positions that have targets, from the batch's host copy (their
    count is data-dependent: found on the device, it would be a wait for the device)."""
    return to_device(np.flatnonzero(targets.reshape(-1) != IGNORE), device)


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
    trainer = TaskTrainer(task, cfg, setting, prepared, model, lr=lr, weight_decay=weight_decay, seed=seed, device=device,
                          run_dir=run_dir, control=control, start=start)  # fmt: skip
    return trainer.run(progress)


class TaskTrainer(Trainer):
    """One run of a synthetic task: a :class:`~srope.lab.trainer.Trainer` over all parameters
    with the task's loss and schedule, that evaluates after every epoch and stops by the preset's
    rule (:class:`srope.lab.tasks.common.TaskConfig`). :meth:`run` trains it and returns the record."""

    def __init__(self, task: str, cfg, setting: Setting, prepared: Prepared, model: nn.Module, *, lr: float, weight_decay: float, seed: int,
                 device: torch.device, run_dir: Path | str | None, control: Any, start: float):  # fmt: skip
        self.task, self.cfg, self.setting, self.prepared, self.device, self.control = task, cfg, setting, prepared, device, control
        self.vocab = setting.vocab_size
        self.at_targets = head_at_targets(cfg, task, model, device)
        super().__init__(model, [p for p in model.parameters() if p.requires_grad], lr=lr, betas=tuple(cfg.betas), eps=cfg.eps,
                         weight_decay=weight_decay, loss=task_loss(model, self.vocab, device, cfg.precision), grad_clip=cfg.grad_clip,
                         cuda_graph=cfg.cuda_graph, device=device)  # fmt: skip
        self.base_lr, self.start = lr, start
        stream = prepared.train
        per_epoch = stream.steps_per_epoch
        self.protocol_steps = per_epoch * cfg.epochs if prepared.total_steps is None else min(per_epoch * cfg.epochs, prepared.total_steps)
        self.total = self.protocol_steps if cfg.max_steps is None else min(self.protocol_steps, cfg.max_steps)
        self.epochs = math.ceil(self.total / per_epoch)
        self.shuffle_rng = rng_for(seed, "shuffle", task, setting.name)
        self.history, self.best, self.last, self.lowest = [], None, None, None  # lowest: the eval of least test loss
        self.since_best, self.step, self.stopped, self.diverged = 0, 0, None, False
        self.identity = {"task": task, "setting": setting.name, "lr": lr, "weight_decay": weight_decay, "seed": seed}
        self.first_epoch, self.seconds_before, self.resumed, self.eval_seconds, self.graph_steps_before = 0, 0.0, None, 0.0, 0
        self.curve, self.window, self.window_count = [], torch.zeros((), device=device), 0  # the loss curve and the steps since its last point
        self.epoch = self.position = self.loss_count = 0
        self.rng_epoch, self.loss_sum = None, None
        self.fitting_rows = None  # set when a forward pass ran out of device memory: the rows that fit since
        self.run_dir = None if run_dir is None else Path(run_dir)
        if self.run_dir is not None and (resumed := self.resume(self.run_dir, say=_say, strict_optimizer=False, fields=_STATE_FIELDS)) is not None:
            if resumed.get("run") != self.identity:
                raise CheckpointError(f"{resumed['path']}: a checkpoint of the run {resumed.get('run')}, not of {self.identity}; remove it or choose another --out")
            self.resumed = resumed
            self.step, self.first_epoch, self.seconds_before = resumed["step"], resumed["epoch"], resumed["seconds"]
            self.eval_seconds, self.graph_steps_before = resumed.get("eval_seconds", 0.0), resumed.get("graph_steps", 0)
            self.history, self.best, self.last, self.since_best = resumed["history"], resumed["best"], resumed["last"], resumed["since_best"]
            self.lowest = resumed.get("lowest")
            self.curve, self.window_count = resumed.get("loss_curve", []), resumed.get("window_count", 0)
            self.window = torch.full((), resumed.get("window_sum", 0.0), device=device)
            # an epoch's order is drawn when it begins; sampled batches are drawn one by one
            self.shuffle_rng.bit_generator.state = resumed["rng_epoch"] if getattr(stream, "replays_epoch_start", True) else resumed["rng_now"]

    def checkpoint(self, epoch: int, position: int, rng_epoch: dict, loss_sum: float, loss_count: int) -> None:
        state = {
            "run": self.identity, "epoch": epoch, "position": position, "rng_epoch": rng_epoch, "rng_now": self.shuffle_rng.bit_generator.state,
            "loss_sum": loss_sum, "loss_count": loss_count, "history": self.history, "best": self.best, "last": self.last,
            "since_best": self.since_best, "lowest": self.lowest, "seconds": self.seconds_before + time.perf_counter() - self.start,
            "eval_seconds": self.eval_seconds, "graph_steps": self.all_graph_steps(), "loss_curve": self.curve,
            "window_sum": float(self.window), "window_count": self.window_count,
        }  # fmt: skip
        self.save(self.run_dir, self.step, state)

    def all_graph_steps(self) -> int:  # steps replayed from a CUDA graph: whether cuda_graph="auto" captured
        return self.graph_steps_before + self.graph_steps

    def out_of_time(self) -> bool:
        max_seconds = getattr(self.cfg, "max_seconds", None)
        return max_seconds is not None and self.seconds_before + time.perf_counter() - self.start >= max_seconds

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        return task_schedule(cfg.schedule, self.base_lr, step, self.total, epoch=self.epoch, epochs=self.epochs, min_lr=cfg.min_lr, warmup=cfg.warmup)

    def batches(self):
        """The rest of the current epoch's batches, ``(step, x, y[, scored])``, up to the run's last step."""
        stream = self.prepared.train
        if isinstance(stream, ArrayStream):
            batches = stream.device_epoch(self.epoch, self.shuffle_rng, self.device, start=self.position, scored=self.at_targets)
        else:
            batches = self._uploaded(stream.epoch(self.epoch, self.shuffle_rng, start=self.position))
        for batch in batches:
            if self.step >= self.total:
                return
            yield self.step, *batch

    def _uploaded(self, host_batches):
        for x_np, y_np in host_batches:
            batch = (to_device(x_np, self.device), to_device(y_np, self.device))
            yield batch + ((scored_positions(y_np, self.device),) if self.at_targets else ())

    def after_step(self, _: int, loss: torch.Tensor) -> str | None:
        cfg = self.cfg
        self.loss_sum += loss
        self.loss_count += 1
        self.window += loss
        self.window_count += 1
        self.step += 1
        self.position += 1
        self.bar.update(1)
        if cfg.loss_every and self.step % cfg.loss_every == 0:
            mean = float(self.window) / self.window_count
            self.curve.append([self.step, mean if math.isfinite(mean) else None])
            self.window.zero_()
            self.window_count = 0
        if self.step % 50 == 0:  # synchronise with the device only now and then
            mean_loss = float(self.loss_sum) / self.loss_count
            if not math.isfinite(mean_loss):
                return "diverged"
            self.bar.set_postfix(loss=f"{mean_loss:.4f}", score=f"{self.last['score']:.3f}" if self.last else "-")
        stop = self.control is not None and self.control.step_done()
        if self.run_dir is not None and (stop or self.step % cfg.checkpoint_every == 0):
            self.checkpoint(self.epoch, self.position, self.rng_epoch, float(self.loss_sum), self.loss_count)
        if stop:
            return "control"
        return "time" if self.out_of_time() else None

    def run(self, progress: bool) -> dict | None:
        """Train epoch by epoch, evaluating after each; the run's record, or None when ``control`` stopped it."""
        cfg, setting, device = self.cfg, self.setting, self.device
        where = f"{setting.name} lr={self.base_lr:g} wd={self.identity['weight_decay']:g} seed={self.identity['seed']}"
        self.bar = tqdm(total=self.total, initial=self.step, desc=where, disable=not progress, leave=False, dynamic_ncols=True)
        for epoch in range(self.first_epoch, self.epochs):
            self.epoch = epoch
            if self.resumed is not None and epoch == self.first_epoch:  # the epoch in progress at the checkpoint
                self.position, self.rng_epoch, self.loss_count = self.resumed["position"], self.resumed["rng_epoch"], self.resumed["loss_count"]
                self.loss_sum = torch.full((), self.resumed["loss_sum"], device=device)
            else:
                self.position, self.rng_epoch, self.loss_count = 0, self.shuffle_rng.bit_generator.state, 0
                self.loss_sum = torch.zeros((), device=device)
            self.model.train()
            ended = self.fit(self.batches())
            if ended == "control":
                self.bar.close()
                return None
            if ended == "time":
                self.stopped = "time"
            mean_loss = float(self.loss_sum) / self.loss_count if self.loss_count else None
            if mean_loss is not None and not math.isfinite(mean_loss):
                self.diverged, self.stopped, mean_loss = True, "diverged", None
            self.model.eval()
            if progress:
                self.bar.write(f"evaluating after step {self.step} ({where})", file=sys.stderr)
            began = time.perf_counter()
            self.last = last = {**self.prepared.evaluate(self.predict), "step": self.step}
            self.eval_seconds += time.perf_counter() - began
            if device.type == "cuda":
                # the blocks of the evaluation and of the epoch's last, smaller batch (run eagerly,
                # outside a captured step's pool) would stay reserved through the training that
                # follows: memory that other runs sharing the GPU need
                torch.cuda.empty_cache()
            if progress:
                self.bar.write(f"evaluated after step {self.step} in {time.perf_counter() - began:.0f} s: score {last['score']:.4f}", file=sys.stderr)
            self.history.append({"epoch": epoch + 1, "step": self.step, "train_loss": mean_loss, "score": last["score"],
                                 **({"loss": last["loss"]} if "loss" in last else {})})  # fmt: skip
            if self.run_dir is not None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                _write_json(self.run_dir / EVALUATIONS_FILE, {"run": self.identity, "steps": self.step, "planned_steps": self.total, "history": self.history})
            self.keep_best(last)
            if self.diverged or self.stopped == "time":
                break
            if self.out_of_time() and epoch + 1 < self.epochs:
                self.stopped = "time"
                break
            if cfg.stop_at is not None and (last["score"] >= cfg.stop_at if cfg.stop_inclusive else last["score"] > cfg.stop_at):
                self.stopped = "threshold"
                break
            if cfg.patience is not None and self.since_best >= cfg.patience:
                self.stopped = "patience"
                break
            if self.control is not None and epoch + 1 < self.epochs and self.control.requested():  # a long evaluation may have outlasted a signal
                if self.run_dir is not None:  # a checkpoint at the next epoch's start
                    self.checkpoint(epoch + 1, 0, self.shuffle_rng.bit_generator.state, 0.0, 0)
                self.bar.close()
                return None
        self.bar.close()
        return self.record()

    def keep_best(self, last: dict) -> None:
        """The best and the lowest-loss evaluations so far, and the patience counter, after ``last``."""
        if self.best is None or last["score"] >= self.best["score"]:
            # a tie goes to the later evaluation: a run whose scores are all 0 reports the model
            # it ended with, not its first evaluation; patience counts only improvements
            self.since_best = 0 if self.best is None or last["score"] > self.best["score"] else self.since_best + 1
            self.best = last
        else:
            self.since_best += 1
        if self.cfg.select == "min_loss":
            if "loss" not in last:
                raise ValueError(f"select='min_loss' needs the task's evaluation to report 'loss'; {self.task} reports {sorted(last)}")
            if self.lowest is None or not last["loss"] >= self.lowest["loss"]:  # a NaN loss is never the lowest, unless the first
                self.lowest = last

    def record(self) -> dict:
        """The finished run's record (and its weights in ``run_dir`` with ``save_weights``)."""
        cfg, setting, model = self.cfg, self.setting, self.model
        chosen = {"best": self.best, "final": self.last, "min_loss": self.lowest}[cfg.select]
        record = {
            "setting": setting.name, "group": setting.group, "x": setting.x, "lr": self.base_lr, "weight_decay": self.identity["weight_decay"],
            "seed": self.identity["seed"], "score": chosen["score"], "metrics": {k: v for k, v in chosen.items() if k != "step"},
            "reported_step": chosen.get("step"), "final": _scalars(self.last), "best": _scalars(self.best),
            **({"min_loss": _scalars(self.lowest)} if self.lowest is not None else {}),
            "steps": self.step, "planned_steps": self.total, "protocol_steps": self.protocol_steps, "epochs": len(self.history),
            "stopped": self.stopped, "diverged": self.diverged, "head_at_targets": self.at_targets, "graph_steps": self.all_graph_steps(),
            "parameters": sum(p.numel() for p in model.parameters()), "weights_sha256": weights_digest(model),
            "seconds": round(self.seconds_before + time.perf_counter() - self.start, 3), "eval_seconds": round(self.eval_seconds, 3),
            "history": self.history, **({"loss_curve": self.curve} if cfg.loss_every else {}),
        }  # fmt: skip
        if self.run_dir is not None and cfg.save_weights:
            from safetensors.torch import save_model

            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_model(model, str(self.run_dir / WEIGHTS_FILE))
        return record

    def predict_rows(self, x: torch.Tensor, targets: torch.Tensor | None):
        device, vocab = self.device, self.vocab
        with torch.no_grad(), autocast(device, self.cfg.precision):
            logits = task_logits(self.model, x.to(device), vocab)
        preds = logits.argmax(-1).cpu()
        if targets is None:
            return preds, 0.0, 0
        targets = targets.to(device)
        nll = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return preds, float(nll), int((targets != IGNORE).sum())

    def predict(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        """The task's evaluation's predictor: argmax predictions of ``x`` (with ``targets``, also
        the summed NLL and the number of targets), in forward passes of at most ``EVAL_LOGITS`` logits."""
        rows = max(1, EVAL_LOGITS // max(1, x.shape[-1] * self.vocab))  # the rows of one forward pass
        parts, i = [], 0
        while i < len(x):
            rows = min(rows, self.fitting_rows or rows, len(x) - i)
            try:
                part = self.predict_rows(x[i : i + rows], None if targets is None else targets[i : i + rows])
            except torch.OutOfMemoryError:
                if rows == 1:
                    raise
                part = None  # recovered outside the handler, whose traceback holds the failed pass's tensors
            if part is not None:
                parts.append(part)
                i += rows
                continue
            self.fitting_rows = rows // 2
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            warnings.warn(f"evaluation ran out of device memory with {rows} rows of {x.shape[-1]} tokens in one forward pass; "
                          f"continuing with at most {self.fitting_rows} rows (the same predictions up to rounding)", stacklevel=2)
        preds = torch.cat([p for p, _, _ in parts])
        return preds if targets is None else (preds, sum(n for _, n, _ in parts), sum(c for _, _, c in parts))


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
