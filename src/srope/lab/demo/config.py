"""What a demo run depends on besides the seed and the device: :class:`DemoConfig` (model,
curriculum, schedule, evaluation) and the two presets, :data:`CPU` and :data:`CUDA`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from srope.lab.config import RunConfig
from srope.lab.schedule import stage_of, warmup_stable_decay_by_stage
from srope.registry import positions

# The encodings the demo compares (its experiment, with DemoConfig's options for two of them and
# targets for each: not every registered encoding), named and labelled as in srope.registry.
POSITIONS = ("nope", "rope", "selective_rope")
LABELS = {kind: positions[kind].label for kind in POSITIONS}
DEVICES = ("cpu", "cuda")
GROUP = "S2"  # parity


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
    cuda_graph: str = "off"  # on CUDA: "auto" captures each curriculum stage's step as a CUDA graph (srope.lab.graphed)
    # On CUDA, how much Triton autotunes (srope.lab.tasks.autotune): "first" takes each kernel's
    # first candidate, so a fresh machine spends no tens of seconds timing fla's kernels for a
    # model this small, whose step the graph makes launch-bound anyway.
    autotune: str = "full"
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
        if self.cuda_graph not in ("off", "auto", "on"):
            raise ValueError(f"cuda_graph must be 'off', 'auto' or 'on', got {self.cuda_graph!r}")
        if self.autotune not in ("full", "first"):
            raise ValueError(f"autotune must be 'full' or 'first', got {self.autotune!r}")
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
