"""Pieces every synthetic task shares: the presets' base, seeded random streams, the on-disk
cache, batch streams, the model request and the per-class accuracy counts.

Targets use ``IGNORE = -100`` for positions that carry no loss and no metric.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srope.lab.config import RunConfig
from srope.lab.schedule import TASK_SCHEDULES
from srope.lab.tasks import numerics

IGNORE = -100
CACHE_ENV = "SROPE_CACHE"
DATA_VERSION = 1  # bump when a generator's output changes; it is part of every cache key

# ---------------------------------------------------------------------------------------
# Presets


@dataclass
class TaskConfig(RunConfig):
    """Optimiser, schedule, sweep and stopping rule; every task preset extends it.

    ``schedule``: ``"cosine_epoch"`` (cosine over epochs, stepped once per epoch, to
    ``min_lr``: MAD, Zoology), ``"cosine"`` (cosine over all steps to ``min_lr``: state
    tracking), ``"linear_warmup"`` (linear warm-up over ``warmup`` of the steps, then linear
    decay to 0: copying) or ``"constant"``. ``stop_at``: stop once the eval score passes it
    (``>`` or, with ``stop_inclusive``, ``>=``); ``patience``: stop after that many evals
    without improvement. ``select``: which eval a run reports: ``"final"``, ``"best"`` (the
    highest score; of equal scores the later evaluation) or ``"min_loss"`` (the lowest test
    loss, as a best-loss checkpoint gives; for tasks whose evaluation reports ``"loss"``).
    ``max_steps`` caps every run (for quick runs; ``None``: the protocol's length).
    ``max_seconds`` is a wall-clock budget per run (resumed time counted): training stops at
    the first step past it, the run evaluates once more and records ``stopped: "time"``. The
    schedule is the planned one, so such a run ends before its learning rate has decayed.

    ``loss_every``: the record's ``loss_curve`` holds ``[step, mean training loss of the
    loss_every steps up to it]`` pairs (None where not finite), which show when a run leaves a
    plateau between two evaluations; 0 records none.

    Checkpoints: the run in progress is saved every ``checkpoint_every`` optimiser steps (and
    at a planned stop), so ``--resume`` continues it exactly; ``save_weights`` keeps every
    finished run's weights (``DIR/runs/NAME/model.safetensors``). Neither changes a number,
    so a resumed sweep may change them.

    ``cuda_graph``: on CUDA the training step (forward, loss, backward, clipping, AdamW) is
    captured once and replayed (:func:`srope.lab.graphed.graphed_optimizer_step`), which takes
    the host out of a small model's step; an epoch's last, smaller batch runs eagerly. ``auto``
    (the default) falls back to eager where a capture fails, ``on`` raises, ``off`` is eager;
    on other devices the step is eager.

    ``head_at_targets``: the output head and the loss only at the positions that have
    targets (their flat indices come from the batch's host copy, so nothing waits on the
    device); the same mean loss, without the logits of the other positions. ``auto`` (the
    default) does it on CUDA for tasks that score the same few positions of every example
    (a task module's ``FEW_TARGETS``: MQAR, 64 of 512) when the model exposes its body
    (``.model``) and head (``.lm_head``), as ``SRopeForCausalLM`` does; ``on`` requires such a
    model, ``off`` runs the head everywhere. Tasks whose count of targets varies from batch to
    batch (copying) would give the captured step a new shape each time, so ``auto`` leaves them.

    Model: ``architecture``, ``mixer`` and ``model`` (config entries) go to the model factory
    with ``{"type": position_type, **position[position_type]}`` as the position encoding; the
    presets carry the authors' position-encoding options for each type. ``init`` and
    ``precision`` (:mod:`srope.lab.tasks.numerics`) choose the initialisation and the dtype the
    weights are trained in (the release-exact presets set the authors').
    """

    lrs: tuple[float, ...] = (1e-3,)
    weight_decays: tuple[float, ...] = (0.0,)
    seeds: tuple[int, ...] = (0,)
    batch_size: int = 128
    eval_batch_size: int = 256
    epochs: int = 1
    max_steps: int | None = None
    max_seconds: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = None
    schedule: str = "constant"
    warmup: float = 0.0
    min_lr: float = 0.0
    stop_at: float | None = None
    stop_inclusive: bool = False
    patience: int | None = None
    select: str = "final"
    # At most this many steps are lost to a kill without warning; a checkpoint of the largest
    # synthetic model (copying: 4 layers of 512, 14.9M parameters, with AdamW's moments) is 180 MB.
    checkpoint_every: int = 200
    save_weights: bool = False
    loss_every: int = 50  # the mean training loss of every this many steps goes into the run's loss_curve (0: none)
    cuda_graph: str = "auto"  # the training step as a CUDA graph on CUDA, else eager; "on": that or an error; "off": eager
    head_at_targets: str = "auto"  # the output head only at the positions that have targets: "auto", "on", "off"
    architecture: str = "srope"  # "srope": SRopeForCausalLM; "zoology": Zoology's LM with the mixer in its layer list
    mixer: str = "gla"
    model: dict = field(default_factory=dict)
    init: str = "model"  # srope.lab.tasks.numerics: "model" (the model's own) or "release" (the authors' N(0, 0.02))
    precision: str = "autocast"  # srope.lab.tasks.numerics: "autocast", "float32" or "bf16" (bf16 weights)
    position_type: str = "selective_rope"
    position: dict = field(default_factory=dict)  # {position type: its keyword arguments}

    def nested_overrides(self, changes: dict[str, Any], model: dict[str, Any], position: dict[str, Any]) -> dict[str, Any]:
        """``model.KEY`` into the model dict, ``position.KEY`` into the options of the selected
        encoding (``position[position_type]``); both pass through to the model factory, which checks them."""
        out = super().nested_overrides(changes, model, {})
        if position:
            kind = changes.get("position_type", self.position_type)
            table = {name: dict(kwargs) for name, kwargs in changes.get("position", self.position).items()}
            table[kind] = {**table.get(kind, {}), **position}
            out["position"] = table
        return out


SELECTS = ("final", "best", "min_loss")
ARCHITECTURES = ("srope", "zoology")


def check_train_config(cfg: TaskConfig, auto_batch: bool = False) -> None:
    """Range checks shared by every preset (raises ValueError); ``auto_batch`` allows
    ``batch_size=0`` (the task picks it)."""
    for name in ("lrs", "weight_decays", "seeds"):
        if not getattr(cfg, name):
            raise ValueError(f"{name} must list at least one value")
    if any(not lr > 0 for lr in cfg.lrs):
        raise ValueError(f"learning rates must be positive, got {cfg.lrs}")
    numerics.check(cfg.init, cfg.precision)
    if cfg.architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {cfg.architecture!r}")
    if cfg.architecture == "zoology" and cfg.mixer != "gla":
        raise ValueError(f"the zoology architecture hosts the gla mixer only, got mixer={cfg.mixer!r}")
    if cfg.schedule not in TASK_SCHEDULES:
        raise ValueError(f"schedule must be one of {TASK_SCHEDULES}, got {cfg.schedule!r}")
    if cfg.select not in SELECTS:
        raise ValueError(f"select must be one of {SELECTS}, got {cfg.select!r}")
    if cfg.batch_size < (0 if auto_batch else 1) or cfg.eval_batch_size < 1 or cfg.epochs < 1:
        raise ValueError(f"batch_size{' (0: automatic)' if auto_batch else ''}, eval_batch_size and epochs must be >= 1")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 or None, got {cfg.max_steps}")
    if cfg.max_seconds is not None and not cfg.max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0 or None, got {cfg.max_seconds}")
    if isinstance(cfg.checkpoint_every, bool) or not isinstance(cfg.checkpoint_every, int) or cfg.checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive number of steps, got {cfg.checkpoint_every!r}")
    if isinstance(cfg.loss_every, bool) or not isinstance(cfg.loss_every, int) or cfg.loss_every < 0:
        raise ValueError(f"loss_every must be a number of steps >= 0 (0: no loss curve), got {cfg.loss_every!r}")
    for name in ("cuda_graph", "head_at_targets"):
        if getattr(cfg, name) not in ("auto", "on", "off"):
            raise ValueError(f"{name} must be 'auto', 'on' or 'off', got {getattr(cfg, name)!r}")
    if not 0.0 <= cfg.warmup < 1.0:
        raise ValueError(f"warmup is a fraction of the steps in [0, 1), got {cfg.warmup}")


def parse_lengths(spec: str | int | list | tuple) -> list[int]:
    """Lengths from ``"2-512"``, ``"2-512:8"`` (step), ``"64,128,256"`` or a list; sorted, unique."""
    if isinstance(spec, int):
        items: list = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        items = [part.strip() for part in str(spec).split(",") if part.strip()]
    lengths: set[int] = set()
    for item in items:
        if isinstance(item, int):
            lengths.add(item)
            continue
        body, colon, step = item.partition(":")
        lo, dash, hi = body.partition("-")
        try:
            if dash:
                lengths.update(range(int(lo), int(hi) + 1, int(step) if colon else 1))
            else:
                lengths.add(int(body))
        except ValueError:
            raise ValueError(f"bad length spec {item!r}; use e.g. '2-512', '2-512:8' or '64,128'") from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive integers, got {spec!r}")
    return sorted(lengths)


# ---------------------------------------------------------------------------------------
# Randomness and cache


def rng_for(seed: int, *keys: str | int) -> np.random.Generator:
    """A numpy Generator determined by ``seed`` and ``keys`` (strings hashed with crc32)."""
    words = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFF for k in keys]
    return np.random.default_rng(words)


def default_cache_dir() -> Path:
    """``$SROPE_CACHE`` when set, else ``~/.cache/srope``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "srope"


def cache_key(kind: str, params: dict) -> str:
    blob = json.dumps({"kind": kind, "version": DATA_VERSION, **params}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def cached_arrays(
    kind: str,
    params: dict,
    build: Callable[[], dict[str, np.ndarray]],
    cache_dir: Path | str | None,
    min_elements: int = 1 << 20,
) -> dict[str, np.ndarray]:
    """``build()`` once, kept as ``cache_dir/kind/<hash>.npz`` when it holds ``>= min_elements``.

    ``cache_dir=None`` never touches the disk. The file name is a hash of ``kind``,
    ``params`` and ``DATA_VERSION``; writes go through a temporary file and a rename.
    """
    if cache_dir is None:
        return build()
    path = Path(cache_dir) / kind / f"{cache_key(kind, params)}.npz"
    if path.exists():
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    arrays = build()
    if sum(a.size for a in arrays.values()) >= min_elements:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        (path.with_suffix(".json")).write_text(json.dumps({"kind": kind, "version": DATA_VERSION, **params}, sort_keys=True, default=str))
    return arrays


def small_int(array: np.ndarray) -> np.ndarray:
    """Store token arrays compactly (int16 when the values fit, which they do for vocab < 32k)."""
    if array.size == 0 or (array.min() >= np.iinfo(np.int16).min and array.max() <= np.iinfo(np.int16).max):
        return array.astype(np.int16)
    return array.astype(np.int32)


# ---------------------------------------------------------------------------------------
# Settings, batches and the model request


@dataclass(frozen=True)
class ModelRequest:
    """What a model factory is asked to build: ``model_factory(request) -> nn.Module``.

    ``model`` holds HF-style config entries (``hidden_size``, ``num_hidden_layers``,
    ``num_heads``, ...); ``position`` the position-encoding config with its ``"type"``
    (``{"type": "selective_rope", "spectrum": "uniform", ...}``). The module must return
    logits ``[B, T, vocab_size]``, as a tensor or as an output with ``.logits``.
    """

    task: str
    setting: str
    vocab_size: int
    max_len: int
    mixer: str
    model: dict
    position: dict
    architecture: str = "srope"


@dataclass
class Setting:
    """One task setting (one trained model per optimiser point and seed)."""

    name: str
    group: str
    vocab_size: int
    max_len: int
    params: dict
    model: dict = field(default_factory=dict)
    x: float | None = None  # the x value of this setting in summary plots (e.g. model dim)


class ArrayStream:
    """Batches from fixed arrays; a fresh permutation per epoch when ``shuffle``.

    The epoch's order is drawn from ``rng`` when the epoch begins, so a run resumes an epoch
    by drawing it again from the RNG state the epoch began with (``replays_epoch_start``)
    and skipping the ``start`` batches it had trained on.
    """

    replays_epoch_start = True

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, batch_size: int, shuffle: bool = True):
        if inputs.shape != targets.shape or inputs.ndim != 2:
            raise ValueError(f"inputs and targets must both be [N, T], got {inputs.shape} and {targets.shape}")
        self.inputs, self.targets, self.batch_size, self.shuffle = inputs, targets, int(batch_size), shuffle
        self._on = None  # (device, scored) and the arrays there (:meth:`_resident`)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.inputs) / self.batch_size)

    def epoch(self, epoch: int, rng: np.random.Generator, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = self._order(rng)
        for begin in range(start * self.batch_size, len(order), self.batch_size):
            index = order[begin : begin + self.batch_size]
            yield self.inputs[index].astype(np.int64), self.targets[index].astype(np.int64)

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(len(self.inputs)) if self.shuffle else np.arange(len(self.inputs))

    def device_epoch(self, epoch: int, rng: np.random.Generator, device: torch.device, start: int = 0,
                     scored: bool = False) -> Iterator[tuple[torch.Tensor, ...]]:
        """:meth:`epoch`'s batches (the same order from the same ``rng``) as int64 tensors on
        ``device``, gathered there from copies of the arrays kept on it: one transfer per epoch
        (its order) instead of one per batch. A copy from pageable host memory waits for the
        device to finish its queued work, so a step fed from the host could never be queued
        while the previous one runs. ``scored``: each batch also brings the flat indices of its
        positions with a target (as :func:`srope.lab.tasks.training.scored_positions` finds them
        on the host), formed on the device where every row has as many targets."""
        device = torch.device(device)
        inputs, targets, positions = self._resident(device, scored)
        host_order = self._order(rng)
        order = to_device(host_order, device)
        rows = torch.arange(self.batch_size, device=device)[:, None] * self.inputs.shape[1]
        for begin in range(start * self.batch_size, len(order), self.batch_size):
            index = order[begin : begin + self.batch_size]
            batch = (inputs.index_select(0, index).long(), targets.index_select(0, index).long())
            if scored and positions is not None:
                batch += ((rows[: len(index)] + positions.index_select(0, index)).flatten(),)
            elif scored:  # rows with different counts of targets: a data-dependent size, found on the host
                flat = np.flatnonzero(self.targets[host_order[begin : begin + self.batch_size]].reshape(-1) != IGNORE)
                batch += (to_device(flat, device),)
            yield batch

    def _resident(self, device: torch.device, scored: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The arrays on ``device`` (the narrowest integer type that holds them; on the CPU the
        arrays themselves) and, with ``scored``, each row's target positions ``[N, K]``."""
        key = (device, scored)
        if self._on is None or self._on[0] != key:
            self._on = (key, (*(_resident_array(a, device) for a in (self.inputs, self.targets)), self._target_positions(device, scored)))
        return self._on[1]

    def _target_positions(self, device: torch.device, scored: bool) -> torch.Tensor | None:
        if not scored:
            return None
        mask = self.targets != IGNORE
        counts = mask.sum(axis=1)
        if len(counts) == 0 or (counts != counts[0]).any():
            return None
        return _resident_array(np.nonzero(mask)[1].reshape(len(counts), int(counts[0])), device)


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host batch on ``device``. To a GPU through pinned memory without waiting: a copy from
    pageable memory first waits for the device to finish its queued work, which would keep the
    host from preparing the next batch while a step runs. (PyTorch's pinned-memory cache keeps
    the staging block until the copy is done.)"""
    if device.type != "cuda":
        return torch.as_tensor(array, device=device)
    return torch.from_numpy(np.ascontiguousarray(array)).pin_memory().to(device, non_blocking=True)


def _resident_array(array: np.ndarray, device: torch.device, narrow: bool | None = None) -> torch.Tensor:
    """``array`` on ``device``: a wider integer array in the narrowest of int16 and int32 that holds
    its values (``narrow``, by default off the CPU), else as it is (on the CPU without a copy)."""
    small = np.issubdtype(array.dtype, np.integer) and array.dtype.itemsize <= 2
    if small or not (device.type != "cpu" if narrow is None else narrow):
        return torch.as_tensor(np.ascontiguousarray(array), device=device)
    for kind in (np.int16, np.int32):
        info = np.iinfo(kind)
        if array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max):
            return torch.as_tensor(array.astype(kind), device=device)
    return torch.as_tensor(array, device=device)


class SampledStream:
    """Fresh batches from ``sample(rng) -> (inputs, targets)``; ``steps_per_epoch`` per epoch.

    Every batch is drawn when it is needed, so a run resumes from the RNG state after the
    last batch it trained on and draws the epoch's remaining ``steps_per_epoch - start``.
    """

    replays_epoch_start = False

    def __init__(self, sample: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]], steps_per_epoch: int):
        self.sample, self.steps_per_epoch = sample, int(steps_per_epoch)

    def epoch(self, epoch: int, rng: np.random.Generator, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _ in range(self.steps_per_epoch - start):
            yield self.sample(rng)


# predict(x [B, T]) -> argmax predictions [B, T] (int64, CPU); predict(x, targets [B, T]) ->
# (predictions, summed cross-entropy over the targets that are not IGNORE, their count)
Predict = Callable[..., Any]


@dataclass
class Prepared:
    """A setting ready to train: its batch stream, its evaluation and an optional model wrapper.

    ``evaluate(predict)`` gets ``predict(LongTensor [B, T]) -> LongTensor [B, T]``, the model's
    argmax tokens (computed on the model's device, returned on the CPU; ``predict(x, targets)``
    also returns the summed cross-entropy over the targets and their count), and returns a
    dict with at least ``"score"`` (the selection metric, in [0, 1]), optionally ``"loss"``
    (the mean test cross-entropy, for ``select="min_loss"``) and ``"curves"``:
    ``{name: {"x": [...], "y": [...]}}``.
    """

    train: ArrayStream | SampledStream
    evaluate: Callable[[Predict], dict]
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    total_steps: int | None = None  # cap below epochs x steps_per_epoch (step-budget tasks)
    info: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Metrics


class ClassCounts:
    """Per-class true positives, false positives and false negatives, accumulated over batches."""

    def __init__(self, num_classes: int):
        self.num_classes = int(num_classes)
        self.tp = torch.zeros(num_classes, dtype=torch.float64)
        self.fp = torch.zeros(num_classes, dtype=torch.float64)
        self.fn = torch.zeros(num_classes, dtype=torch.float64)

    def update(self, preds: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE) -> None:
        valid = targets != ignore_index
        p, t = preds[valid].long(), targets[valid].long()
        if p.numel() and (int(p.min()) < 0 or int(p.max()) >= self.num_classes or int(t.min()) < 0 or int(t.max()) >= self.num_classes):
            raise ValueError(f"class ids must lie in [0, {self.num_classes})")
        hit = p == t
        ones = torch.ones_like(p, dtype=torch.float64)
        self.tp += torch.bincount(t[hit], minlength=self.num_classes).double()
        self.fn += torch.zeros(self.num_classes, dtype=torch.float64).index_add_(0, t[~hit], ones[~hit])
        self.fp += torch.zeros(self.num_classes, dtype=torch.float64).index_add_(0, p[~hit], ones[~hit])

    def merge(self, other: "ClassCounts") -> None:
        """Add another count of the same classes (e.g. one batch's) to this one."""
        if other.num_classes != self.num_classes:
            raise ValueError(f"cannot merge counts of {other.num_classes} classes into {self.num_classes}")
        self.tp += other.tp
        self.fp += other.fp
        self.fn += other.fn

    def macro(self) -> float:
        """torchmetrics' ``MulticlassAccuracy(average="macro")``: the mean over classes of
        ``tp / (tp + fn)``, counting every class that occurs as a target *or a prediction*
        (a class only ever predicted wrongly scores 0); classes never seen are left out."""
        seen = (self.tp + self.fp + self.fn) > 0
        if not bool(seen.any()):
            raise ValueError("no target positions to score: every target equals ignore_index")
        support = self.tp + self.fn
        recall = torch.where(support > 0, self.tp / support.clamp(min=1), torch.zeros_like(support))
        return float(recall[seen].mean())

    def micro(self) -> float:
        total = float((self.tp + self.fn).sum())
        if total == 0:
            raise ValueError("no target positions to score: every target equals ignore_index")
        return float(self.tp.sum()) / total
