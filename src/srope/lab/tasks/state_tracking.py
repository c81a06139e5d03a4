"""State tracking: word problems on finite groups (paper §5.4; DeltaProduct / Grazzi et al.).

A sequence ``x_1 … x_L`` of group elements is tagged with the state after every prefix,
``s_t = x_1 · … · x_t`` (:mod:`srope.lab.tasks.groups` fixes the product convention). On ``S2``
this is parity: ``s_t`` is the XOR of the bits so far.

Tokens: element ``g`` is token ``g`` (``0 … |G|-1``, the identity is 0), ``BOS = |G|``,
``PAD = |G| + 1`` (unused with fixed lengths), so the vocabulary has ``|G| + 2`` entries
(the authors' word-level tokenizer adds 7 specials; the 5 extra are never used). As the
authors do, BOS is prepended to the input *and* to the labels, position ``i`` is trained to
predict ``s_i`` (no shift; position 0 predicts BOS), and the loss covers every position.

Metrics (the authors' ``metrics.py`` / ``utils.py``): ``sequence_accuracy`` is the fraction of
sequences with every position right (BOS included); the per-length curve
``cumulative_accuracy[t]`` is the fraction whose first ``t`` elements (and BOS) are all
right, so the curve at the training length is the sequence accuracy on fresh
training-length sequences.

Presets: ``release`` (default; the released sweep: group S2, 1-layer GLA d384 12 heads with a
short conv, lr 5e-4, batch 1024, seeds 0-4, Selective RoPE with uniform temperature 1, bias
on, gate off; the release's initialisation, pure-bf16 weights and vocabulary),
``release_attention`` (the same on the released 1-layer Transformer), ``authors`` (the
released sweep with srope's initialisation and float32 weights under bf16 autocast) and
``paper`` (Table 6: batch 4096, lr 1e-3, seeds 555-999). Both: 2,000,000
train sequences of length 128, 500,000 eval sequences of length 512 (the authors do not
state their set sizes), AdamW (0.9, 0.999) with weight decay 1e-6, cosine over all steps, no
clipping, 100 epochs, evaluation every epoch, stop once the best eval sequence accuracy
reaches 0.99, report the best eval. ``paper_a3``: the paper's A3 run, a 2-layer DeltaNet
(our ``gated_deltanet`` mixer with ``use_forget_gate=False``). ``cpu``: parity at length 16,
evaluated at 32, that a laptop CPU runs in about a minute (see :data:`CPU`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from srope.lab.tasks.common import (
    ArrayStream,
    Predict,
    Prepared,
    Setting,
    TaskConfig,
    cached_arrays,
    check_train_config,
    rng_for,
)
from srope.lab.tasks.groups import Group, get_group, prefix_products

NAME = "state_tracking"

_SELECTIVE_ROPE = {  # the authors' state-tracking sweep, in srope.modules.SelectiveRoPE terms
    "projection": "low-rank", "projection_rank": 32, "conv_size": 4, "conv_activation": None,
    "gate": None, "bias": True, "spectrum": "uniform", "max_temperature": 1.0,
}


@dataclass
class StateTrackingPreset(TaskConfig):
    group: str = "S2"
    train_len: int = 128
    eval_len: int = 512
    train_size: int = 2_000_000
    eval_size: int = 500_000
    distinct: bool = True  # distinct sequences within a split, as the authors' generator draws
    unused_tokens: int = 0  # vocabulary entries never used (the release's tokenizer has 7 specials, we use 2)
    data_seed: int = 0
    lrs: tuple[float, ...] = (5e-4,)
    weight_decays: tuple[float, ...] = (1e-6,)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    batch_size: int = 1024
    eval_batch_size: int = 1024
    epochs: int = 100
    schedule: str = "cosine"
    stop_at: float | None = 0.99
    stop_inclusive: bool = True
    select: str = "best"
    model: dict = field(default_factory=lambda: {
        "hidden_size": 384, "num_hidden_layers": 1, "num_heads": 12, "expand_k": 1.0, "expand_v": 1.0, "use_short_conv": True,
    })
    position: dict = field(default_factory=lambda: {"rope": {"theta": 500000.0}, "selective_rope": dict(_SELECTIVE_ROPE)})
    threads: int = 0  # torch's CPU threads for the run (0: torch's default)


# ``cpu``: parity trained at length 16 and scored at 32, small enough for a laptop CPU (600 steps
# of batch 128 over 12,800 distinct sequences). The model and the Selective RoPE options are the
# CPU recipe of ``srope demo`` (srope/lab/demo/config.py says why each one is there); the demo's
# length curriculum, weight average and encoding-specific weight decay are not part of this
# protocol. Its times and results: docs/reports/2026-12-07-preset-notes.md.
_CPU_SELECTIVE_ROPE = {
    "projection": "full-rank", "conv_size": 1, "conv_activation": None, "bias": True, "gate": "per-channel",
    "spectrum": "uniform", "max_temperature": math.pi, "phase_noise": 0.1, "projection_gain": 8.0,
}
CPU = StateTrackingPreset(
    train_len=16, eval_len=32, train_size=12_800, eval_size=1_000, lrs=(1.5e-3,), weight_decays=(0.1,), seeds=(0,), batch_size=128,
    eval_batch_size=250, epochs=6, threads=1,
    model={"hidden_size": 64, "num_hidden_layers": 1, "num_heads": 4, "expand_k": 0.5, "expand_v": 1.0, "use_short_conv": True,
           "gate_logit_normalizer": 256.0},
    position={"rope": {"theta": 500000.0}, "selective_rope": dict(_CPU_SELECTIVE_ROPE)},
)

# ``release`` / ``release_attention``: the released sweep (``configs/state_tracking``) on GLA and
# on the Transformer (``model=attn``), field by field as docs/release-presets.md cites it: what
# ``authors`` has, plus the release's initialisation (N(0, 0.02) for every linear map and conv),
# its pure-bf16 weights and its 9-entry vocabulary. The set sizes are not released (ours).
_RELEASE = dict(init="release", precision="bf16", unused_tokens=5)
# Their names are registered in srope.lab.tasks.registry, the default (`srope synth` without --preset) first.
PRESETS = {
    "release": StateTrackingPreset(**_RELEASE),
    "release_attention": StateTrackingPreset(
        **_RELEASE, mixer="attention", model={"hidden_size": 384, "num_hidden_layers": 1, "num_heads": 12, "qk_norm": False},
    ),
    "authors": StateTrackingPreset(),
    "paper": StateTrackingPreset(lrs=(1e-3,), batch_size=4096, seeds=(555, 666, 777, 888, 999)),
    "paper_a3": StateTrackingPreset(
        group="A3", lrs=(1e-3,), batch_size=4096, seeds=(555, 666, 777, 888, 999), mixer="gated_deltanet",
        model={"hidden_size": 384, "num_hidden_layers": 2, "num_heads": 12, "use_short_conv": True, "use_forget_gate": False},
    ),
    "cpu": CPU,
}
RELEASE_PRESETS = ("release", "release_attention")
# The released sweep's axes: the encoding, the seeds, the learning rates of its grid comment.
RELEASE_VARIES = {"position_type": None, "seeds": None, "lrs": (1e-2, 1e-3, 5e-4, 1e-4)}


def vocab_size(group: Group) -> int:
    return group.order + 2


def bos_id(group: Group) -> int:
    return group.order


def sample_words(group: Group, length: int, count: int, rng: np.random.Generator, distinct: bool = True) -> np.ndarray:
    """``[count, length]`` uniform words over the group (distinct rows when ``distinct``; then
    ``count`` is capped at ``|G|^length``)."""
    if length < 1 or count < 1:
        raise ValueError(f"length and count must be >= 1, got {length} and {count}")
    dtype = np.uint8 if group.order <= 255 else np.int16
    if not distinct:
        return rng.integers(0, group.order, size=(count, length), dtype=dtype)
    total = group.order ** length if length * np.log2(max(group.order, 2)) < 62 else None
    if total is not None:
        count = min(count, total)
    words = np.empty((0, length), dtype=dtype)
    while len(words) < count:
        fresh = rng.integers(0, group.order, size=(count - len(words), length), dtype=dtype)
        words = np.concatenate([words, fresh])
        words = words[np.sort(np.unique(_row_hash(words), return_index=True)[1])]  # keep first copies
    return words[:count]


def _row_hash(words: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row: the row's bytes as 64-bit words, each mixed (odd multiply,
    xor-shift) and summed mod 2^64. Equal rows hash equal; different rows collide with
    negligible probability (then one of them is dropped)."""
    raw = np.ascontiguousarray(words).view(np.uint8).reshape(len(words), -1)
    raw = np.pad(raw, ((0, 0), (0, -raw.shape[1] % 8)))
    blocks = raw.view(np.uint64)
    multipliers = np.random.default_rng(0).integers(1, 2**63, size=blocks.shape[1], dtype=np.uint64) | np.uint64(1)
    total = np.zeros(len(words), dtype=np.uint64)
    for j in range(blocks.shape[1]):
        mixed = blocks[:, j] * multipliers[j]
        total += mixed ^ (mixed >> np.uint64(29))
    return total


def make_split(group: Group, length: int, count: int, rng: np.random.Generator, distinct: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Model inputs ``[BOS, x_1 … x_L]`` and tagging targets ``[BOS, s_1 … s_L]``, ``[N, L+1]``."""
    return tag_words(group, sample_words(group, length, count, rng, distinct))


def tag_words(group: Group, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and tagging targets (as :func:`make_split`) of given words ``[N, L]``."""
    states = prefix_products(group, words).astype(words.dtype)
    bos = np.full((len(words), 1), bos_id(group), dtype=words.dtype)
    return np.concatenate([bos, words], axis=1), np.concatenate([bos, states], axis=1)


def cumulative_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """``[T]``: entry ``t`` is the fraction of rows whose positions ``0..t`` are all right."""
    if preds.shape != targets.shape or preds.dim() != 2:
        raise ValueError(f"preds and targets must both be [N, T], got {tuple(preds.shape)} and {tuple(targets.shape)}")
    prefix_ok = torch.cumprod((preds == targets).long(), dim=1)
    return prefix_ok.double().mean(0).numpy()


def sequence_accuracy(preds: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of rows with every position right."""
    if preds.shape != targets.shape or preds.dim() != 2:
        raise ValueError(f"preds and targets must both be [N, T], got {tuple(preds.shape)} and {tuple(targets.shape)}")
    return float((preds == targets).all(dim=1).double().mean())


def settings(preset: StateTrackingPreset) -> list[Setting]:
    group = get_group(preset.group)
    return [Setting(name=preset.group, group=preset.group, vocab_size=vocab_size(group) + preset.unused_tokens, max_len=max(preset.train_len, preset.eval_len) + 1,
                    params={"group": preset.group, "train_len": preset.train_len, "eval_len": preset.eval_len})]


def check(preset: StateTrackingPreset) -> None:
    check_train_config(preset)
    get_group(preset.group)
    if preset.train_len < 1 or preset.eval_len < 1 or preset.train_size < 1 or preset.eval_size < 1:
        raise ValueError("train_len, eval_len, train_size and eval_size must be >= 1")
    if not isinstance(preset.unused_tokens, int) or preset.unused_tokens < 0:
        raise ValueError(f"unused_tokens must be an integer >= 0, got {preset.unused_tokens!r}")


def datasets(preset: StateTrackingPreset, cache_dir: Path | str | None) -> dict[str, np.ndarray]:
    """Train and eval arrays for the preset (cached on disk when large)."""
    group = get_group(preset.group)

    def build() -> dict[str, np.ndarray]:
        train_x, train_y = make_split(group, preset.train_len, preset.train_size, rng_for(preset.data_seed, NAME, preset.group, "train"), preset.distinct)
        eval_x, eval_y = make_split(group, preset.eval_len, preset.eval_size, rng_for(preset.data_seed, NAME, preset.group, "eval"), preset.distinct)
        return {"train_inputs": train_x, "train_targets": train_y, "eval_inputs": eval_x, "eval_targets": eval_y}

    params = {k: getattr(preset, k) for k in ("group", "train_len", "eval_len", "train_size", "eval_size", "distinct", "data_seed")}
    return cached_arrays(NAME, params, build, cache_dir)


def prepare(preset: StateTrackingPreset, setting: Setting, cache_dir: Path | str | None) -> Prepared:
    data = datasets(preset, cache_dir)
    eval_x, eval_y = data["eval_inputs"], data["eval_targets"]
    train_len = preset.train_len

    def evaluate(predict: Predict) -> dict:
        ok_prefix = np.zeros(eval_x.shape[1], dtype=np.float64)
        token_hits = 0
        for start in range(0, len(eval_x), preset.eval_batch_size):
            x = torch.as_tensor(eval_x[start : start + preset.eval_batch_size].astype(np.int64))
            y = torch.as_tensor(eval_y[start : start + preset.eval_batch_size].astype(np.int64))
            preds = predict(x)
            ok_prefix += cumulative_accuracy(preds, y) * len(x)
            token_hits += int((preds == y).sum())
        curve = ok_prefix / len(eval_x)
        lengths = list(range(1, eval_x.shape[1]))
        out = {
            "score": float(curve[-1]),
            "seq_acc": float(curve[-1]),
            "token_acc": token_hits / eval_x.size,
            "curves": {"seq_acc_by_length": {"x": lengths, "y": [float(v) for v in curve[1:]]}},
        }
        if train_len < eval_x.shape[1]:
            out["seq_acc_at_train_len"] = float(curve[train_len])
        return out

    stream = ArrayStream(data["train_inputs"], data["train_targets"], preset.batch_size, shuffle=True)
    return Prepared(train=stream, evaluate=evaluate, info={"train_size": len(data["train_inputs"]), "eval_size": len(eval_x)})
