"""The demo's sequences: the training stream the three encodings share, and the fresh
evaluation sets (parity from :mod:`srope.lab.tasks.state_tracking`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from srope.lab.demo.config import GROUP, DemoConfig
from srope.lab.tasks import state_tracking
from srope.lab.tasks.common import rng_for
from srope.lab.tasks.groups import get_group


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
