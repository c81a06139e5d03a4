"""MAD: the six Mechanistic Architecture Design tasks (Poli et al. 2024; paper §5.2, App. B.2.1).

Tasks and their targets (``IGNORE`` = no loss, no metric):

- ``in-context-recall``: key-value pairs (keys from the lower, values from the upper half of
  the non-special vocabulary; a key keeps its value within a sequence); multi-query: every
  repeated key's value is a test target. The sequence ends with a probe of a presented key.
- ``noisy-in-context-recall``: the same with pairs replaced by noise tokens (from the last
  ``noise_vocab_size`` tokens) with probability ``frac_noise``.
- ``fuzzy-in-context-recall``: keys and values are motifs of 1-3 distinct tokens (test keys
  always 3), left-padded to the length; the values of repeated keys are test targets.
- ``selective-copying``: ``num_tokens_to_copy`` tokens scattered among blanks, a copy token,
  then blanks at which the tokens must be reproduced in order.
- ``compression``: a random sequence ending in a compression token is encoded to one vector
  (the last position's hidden state) and decoded back at every position (an auto-encoder;
  :class:`CompressionAutoEncoder` wraps any causal model).
- ``memorization``: pairs ``key, insert`` whose value (the target at ``insert``) comes from a
  fixed random key→value map shared by every sequence and split.

As in MAD, the *training* targets of the three recall tasks are the plain next tokens of the
whole sequence, while their *test* targets are only the recall positions; the other tasks
train and test on the same targets. MAD's accuracy is torchmetrics' macro average over
classes (:meth:`srope.lab.tasks.common.ClassCounts.macro`) of each test batch of 128
(``eval_batch_size``), averaged over the batches as Lightning averages logged values; the macro
average of the whole test set is recorded beside it (``accuracy_macro_pooled``: higher on
the memorisation task's large vocabularies, whose classes a batch sees only in part).
``accuracy="micro"`` scores the plain fraction of right targets.

The 66 settings: each task's baseline plus every single-factor change (11 + 11 + 14 + 13 +
11 + 6), enumerated by :func:`all_settings`. Protocol (identical in the authors' configs and
the paper): for each setting train with lr in {1e-4, 5e-4, 1e-3} x weight decay in {0, 0.1},
batch 128, up to 200 epochs, AdamW, cosine over epochs to 1e-6, stop when the test accuracy
has not improved for 20 epochs or exceeds 0.999; the test accuracy of the checkpoint with the
lowest test loss (MAD's best checkpoint, evaluated after training) is the run's result
(``select="min_loss"``; the final and the highest accuracy are recorded beside it). Score
(:func:`protocol_score`): best over the optimiser grid per setting, mean over each task's
settings, then mean over tasks. 12,800 train (unless the setting
changes it) and 1,280 test examples per setting. Presets: ``paper`` (default; this protocol) and
``cpu`` (in-context recall's baseline only, small enough for a laptop CPU; see :data:`CPU`).

The generators, and where they deviate from MAD-Lab's: :mod:`srope.lab.tasks.mad_generators`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from srope.lab.tasks.common import (
    ArrayStream,
    ClassCounts,
    Predict,
    Prepared,
    Setting,
    TaskConfig,
    cached_arrays,
    check_train_config,
    rng_for,
    small_int,
)
from srope.lab.tasks.mad_generators import compression, fuzzy_in_context_recall, in_context_recall, memorization, selective_copying

NAME = "mad"

# The task registry: baseline settings and the values each factor is changed to (MAD-Lab's
# configs/tasks/*.yml, as released in the authors' repository).
MAD_TASKS: dict[str, dict] = {
    "in-context-recall": {
        "baseline": {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True},
        "changes": {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024], "num_train_examples": [6400, 3200, 1600, 800]},
    },
    "fuzzy-in-context-recall": {
        "baseline": {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True, "k_motif_size": 3, "v_motif_size": 3},
        "changes": {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024], "num_train_examples": [6400, 3200, 1600, 800]},
    },
    "noisy-in-context-recall": {
        "baseline": {"vocab_size": 32, "noise_vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True, "frac_noise": 0.2},
        "changes": {"vocab_size": [48, 80, 144], "seq_len": [256, 512, 1024], "num_train_examples": [6400, 3200, 1600, 800], "frac_noise": [0.4, 0.6, 0.8]},
    },
    "selective-copying": {
        "baseline": {"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16, "num_train_examples": 12800},
        "changes": {"vocab_size": [32, 64, 128], "seq_len": [512, 1024], "num_train_examples": [6400, 3200, 1600, 800], "num_tokens_to_copy": [32, 64, 96]},
    },
    "compression": {
        "baseline": {"vocab_size": 16, "seq_len": 32, "num_train_examples": 12800},
        "changes": {"vocab_size": [32, 64, 128], "seq_len": [64, 128, 256], "num_train_examples": [6400, 3200, 1600, 800]},
    },
    "memorization": {
        "baseline": {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256},
        "changes": {"vocab_size": [512, 1024, 2048, 4096, 8192]},
    },
}
SETTINGS_PER_TASK = {"in-context-recall": 11, "fuzzy-in-context-recall": 11, "noisy-in-context-recall": 14, "selective-copying": 13, "compression": 11, "memorization": 6}

_SELECTIVE_ROPE = {  # the authors' MAD module defaults, in srope.modules.SelectiveRoPE terms
    "projection": "low-rank", "projection_rank": 16, "conv_size": 4, "conv_activation": None, "gate": None, "bias": False,
    "spectrum": "rope", "theta": 500000.0,
}


@dataclass
class MADPreset(TaskConfig):
    tasks: tuple[str, ...] = tuple(MAD_TASKS)
    only: tuple[str, ...] = ()  # setting names to keep (empty: all settings of ``tasks``)
    num_test_examples: int = 1280
    max_train_examples: int | None = None  # cap (quick runs); None: the setting's count
    accuracy: str = "macro"
    data_seed: int = 12345
    lrs: tuple[float, ...] = (1e-4, 5e-4, 1e-3)
    weight_decays: tuple[float, ...] = (0.0, 0.1)
    seeds: tuple[int, ...] = (12345,)
    batch_size: int = 128
    eval_batch_size: int = 128
    epochs: int = 200
    schedule: str = "cosine_epoch"
    min_lr: float = 1e-6
    stop_at: float | None = 0.999
    patience: int | None = 20
    select: str = "min_loss"  # MAD tests the checkpoint of the lowest test loss
    model: dict = field(default_factory=lambda: {
        "hidden_size": 128, "num_hidden_layers": 2, "num_heads": 8, "expand_k": 1.0, "expand_v": 1.0, "intermediate_size": 512,  # MAD's dim_inner
        "use_short_conv": False, "gate_logit_normalizer": 16, "gate_low_rank_dim": 16,
    })
    position: dict = field(default_factory=lambda: {"rope": {"theta": 500000.0}, "selective_rope": dict(_SELECTIVE_ROPE)})
    threads: int = 0  # torch's CPU threads for the run (0: torch's default)


# ``cpu``: one MAD setting, in-context recall's baseline (vocabulary 16, 128 tokens), small enough
# for a 2-core CPU: 1,600 of its 12,800 training examples, 256 test examples, 4 epochs in batches
# of 32, one point of MAD's optimiser grid (lr 1e-3, no weight decay), MAD's model at width 64
# with 4 heads. The GLA gets its short conv (MAD's has none) because without it this budget does
# not learn the baseline. One setting cannot show the paper's effect, which is spread over the
# task's 11. Measurements: docs/reports/2026-12-07-preset-notes-mad.md.
CPU = MADPreset(
    tasks=("in-context-recall",), only=("in-context-recall/baseline",), num_test_examples=256, max_train_examples=1_600, lrs=(1e-3,),
    weight_decays=(0.0,), batch_size=32, epochs=4, threads=1,
    model={"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "expand_k": 1.0, "expand_v": 1.0, "hidden_ratio": 4, "use_short_conv": True,
           "gate_logit_normalizer": 16, "gate_low_rank_dim": 16},
)

# Their names are registered in srope.lab.tasks.registry, the default (`srope synth` without --preset) first.
PRESETS = {"paper": MADPreset(), "cpu": CPU}


# ---------------------------------------------------------------------------------------
# Settings


def setting_name(task: str, change: str | None = None, value=None) -> str:
    return f"{task}/baseline" if change is None else f"{task}/{change}={value}"


def all_settings() -> list[tuple[str, str, dict]]:
    """All (task, setting name, parameters) of the benchmark: the baseline and each single change."""
    out = []
    for task, spec in MAD_TASKS.items():
        out.append((task, setting_name(task), dict(spec["baseline"])))
        for key, values in spec["changes"].items():
            for value in values:
                out.append((task, setting_name(task, key, value), {**spec["baseline"], key: value}))
    return out


def settings(preset: MADPreset) -> list[Setting]:
    chosen = []
    for task, name, params in all_settings():
        if task in preset.tasks and (not preset.only or name in preset.only):
            chosen.append(Setting(name=name, group=task, vocab_size=params["vocab_size"], max_len=params["seq_len"], params={"task": task, **params}))
    return chosen


def check(preset: MADPreset) -> None:
    check_train_config(preset)
    unknown = [t for t in preset.tasks if t not in MAD_TASKS]
    if unknown or not preset.tasks:
        raise ValueError(f"unknown MAD tasks {unknown}; valid: {', '.join(MAD_TASKS)}")
    names = {name for _, name, _ in all_settings()}
    missing = [n for n in preset.only if n not in names]
    if missing:
        raise ValueError(f"unknown MAD settings {missing}; names look like 'in-context-recall/baseline' or 'compression/vocab_size=32'")
    if not settings(preset):
        raise ValueError("the chosen tasks and 'only' leave no MAD setting to run")
    if preset.accuracy not in ("macro", "micro"):
        raise ValueError(f"accuracy must be 'macro' or 'micro', got {preset.accuracy!r}")
    if preset.num_test_examples < 1 or (preset.max_train_examples is not None and preset.max_train_examples < 1):
        raise ValueError("num_test_examples and max_train_examples must be >= 1")


# ---------------------------------------------------------------------------------------
# Data: the generators (srope.lab.tasks.mad_generators) seeded per setting and split


def memorization_map(vocab_size: int, seed: int) -> np.ndarray:
    """The fixed key→value map: ``map[k]`` for keys ``0 … (vocab_size-1)//2 - 1`` (injective)."""
    symbols = vocab_size - 1
    n_keys = symbols // 2
    return n_keys + rng_for(seed, NAME, "memorization-map", vocab_size).permutation(symbols - n_keys)[:n_keys]


def generate(params: dict, split: str, count: int, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` examples of the setting ``params`` for ``split`` ("train" or "test")."""
    task = params["task"]
    p = {k: v for k, v in params.items() if k not in ("task", "num_train_examples")}
    rng = rng_for(data_seed, NAME, json.dumps(params, sort_keys=True), split)
    training = split == "train"
    if task in ("in-context-recall", "noisy-in-context-recall"):
        return in_context_recall(rng, count, training=training, **p)
    if task == "fuzzy-in-context-recall":
        return fuzzy_in_context_recall(rng, count, training=training, **p)
    if task == "selective-copying":
        return selective_copying(rng, count, training=training, **p)
    if task == "compression":
        return compression(rng, count, training=training, **p)
    if task == "memorization":
        return memorization(rng, count, kv_map=memorization_map(p["vocab_size"], data_seed), training=training, **p)
    raise ValueError(f"unknown MAD task {task!r}; valid: {', '.join(MAD_TASKS)}")


# ---------------------------------------------------------------------------------------
# The compression auto-encoder


def sincos_positions(length: int, dim: int) -> torch.Tensor:
    """Fixed sinusoidal position embeddings ``[length, dim]`` (sin half, then cos half)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * freq[None, :]
    emb = torch.cat([angles.sin(), angles.cos()], dim=1)
    return torch.cat([emb, torch.zeros(length, dim - 2 * half)], dim=1)


def _output_layer(model: nn.Module) -> nn.Module:
    getter = getattr(model, "get_output_embeddings", None)
    layer = getter() if callable(getter) else None
    for name in ("lm_head", "head", "output"):
        if layer is None and isinstance(getattr(model, name, None), nn.Module):
            layer = getattr(model, name)
    if layer is None:
        raise TypeError("compression needs the model's output layer to read its hidden states: provide get_output_embeddings() or an lm_head/head attribute")
    return layer


class CompressionAutoEncoder(nn.Module):
    """MAD's compression backbone around any causal model: the hidden state entering the
    model's output layer at the last position is the code; an MLP decoder (norm, linear,
    GELU, twice) adds fixed sinusoidal position embeddings and unembeds every position."""

    def __init__(self, backbone: nn.Module, vocab_size: int, seq_len: int):
        super().__init__()
        self.backbone = backbone
        self._hidden: list[torch.Tensor] = []
        _output_layer(backbone).register_forward_pre_hook(lambda _m, args: self._hidden.append(args[0]))
        device = next(backbone.parameters()).device
        with torch.no_grad():
            dim = self._encode(torch.zeros(1, seq_len, dtype=torch.long, device=device)).shape[-1]
        self.register_buffer("positions", sincos_positions(seq_len, dim), persistent=False)
        self.decoder = nn.Sequential(nn.RMSNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.RMSNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.unembed = nn.Sequential(nn.RMSNorm(dim), nn.Linear(dim, vocab_size))
        for layer in (*self.decoder, *self.unembed):
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)

    def _encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._hidden.clear()
        self.backbone(input_ids)
        if len(self._hidden) != 1:
            raise RuntimeError(f"expected one call of the output layer per forward, saw {len(self._hidden)}")
        return self._hidden.pop()[:, -1]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        code = self._encode(input_ids)
        x = code[:, None, :] + self.positions[: input_ids.shape[1]].to(code.dtype)[None]
        return self.unembed(self.decoder(x))


# ---------------------------------------------------------------------------------------
# Data, evaluation and the protocol score


def datasets(preset: MADPreset, setting: Setting, cache_dir: Path | str | None) -> dict[str, np.ndarray]:
    params = setting.params
    n_train = params["num_train_examples"] if preset.max_train_examples is None else min(params["num_train_examples"], preset.max_train_examples)

    def build() -> dict[str, np.ndarray]:
        train = generate(params, "train", n_train, preset.data_seed)
        test = generate(params, "test", preset.num_test_examples, preset.data_seed)
        return {"train_inputs": small_int(train[0]), "train_targets": small_int(train[1]), "test_inputs": small_int(test[0]), "test_targets": small_int(test[1])}

    return cached_arrays(NAME, {**params, "n_train": n_train, "n_test": preset.num_test_examples, "data_seed": preset.data_seed}, build, cache_dir)


def prepare(preset: MADPreset, setting: Setting, cache_dir: Path | str | None) -> Prepared:
    data = datasets(preset, setting, cache_dir)
    test_x, test_y = data["test_inputs"].astype(np.int64), data["test_targets"].astype(np.int64)
    vocab = setting.vocab_size

    def evaluate(predict: Predict) -> dict:
        counts, by_batch, nll, scored = ClassCounts(vocab), [], 0.0, 0
        for start in range(0, len(test_x), preset.eval_batch_size):
            targets = torch.as_tensor(test_y[start : start + preset.eval_batch_size])
            preds, batch_nll, batch_scored = predict(torch.as_tensor(test_x[start : start + preset.eval_batch_size]), targets)
            nll, scored = nll + batch_nll, scored + batch_scored
            batch = ClassCounts(vocab)
            batch.update(preds, targets)
            counts.merge(batch)
            by_batch.append((batch.macro(), len(preds)))
        # MAD logs each test batch's macro accuracy and Lightning averages them, by rows
        macro = sum(value * rows for value, rows in by_batch) / sum(rows for _, rows in by_batch)
        micro = counts.micro()
        return {"score": macro if preset.accuracy == "macro" else micro, "accuracy_macro": macro, "accuracy_micro": micro,
                "accuracy_macro_pooled": counts.macro(), "loss": nll / max(scored, 1)}

    wrap = None
    if setting.params["task"] == "compression":
        def wrap(model: nn.Module) -> nn.Module:
            return CompressionAutoEncoder(model, vocab, setting.params["seq_len"])
    stream = ArrayStream(data["train_inputs"], data["train_targets"], preset.batch_size, shuffle=True)
    return Prepared(train=stream, evaluate=evaluate, wrap_model=wrap, info={"train_examples": len(data["train_inputs"])})


def protocol_score(best_by_setting: dict[str, float]) -> dict:
    """MAD score from each setting's result (already the best over the optimiser grid):
    mean over each task's settings, then over tasks. ``complete`` says whether all 66 are in."""
    per_task: dict[str, list[float]] = {}
    known = {name: task for task, name, _ in all_settings()}
    for name, score in best_by_setting.items():
        if name not in known:
            raise ValueError(f"unknown MAD setting {name!r}")
        per_task.setdefault(known[name], []).append(float(score))
    task_means = {task: float(np.mean(v)) for task, v in per_task.items()}
    counts = {task: len(v) for task, v in per_task.items()}
    return {
        "per_task": task_means,
        "settings_per_task": counts,
        "average": float(np.mean(list(task_means.values()))) if task_means else float("nan"),
        "complete": counts == SETTINGS_PER_TASK,
    }


def aggregate(per_setting: dict[str, dict]) -> dict:
    """Task-level summary for the runner: the MAD score over the settings that were run."""
    return protocol_score({name: entry["score_mean"] for name, entry in per_setting.items()})
