"""Learning-rate schedules of the lab: one module, pure functions of the step.

Every function returns the learning rate of optimiser step ``step`` (0-based: the rate of
the first update is ``f(0)``) out of ``total``.

- :func:`warmup_cosine`: the paper's LM schedule (``srope train``).
- :func:`task_schedule`: the synthetic tasks' named schedules (``constant``, ``cosine``,
  ``cosine_epoch``, ``linear_warmup``).
- :func:`warmup_stable_decay`: warm-up, constant, linear cooldown.
- :func:`warmup_stable_decay_by_stage`: the demo's: :func:`warmup_stable_decay` over a
  curriculum's stages, with a factor per stage and a fresh warm-up at each stage's start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TASK_SCHEDULES = ("constant", "cosine", "cosine_epoch", "linear_warmup")


def warmup_cosine(step: int, *, total: int, peak: float, start: float = 1e-5, end: float = 1e-4, warmup: float = 0.1) -> float:
    """Linear warm-up from ``start`` to ``peak`` over the first ``warmup`` fraction of
    ``total`` steps, then cosine decay to ``end`` at the last step."""
    warmup_steps = max(1, round(warmup * total)) if warmup > 0 else 0
    if step < warmup_steps:
        return start + (peak - start) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total - 1 - warmup_steps))
    return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def task_schedule(name: str, base: float, step: int, total: int, *, epoch: int = 0, epochs: int = 1, min_lr: float = 0.0,
                  warmup: float = 0.0) -> float:
    """``constant``; ``cosine`` from ``base`` to ``min_lr`` over the steps; ``cosine_epoch``
    the same over epochs, stepped once per epoch (Zoology's); ``linear_warmup`` up over the
    first ``warmup`` fraction, then linearly down to 0 (transformers'
    ``get_linear_schedule_with_warmup``)."""
    if name == "constant":
        return base
    if name == "cosine":
        return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * step / total))
    if name == "cosine_epoch":
        return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    if name == "linear_warmup":
        warm = int(warmup * total)
        factor = step / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
        return base * factor
    raise ValueError(f"unknown schedule {name!r}; expected one of {TASK_SCHEDULES}")


def warmup_stable_decay(step: int, *, total: int, peak: float, warmup_steps: int, cooldown_steps: int, min_ratio: float) -> float:
    """Linear from ``peak / warmup_steps`` to ``peak`` over the first ``warmup_steps``,
    constant, then linear down to ``min_ratio · peak`` over the last ``cooldown_steps``
    (reached at the last step)."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay_start = total - cooldown_steps
    if step < decay_start or cooldown_steps == 0:
        return peak
    return peak * (1 - (1 - min_ratio) * (step + 1 - decay_start) / cooldown_steps)


def stage_of(step: int, stage_steps: Sequence[int]) -> int:
    """The stage (0-based) of step ``step`` (0-based) when the stages run ``stage_steps``
    steps each, one after another; past the end, the last stage."""
    for stage, steps in enumerate(stage_steps):
        if step < steps:
            return stage
        step -= steps
    return len(stage_steps) - 1


def warmup_stable_decay_by_stage(step: int, *, stage_steps: Sequence[int], peak: float, warmup_steps: int, cooldown_steps: int,
                                 min_ratio: float, stage_factors: Sequence[float] | None = None, switch_warmup_steps: int = 0) -> float:
    """:func:`warmup_stable_decay` over ``sum(stage_steps)`` steps, scaled per stage (stages of
    ``stage_steps`` steps, :func:`stage_of`). With ``switch_warmup_steps`` n, the first n
    steps of every stage after the first are scaled by (k + 1) / n, k = steps into the stage
    (a fresh warm-up after each switch). With ``stage_factors``, every step is also scaled
    by its stage's factor."""
    stage = stage_of(step, stage_steps)
    scale = 1.0 if stage_factors is None else stage_factors[stage]
    if switch_warmup_steps and stage > 0:
        into = step - sum(stage_steps[:stage])
        scale *= min(1.0, (into + 1) / switch_warmup_steps)
    return scale * warmup_stable_decay(step, total=sum(stage_steps), peak=peak, warmup_steps=warmup_steps,
                                       cooldown_steps=cooldown_steps, min_ratio=min_ratio)
