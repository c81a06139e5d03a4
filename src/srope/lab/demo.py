"""``srope demo``: Selective RoPE learns parity and extrapolates; NoPE and RoPE do not.

The paper's Fig. 7 claim (§5.4), small enough for a laptop CPU. The same one-layer GLA
(:class:`srope.models.SRopeForCausalLM`) is trained three times on the S2 word problem
(parity, tagged: after every bit, predict the parity so far; the data come from
:mod:`srope.lab.tasks.state_tracking`), once per position encoding: NoPE, RoPE and Selective
RoPE. The three runs share everything except the position encoding: the model size (up
to the encoding's own parameters), the initial values of every shared weight, the training
batches, the number of steps, the length curriculum and the learning-rate schedule. Each
model (in the CPU preset, the moving average of its weights over the last stage) is then
scored on fresh sequences (checked not to occur in training) at the training length and at
4x it.

``seq_acc`` is the fraction of sequences with every position right (the authors' sequence
accuracy). The curve at length ``t`` is the fraction whose first ``t`` positions are right,
which for a causal model is the sequence accuracy on fresh length-``t`` sequences.

Presets (:data:`PRESETS`): ``"cpu"`` (the default: a small GLA that fits the CPU time
budget) and ``"cuda"`` (the authors' state-tracking GLA: hidden 384, 12 heads, expand_k 1,
short conv, with the CPU preset's Selective RoPE options and a longer schedule; seeds 0-2
on an H200). Both train up to length 128 and evaluate at 512. Why the recipe looks the way
it does is in :data:`CPU`'s comment (the numbers and the diagnosis). Both presets'
Selective RoPE starts its ω map with ``projection_gain`` 8 (so that the rotation pairs
start with a spread of angle steps and one can find parity) and trains with
``phase_noise`` 0.1 (so that the learned steps become precise enough to extrapolate):
regularisers of ours, not the paper's (README, "Demo", has the full demos).
"""

from __future__ import annotations

import json
import math
import os
import queue
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from srope.lab import plotting, provenance
from srope.lab.config import RunConfig
from srope.lab.loop import optimizer_step, train_steps
from srope.lab.schedule import stage_of, warmup_stable_decay_by_stage
from srope.lab.train.optim import adamw
from srope.ops.layout import RowLayout
from srope.lab.tasks import state_tracking
from srope.lab.tasks.common import rng_for
from srope.lab.tasks.groups import get_group
from srope.registry import positions

# The encodings the demo compares (its experiment, with DemoConfig's options for two of them and
# targets for each: not every registered encoding), named and labelled as in srope.registry.
POSITIONS = ("nope", "rope", "selective_rope")
LABELS = {kind: positions[kind].label for kind in POSITIONS}
DEVICES = ("cpu", "cuda")
GROUP = "S2"  # parity
RESULTS_FILE, PLOT_FILE = "results.json", "parity.png"
PLOT_PURPOSE = "srope demo's plots (parity.png, seeds.png)"


@dataclass(frozen=True)
class DemoConfig(RunConfig):
    """Everything a demo run depends on besides the seed and the device.

    Model: ``model`` holds :class:`srope.models.SRopeConfig` options of a GLA; ``rope`` and
    ``selective_rope`` the options of those encodings (:class:`srope.modules.RoPE`,
    :class:`srope.modules.SelectiveRoPE`).

    Training: ``curriculum`` lists ``(length, steps)`` or ``(length, steps, batch size)``
    stages run in order; the last stage's length is the training length. Every step draws
    the stage's batch size (default ``batch_size``) new random sequences
    from one stream that the three encodings share: uniform bits, except that from
    curriculum stage ``mixed_from_stage`` on, a fraction ``mixed_density`` of the sequences
    draw their bits as 1 with a per-sequence probability ``p ~ U(0, 1)`` (so some have
    long runs of ones or zeros). Evaluation sequences are always uniform. The loss is the tagging cross-entropy
    over every position with ``label_smoothing``; AdamW with ``betas``, ``adam_eps`` and
    ``weight_decay`` on every weight (on the position encoding's own parameters only with
    ``position_weight_decay``; their learning rate is ``position_lr_scale`` times the
    schedule's); gradients clipped to norm ``grad_clip`` (None: no
    clipping); the learning rate follows :meth:`lr_at` (warm-up, constant, linear cooldown,
    times ``lr_by_stage``'s factor for the step's curriculum stage when that is given).
    ``phase_noise_by_stage`` (radians, one per curriculum stage; None: off) replaces
    Selective RoPE's fixed ``phase_noise`` by one per stage (:meth:`phase_noise_at`).

    Evaluation: ``eval_size`` fresh sequences at the training length and as many at
    ``eval_len``, in batches of ``eval_batch_size``.
    """

    name: str
    model: dict
    rope: dict
    selective_rope: dict
    curriculum: tuple[tuple[int, int], ...]
    batch_size: int
    lr: float
    warmup_steps: int
    cooldown_steps: int
    min_lr_ratio: float
    weight_decay: float
    label_smoothing: float
    grad_clip: float | None
    betas: tuple[float, float]
    adam_eps: float
    eval_len: int
    eval_size: int
    eval_batch_size: int
    bf16_autocast: bool = False  # on CUDA only; phases and angles stay float32/float64 anyway
    mixed_density: float = 0.0
    mixed_from_stage: int = 0
    position_weight_decay: bool = True
    position_lr_scale: float = 1.0
    phase_noise_by_stage: tuple[float, ...] | None = None
    ema_decay: float | None = None
    ema_position_only: bool = False
    switch_warmup_steps: int = 0
    lr_by_stage: tuple[float, ...] | None = None
    note: str = ""

    @property
    def train_len(self) -> int:
        return self.curriculum[-1][0]

    @property
    def steps(self) -> int:
        return sum(self.stage_steps)

    def position(self, kind: str) -> dict:
        """The ``position`` entry of the model config for the encoding ``kind``."""
        return {"type": kind, **{"nope": {}, "rope": self.rope, "selective_rope": self.selective_rope}[kind]}

    @property
    def stage_steps(self) -> tuple[int, ...]:
        """The number of optimiser steps of each curriculum stage."""
        return tuple(stage[1] for stage in self.curriculum)

    def stage_at(self, step: int) -> int:
        """The curriculum stage (0-based) of optimiser step ``step`` (0-based)."""
        return stage_of(step, self.stage_steps)

    def length_at(self, step: int) -> int:
        """The sequence length of optimiser step ``step`` (0-based)."""
        return self.curriculum[self.stage_at(step)][0]

    def batch_at(self, step: int) -> int:
        """The batch size of optimiser step ``step`` (0-based)."""
        entry = self.curriculum[self.stage_at(step)]
        return entry[2] if len(entry) == 3 else self.batch_size

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based):
        :func:`srope.lab.schedule.warmup_stable_decay_by_stage` over the curriculum's stages
        (warm-up over ``warmup_steps``, constant, linear down to ``min_lr_ratio · lr`` over the
        last ``cooldown_steps``; a fresh warm-up of ``switch_warmup_steps`` at each later stage;
        times ``lr_by_stage``'s factor for the step's stage)."""
        return warmup_stable_decay_by_stage(step, stage_steps=self.stage_steps, peak=self.lr, warmup_steps=self.warmup_steps,
                                            cooldown_steps=self.cooldown_steps, min_ratio=self.min_lr_ratio,
                                            stage_factors=self.lr_by_stage, switch_warmup_steps=self.switch_warmup_steps)

    def phase_noise_at(self, step: int) -> float | None:
        """Selective RoPE's phase noise (radians per token) at optimiser step ``step``, or
        None where the encoding's own ``phase_noise`` applies."""
        if self.phase_noise_by_stage is None:
            return None
        return self.phase_noise_by_stage[self.stage_at(step)]

    def _one_per_stage(self, values, positive: bool) -> bool:
        """True when ``values`` holds one finite real number per curriculum stage, each > 0
        (``positive``) or >= 0."""
        return len(values) == len(self.curriculum) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 if positive else v >= 0) and v < math.inf
            for v in values)

    def check(self) -> None:
        """Range checks (raises ValueError naming the field and the allowed range)."""
        if not self.curriculum:
            raise ValueError("curriculum must list at least one (length, steps) stage")
        for stage in self.curriculum:
            if len(stage) not in (2, 3) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in stage):
                raise ValueError(f"curriculum stages must be (length >= 1, steps >= 1[, batch size >= 1]) integers, got {stage!r}")
        for name in ("batch_size", "eval_len", "eval_size", "eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.eval_len < self.train_len:
            raise ValueError(f"eval_len ({self.eval_len}) must be >= the training length ({self.train_len})")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.cooldown_steps < 0 or self.warmup_steps + self.cooldown_steps > self.steps:
            raise ValueError(
                f"warmup_steps and cooldown_steps must be >= 0 with warmup_steps + cooldown_steps <= steps={self.steps}, "
                f"got {self.warmup_steps} and {self.cooldown_steps}"
            )
        if not (self.position_lr_scale > 0 and math.isfinite(self.position_lr_scale)):
            raise ValueError(f"position_lr_scale must be a positive number, got {self.position_lr_scale}")
        noise = self.phase_noise_by_stage
        if noise is not None and not self._one_per_stage(noise, positive=False):
            raise ValueError(f"phase_noise_by_stage must be None or {len(self.curriculum)} finite numbers >= 0 (radians, one per "
                             f"curriculum stage), got {noise!r}")
        factors = self.lr_by_stage
        if factors is not None and not self._one_per_stage(factors, positive=True):
            raise ValueError(f"lr_by_stage must be None or {len(self.curriculum)} finite numbers > 0 (learning-rate factors, one "
                             f"per curriculum stage), got {factors!r}")
        if isinstance(self.switch_warmup_steps, bool) or not isinstance(self.switch_warmup_steps, int) or self.switch_warmup_steps < 0:
            raise ValueError(f"switch_warmup_steps must be an integer >= 0, got {self.switch_warmup_steps!r}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"ema_decay must be None or in (0, 1), got {self.ema_decay}")
        if not isinstance(self.ema_position_only, bool):
            raise TypeError(f"ema_position_only must be True or False, got {self.ema_position_only!r}")
        if not isinstance(self.position_weight_decay, bool):
            raise TypeError(f"position_weight_decay must be True or False, got {self.position_weight_decay!r}")
        if not 0 <= self.mixed_density <= 1:
            raise ValueError(f"mixed_density must be in [0, 1], got {self.mixed_density}")
        if not 0 <= self.mixed_from_stage < len(self.curriculum):
            raise ValueError(f"mixed_from_stage must be a curriculum stage index in [0, {len(self.curriculum)}), got {self.mixed_from_stage}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (self.adam_eps > 0 and math.isfinite(self.adam_eps)):
            raise ValueError(f"adam_eps must be a positive number, got {self.adam_eps}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")


# Why this recipe, and how often it works: docs/demo.md.
_SELECTIVE_ROPE = {
    "projection": "full-rank", "conv_size": 1, "conv_activation": None, "bias": True, "gate": "per-channel",
    "spectrum": "uniform", "max_temperature": math.pi,
}
# Optimiser, loss and evaluation settings the two presets share.
_OPTIMISATION = dict(min_lr_ratio=0.0, weight_decay=0.0, label_smoothing=0.01, grad_clip=1.0, betas=(0.9, 0.95), adam_eps=1e-4,
                     eval_len=512)

CPU = DemoConfig(
    name="cpu",
    model={"hidden_size": 64, "num_hidden_layers": 1, "num_heads": 4, "expand_k": 0.5, "expand_v": 1.0, "use_short_conv": True,
           "gate_logit_normalizer": 256.0},
    rope={"theta": 500000.0},
    selective_rope={**_SELECTIVE_ROPE, "phase_noise": 0.1, "projection_gain": 8.0},
    curriculum=((16, 150, 256), (32, 100, 128), (64, 100, 64), (128, 350, 64)),
    batch_size=64,
    lr=1.5e-3,
    warmup_steps=0,
    cooldown_steps=350,
    **{**_OPTIMISATION, "weight_decay": 0.1, "adam_eps": 1e-6},
    position_weight_decay=False,
    ema_decay=0.98,
    lr_by_stage=(1.0, 0.5, 0.35, 0.25),
    eval_size=1000,
    eval_batch_size=50,  # larger batches at length 512 outgrow a laptop core's caches
    note="a small GLA for the CPU",
)

# Spelled out (not derived from CPU) so that changes to the CPU recipe leave it as it ran.
# Its runs on an H200: docs/demo.md, "On a GPU".
CUDA = DemoConfig(
    name="cuda",
    model={"hidden_size": 384, "num_hidden_layers": 1, "num_heads": 12, "expand_k": 1.0, "expand_v": 1.0, "use_short_conv": True,
           "gate_logit_normalizer": 256.0},
    rope={"theta": 500000.0},
    selective_rope={**_SELECTIVE_ROPE, "projection_gain": 8.0, "phase_noise": 0.1},
    curriculum=((16, 400), (32, 400), (64, 400), (128, 800)),
    batch_size=256,
    lr=1e-3,
    warmup_steps=100,
    cooldown_steps=600,
    **_OPTIMISATION,
    eval_size=4000,
    eval_batch_size=500,
    bf16_autocast=True,
    note="the authors' state-tracking GLA (hidden 384, 12 heads, expand_k 1, short conv)",
)

PRESETS = {"cpu": CPU, "cuda": CUDA}


# ---------------------------------------------------------------------------------------
# Model and data


def build_model(config: DemoConfig, kind: str, seed: int) -> torch.nn.Module:
    """The GLA of ``config`` with position encoding ``kind``.

    Every weight that the three encodings have in common starts from the same values for
    a given seed (those of the NoPE model); only the encoding's own parameters differ.
    """
    from srope.models import SRopeConfig, SRopeForCausalLM

    def make(position: str) -> torch.nn.Module:
        torch.manual_seed(seed)
        cfg = SRopeConfig(vocab_size=state_tracking.vocab_size(get_group(GROUP)), mixer="gla", position=config.position(position),
                          bos_token_id=None, eos_token_id=None, **config.model)
        return SRopeForCausalLM(cfg)

    model = make(kind)
    if kind != "nope":
        shared = make("nope").state_dict()
        missing, unexpected = model.load_state_dict(shared, strict=False)
        if unexpected or any(".position." not in name for name in missing):
            raise RuntimeError(f"NoPE and {kind} models differ outside the position encoding: {missing=} {unexpected=}")
    return model


def train_batches(config: DemoConfig, seed: int):
    """The training stream: ``(step, inputs, targets)`` numpy ``[B, L+1]`` per step, the same
    for every position encoding (BOS then bits; BOS then the parity after each bit)."""
    group, rng = get_group(GROUP), rng_for(seed, "demo", GROUP, "train")
    for step in range(config.steps):
        length, batch = config.length_at(step), config.batch_at(step)
        if config.mixed_density > 0 and config.stage_at(step) >= config.mixed_from_stage:
            mixed = rng.random((batch, 1)) < config.mixed_density
            density = np.where(mixed, rng.random((batch, 1)), 0.5)
            words = (rng.random((batch, length)) < density).astype(np.uint8)
            inputs, targets = state_tracking.tag_words(group, words)
        else:
            inputs, targets = state_tracking.make_split(group, length, batch, rng, distinct=False)
        yield step, inputs, targets


def eval_sets(config: DemoConfig, seed: int) -> dict[str, Any]:
    """Fresh evaluation sequences at the training length and at ``eval_len``.

    Distinct rows from their own random stream; any row that also occurs in the training
    stream is dropped (and counted), so every scored sequence is unseen.
    """
    group = get_group(GROUP)
    rng = rng_for(seed, "demo", GROUP, "eval")
    sets = {name: state_tracking.make_split(group, length, config.eval_size, rng, distinct=True)
            for name, length in (("train", config.train_len), ("eval", config.eval_len))}
    seen: dict[int, set[bytes]] = {}
    lengths = {x.shape[1] for x, _ in sets.values()}
    for _, inputs, _ in train_batches(config, seed):
        if inputs.shape[1] in lengths:
            seen.setdefault(inputs.shape[1], set()).update(row.tobytes() for row in inputs)
    out: dict[str, Any] = {"dropped_seen_in_training": 0}
    for name, (inputs, targets) in sets.items():
        known = seen.get(inputs.shape[1], set())
        keep = np.array([row.tobytes() not in known for row in inputs], dtype=bool)
        out["dropped_seen_in_training"] += int((~keep).sum())
        out[name] = (inputs[keep], targets[keep])
    return out


@torch.no_grad()
def predict(model: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: torch.device, bf16: bool = False) -> torch.Tensor:
    """Argmax predictions ``[N, T]`` (on the CPU) of ``model`` for token ids ``inputs [N, T]``."""
    model.eval()
    vocab = state_tracking.vocab_size(get_group(GROUP))
    preds = []
    for start in range(0, len(inputs), batch_size):
        x = torch.as_tensor(inputs[start : start + batch_size].astype(np.int64), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logits = model(x).logits
        preds.append(logits[..., :vocab].argmax(-1).cpu())
    return torch.cat(preds)


def score(preds: torch.Tensor, targets: np.ndarray) -> dict[str, Any]:
    """Sequence accuracy, token accuracy and the per-length curve of predictions vs targets.

    ``curve[t - 1]`` is the fraction of rows whose first ``t`` elements (after BOS) and BOS
    are right, ``t = 1 .. L``.
    """
    targets_t = torch.as_tensor(targets.astype(np.int64))
    curve = state_tracking.cumulative_accuracy(preds, targets_t)
    return {
        "seq_acc": state_tracking.sequence_accuracy(preds, targets_t),
        "token_acc": float((preds == targets_t).double().mean()),
        "curve": [float(v) for v in curve[1:]],
    }


# ---------------------------------------------------------------------------------------
# Training one model


def make_optimizer(model: torch.nn.Module, config: DemoConfig) -> torch.optim.AdamW:
    """AdamW over every weight; the position encoding's own parameters in a group of their
    own, decayed only with ``config.position_weight_decay``, at ``position_lr_scale`` times
    the learning rate (each group's ``lr_scale``; :func:`train_model` applies it)."""
    position = [p for name, p in model.named_parameters() if ".position." in name]
    others = [p for name, p in model.named_parameters() if ".position." not in name]
    groups = [{"params": others, "lr_scale": 1.0},
              {"params": position, "weight_decay": config.weight_decay if config.position_weight_decay else 0.0,
               "lr_scale": config.position_lr_scale}]
    return adamw([g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.adam_eps,
                 weight_decay=config.weight_decay, fused=False)


def train_model(kind: str, config: DemoConfig, seed: int, device: str,
                report: Callable[[str, int, float], None] | None = None) -> tuple[torch.nn.Module, np.ndarray]:
    """Train the ``kind`` model on the shared stream; return it and its loss per step.

    ``report(kind, steps_done, loss)`` is called every 10 steps and at the end.
    """
    dev = torch.device(device)
    model = build_model(config, kind, seed).to(dev)
    optimizer = make_optimizer(model, config)
    vocab = state_tracking.vocab_size(get_group(GROUP))
    bf16 = config.bf16_autocast and dev.type == "cuda"
    from srope.modules.selective_rope import SelectiveRoPE

    encodings = [m for m in model.modules() if isinstance(m, SelectiveRoPE)]
    last_stage = len(config.curriculum) - 1
    averaged = [p for name, p in model.named_parameters() if ".position." in name or not config.ema_position_only]
    ema: list[torch.Tensor] | None = None
    losses = []

    def before(step: int) -> None:
        nonlocal ema
        if config.ema_decay is not None and ema is None and config.stage_at(step) == last_stage:
            ema = [p.detach().clone() for p in averaged]  # the weights at the last stage's start
        noise = config.phase_noise_at(step)
        for encoding in encodings if noise is not None else ():
            encoding.phase_noise = noise

    def loss(inputs: np.ndarray, targets: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(inputs.astype(np.int64), device=dev)
        y = torch.as_tensor(targets.astype(np.int64), device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x).logits
        return F.cross_entropy(logits[..., :vocab].float().reshape(-1, vocab), y.reshape(-1), label_smoothing=config.label_smoothing)

    def after(step: int, value: torch.Tensor) -> None:
        if ema is not None:
            with torch.no_grad():
                for average, p in zip(ema, averaged):
                    average.lerp_(p, 1 - config.ema_decay)
        losses.append(value)
        if report is not None and ((step + 1) % 10 == 0 or step + 1 == config.steps):
            report(kind, step + 1, float(value))

    model.train()
    train_steps(train_batches(config, seed), optimizer_step(model, optimizer, loss, grad_clip=config.grad_clip), lr_at=config.lr_at,
                before=before, after=after)
    if ema is not None:
        with torch.no_grad():
            for average, p in zip(ema, averaged):
                p.copy_(average)
    return model, torch.stack(losses).float().cpu().numpy()


def train_one(kind: str, config: DemoConfig, seed: int, device: str, data: dict[str, Any],
              report: Callable[[str, int, float], None] | None = None) -> dict[str, Any]:
    """Train the ``kind`` model (:func:`train_model`), then score it on ``data`` (from :func:`eval_sets`)."""
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    model, losses = train_model(kind, config, seed, device, report)
    train_seconds, train_cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    bf16 = config.bf16_autocast and device == "cuda"
    scores = {name: score(predict(model, data[name][0], config.eval_batch_size, torch.device(device), bf16), data[name][1])
              for name in ("train", "eval")}
    window = max(1, min(50, len(losses) // 10))
    return {
        "parity_angles": parity_angles(model, config.eval_len) if kind == "selective_rope" else None,
        "seq_acc": {name: scores[name]["seq_acc"] for name in ("train", "eval")},
        "token_acc": {name: scores[name]["token_acc"] for name in ("train", "eval")},
        "curve": {"length": list(range(1, config.eval_len + 1)), "seq_acc": scores["eval"]["curve"]},
        "final_loss": float(losses[-window:].mean()),
        "loss": [float(v) for v in losses],
        "finite": bool(np.isfinite(losses).all()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "position_parameters": sum(p.numel() for name, p in model.named_parameters() if ".position." in name),
        "train_seconds": round(train_seconds, 3),
        "train_cpu_seconds": round(train_cpu, 3),
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(_cpu_seconds() - cpu_start, 3),
    }


@torch.no_grad()
def encoding_input(model: torch.nn.Module, encoding: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """The block input x from which ``encoding`` (one of the model's) computes its angles,
    in one forward of ``tokens``."""
    seen, angles = {}, encoding.angles

    def capture(x, **options):
        seen["x"] = x
        return angles(x, **options)

    encoding.angles = capture
    try:
        model(torch.tensor([tokens], device=next(model.parameters()).device))
    finally:
        del encoding.angles
    return seen["x"]


@torch.no_grad()
def parity_angles(model: torch.nn.Module, eval_len: int) -> dict[str, Any] | None:
    """The angle step each token makes in the rotation pair closest to parity's exact
    solution (π per "1", 0 per "0", modulo 2π), how far off it is (radians), and the drift
    those errors add up to over ``eval_len`` uniform bits (``eval_len / 2`` of each).

    A step off by ε adds ε per token, so a run whose steps are right to within the
    tolerance at the training length can still be wrong at 4x it. None for models
    without Selective RoPE. In the one-layer demo model the angles depend on the token
    alone (conv width 1), so ``[BOS, 0, 1]`` shows every step there is."""
    from srope.modules.selective_rope import SelectiveRoPE

    encodings = [m for m in model.modules() if isinstance(m, SelectiveRoPE)]
    if len(encodings) != 1:
        return None
    encoding = encodings[0]
    tokens = [state_tracking.bos_id(get_group(GROUP)), 0, 1]
    model.eval()
    phi, _ = encoding.phase_increments(encoding_input(model, encoding, tokens), RowLayout(1, len(tokens)))
    angles = (phi[0].double() * encoding.temperature(torch.float64, phi.device)).flatten(1).cpu()  # [3, Hk·R]
    wrap = lambda a: torch.remainder(a + math.pi, 2 * math.pi) - math.pi  # noqa: E731 - into [-π, π)
    off_one, off_zero = wrap(angles[2] - math.pi), wrap(angles[1])
    pair = int((off_one.abs() + off_zero.abs()).argmin())
    errors = float(off_one[pair]), float(off_zero[pair])
    return {"pair": pair, "step_per_one": float(angles[2, pair]), "step_per_zero": float(angles[1, pair]),
            "error_per_one": errors[0], "error_per_zero": errors[1], "drift_at_eval_len": eval_len / 2 * sum(errors)}


def _cpu_seconds() -> float:
    """CPU time of this process (user + system, all threads)."""
    times = os.times()
    return times.user + times.system


def _worker(kind: str, config: DemoConfig, seed: int, device: str, threads: int, data: dict, messages) -> None:
    """Process entry point: train one model with ``threads`` threads, post progress and the result."""
    try:
        torch.set_num_threads(threads)

        def report(name: str, step: int, loss: float | None) -> None:
            messages.put(("step", name, step, loss))

        messages.put(("done", kind, train_one(kind, config, seed, device, data, report)))
    except BaseException:  # report everything, the parent raises it
        messages.put(("error", kind, traceback.format_exc()))


# ---------------------------------------------------------------------------------------
# The demo


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

    On the CPU the models are small enough that a second thread speeds one up by only
    about 1.4x, so three single-thread processes sharing 2 cores finish sooner than three
    runs one after another with both (2-core box, CPU preset, seed 0 back to back: 203 s
    against 222 s; seeds 0-4: 164-196 s against 175-207 s). On CUDA one model at a time
    fills the GPU."""
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


def format_seed_table(summary: dict) -> str:
    """The printed table of :func:`run_demo_seeds`."""
    train, evl = summary["train_len"], summary["eval_len"]
    lines = [f"Parity across seeds ({summary['preset']} preset, {summary['device']}): seq_acc @{train} / @{evl}",
             f"{'seed':>6}  " + "  ".join(f"{LABELS[kind]:>16}" for kind in POSITIONS) + "  meets targets"]
    for seed, entry in summary["per_seed"].items():
        cells = "  ".join(f"{entry['seq_acc'][kind]['train']:>7.3f} / {entry['seq_acc'][kind]['eval']:.3f}" for kind in POSITIONS)
        lines.append(f"{seed:>6}  {cells}  {'yes' if entry['meets_all'] else 'no'}")
    lines.append(f"{summary['meets_all']} of {len(summary['seeds'])} seeds meet every target; Selective RoPE learns parity at "
                 f"{train} on {summary['selective_rope_learns']}; {summary['seconds']:.0f} s in all.")
    return "\n".join(lines)


def plot_seeds(runs: dict[int, dict], path: Path) -> None:
    """Sequence accuracy against length for every seed: Selective RoPE solid, NoPE and RoPE faint."""
    plt = plotting.pyplot(PLOT_PURPOSE)

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"nope": "tab:gray", "rope": "tab:orange", "selective_rope": "tab:blue"}
    for seed, results in runs.items():
        for kind in POSITIONS:
            curve = results["results"][kind]["curve"]
            own = kind == "selective_rope"
            ax.plot(curve["length"], curve["seq_acc"], color=colors[kind], alpha=0.9 if own else 0.35, linewidth=1.5 if own else 1,
                    label=LABELS[kind] if seed == next(iter(runs)) else None)
    first = next(iter(runs.values()))
    ax.axvline(first["train_len"], color="gray", linestyle="--", linewidth=1, label=f"training length {first['train_len']}")
    ax.set(xlabel="sequence length", ylabel="sequence accuracy (fresh sequences)", ylim=(-0.02, 1.02), xlim=(1, first["eval_len"]),
           title=f"Parity, seeds {', '.join(str(s) for s in runs)} ({first['preset']} preset, {first['device']})")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _train_all(config: DemoConfig, seed: int, device: str, data: dict, workers: int, threads: int, bars: dict) -> dict[str, dict]:
    """Train the three models, ``workers`` at a time; update each one's progress bar in ``bars``."""
    done: dict[str, int] = {}

    def report(kind: str, step: int, loss: float | None) -> None:
        bar = bars[kind]
        if loss is not None:
            bar.set_postfix_str(f"training loss {loss:.3f}", refresh=False)
        bar.update(step - done.get(kind, 0))
        done[kind] = step

    if workers == 1:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return {kind: train_one(kind, config, seed, device, data, report) for kind in POSITIONS}
        finally:
            torch.set_num_threads(old)

    ctx = _process_context()
    messages = ctx.Queue()
    pending, runs, procs = list(POSITIONS), {}, {}
    while pending or procs:
        while pending and len(procs) < workers:
            kind = pending.pop(0)
            procs[kind] = ctx.Process(target=_worker, args=(kind, config, seed, device, threads, data, messages), daemon=True)
            try:
                procs[kind].start()
            except (BrokenPipeError, ConnectionError, EOFError) as error:
                _stop(procs)
                raise RuntimeError(f"could not start the demo worker for {kind} ({error}); {_WORKER_HINT}") from error
        try:
            message = messages.get(timeout=1.0)
        except queue.Empty:
            dead = [kind for kind, proc in procs.items() if not proc.is_alive() and kind not in runs]
            if dead:
                _stop(procs)
                raise RuntimeError(f"demo worker(s) for {dead} exited without a result (killed, or failed to start: {_WORKER_HINT})")
            continue
        if message[0] == "step":
            report(*message[1:])
        elif message[0] == "done":
            runs[message[1]] = message[2]
            procs.pop(message[1]).join()
        else:
            _stop(procs)
            raise RuntimeError(f"demo worker for {message[1]} failed:\n{message[2]}")
    return runs


_WORKER_HINT = ("worker processes import the main script again, so a script that calls run_demo with workers > 1 must keep "
                "its top-level code under `if __name__ == \"__main__\":` (or pass workers=1)")


def _stop(procs: dict) -> None:
    for proc in procs.values():
        if proc.is_alive():
            proc.terminate()


def _process_context():
    """Worker processes from a fork server that has imported this module once (importing
    torch and transformers takes ~7 s of CPU per process, which three spawned workers would
    spend at the same time on the cores that train); plain ``spawn`` where there is no fork
    server (Windows). Not ``fork``: forking after torch's thread pools have started is unsafe."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")


def _progress(config: DemoConfig, seed: int, enabled: bool) -> dict:
    """One progress bar per model, each counting that model's ``config.steps`` optimiser steps
    (700 in the CPU preset) and showing its latest training loss."""
    import sys

    from tqdm.auto import tqdm

    if enabled:
        print(f"parity, {config.name} preset, seed {seed}: {len(POSITIONS)} models of {config.steps} steps each", file=sys.stderr)
    width = max(len(label) for label in LABELS.values())
    return {kind: tqdm(total=config.steps, desc=f"{LABELS[kind]:<{width}}", unit="step", position=index, leave=True,
                       disable=not enabled, dynamic_ncols=True)
            for index, kind in enumerate(POSITIONS)}


def check_targets(results: dict) -> dict[str, bool]:
    """The demo's claims: Selective RoPE >= 0.99 at the training length and >= 0.9 at
    ``eval_len``; NoPE and RoPE <= 0.1 at both."""
    acc = {kind: results["results"][kind]["seq_acc"] for kind in POSITIONS}
    return {
        "selective_rope_learns": acc["selective_rope"]["train"] >= 0.99,
        "selective_rope_extrapolates": acc["selective_rope"]["eval"] >= 0.9,
        "nope_fails": max(acc["nope"].values()) <= 0.1,
        "rope_fails": max(acc["rope"].values()) <= 0.1,
    }


def format_table(results: dict) -> str:
    """The printed summary table."""
    train, evl = results["train_len"], results["eval_len"]
    lines = [
        f"Parity (S2 word problem), 1-layer GLA, trained up to length {train}, {results['device']}, seed {results['seed']}, "
        f"{results['seconds']:.0f} s wall, {results['cpu_seconds']:.0f} s CPU",
        f"{'position encoding':<18} {'params':>7} {'seq_acc@' + str(train):>12} {'seq_acc@' + str(evl):>12} {'token_acc@' + str(evl):>14} {'final loss':>10}",
    ]
    for kind in POSITIONS:
        run = results["results"][kind]
        lines.append(
            f"{LABELS[kind]:<18} {run['parameters']:>7} {run['seq_acc']['train']:>12.3f} {run['seq_acc']['eval']:>12.3f} "
            f"{run['token_acc']['eval']:>14.3f} {run['final_loss']:>10.4f}"
        )
    angles = results["results"]["selective_rope"].get("parity_angles")
    if angles:
        lines.append(
            f"Selective RoPE's parity pair ({angles['pair']}): step per '1' π{angles['error_per_one']:+.4f} rad, per '0' "
            f"{angles['error_per_zero']:+.4f} rad; drift over {evl} uniform bits {angles['drift_at_eval_len']:+.2f} rad."
        )
    lines.append("seq_acc: fraction of fresh sequences with every position right.")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Sequence accuracy against length per encoding (training length dashed), and the training loss."""
    plt = plotting.pyplot(PLOT_PURPOSE)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in POSITIONS:
        run = results["results"][kind]
        left.plot(run["curve"]["length"], run["curve"]["seq_acc"], label=LABELS[kind])
        loss = np.asarray(run["loss"])
        window = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
        right.plot(np.arange(window, len(loss) + 1), smooth, label=LABELS[kind])
    left.axvline(results["train_len"], color="gray", linestyle="--", linewidth=1, label=f"training length {results['train_len']}")
    left.set(xlabel="sequence length", ylabel="sequence accuracy (fresh sequences)", ylim=(-0.02, 1.02), xlim=(1, results["eval_len"]),
             title="Parity: accuracy vs length")
    left.legend(loc="center right")
    right.set(xlabel="training step", ylabel="training loss (tagging cross-entropy)", yscale="log", title="Training loss")
    right.legend()
    fig.suptitle(f"1-layer GLA on parity ({results['preset']} preset, seed {results['seed']}, {results['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
