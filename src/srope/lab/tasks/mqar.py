"""Multi-query associative recall (MQAR; paper §5.1, the Zoology protocol of Arora et al. 2024).

Each example opens with ``kv_pairs`` key-value pairs (keys distinct, drawn from
``[1, vocab/2)``, values distinct, from ``[vocab/2, vocab)``); the rest of the
``seq_len`` tokens is 0 except that every key is asked once more at an even offset of the
query region. The offsets ("gaps") are drawn without replacement with probability
``∝ a·i^(a-1)`` (``i = 1 … (seq_len - 2·kv_pairs)/2``, a power law: a = 0.01 favours short
gaps). The model must output the key's value at the query position; the targets are
``IGNORE`` elsewhere and the metric is the accuracy over query positions (Zoology's mean
per-example accuracy, the same number since every example has ``kv_pairs`` queries).

Sampling without replacement uses numpy's ``choice`` for the distinct keys and values and
the Gumbel-top-k trick for the weighted gaps; both give Zoology's distributions (its code
draws the same things row by row with ``np.random.choice``).

Presets: ``release`` (default; Zoology's own GLA model, a BaseConv layer then a GLA layer, in
the Figure-2 protocol, equal field by field to the files docs/release-presets.md cites), ``zoology``
(the Zoology Figure-2 sweep the paper follows with srope's GLA-only model: vocab 8192,
(seq_len, kv_pairs) in (64,4), (128,8), (256,16), (512,64), 100,000 train and 3,000 test
examples, d_model in 64…512, 2 layers, lr in logspace(-4, -2, 4), AdamW with weight decay
0.1, 64 epochs with a cosine schedule stepped per epoch, stop once the test accuracy passes
0.99, batch 512/512/256/128 by length) and ``paper`` (the same with 8 learning rates,
logspace(-4, -2, 8): the paper's description of its grid, "[1e-4, 1e-2], 8 values", is
self-contradictory). Zoology's Figure-2 models have no MLP (state mixer = identity), and
neither have these presets' (``model.intermediate_size=0``; the ``cpu`` preset keeps one).
The ``zoology`` and ``paper`` presets' model is srope's: two GLA layers with 2 heads and no
short conv, RMSNorm, no MLP, an untied head, bf16 autocast. Zoology's own (``release``) is one
BaseConv layer followed by one GLA layer (``add_gla`` gives ``Hybrid`` the list
``[BaseConv, GLA]`` and layer ``i`` takes entry ``i % 2``). Without a convolution a GLA has no
direct way to bind a value to the key before it: at sequence 512 with 64 pairs every encoding
stayed at chance with srope's model in the runs of docs/reports/2026-12-05-mqar.md.
The paper's Selective-RoPE MQAR configuration is not released; the position options here are the authors' shared defaults. ``cpu``: one small configuration
that a laptop CPU runs in about a minute (see :data:`CPU`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from srope.lab.tasks.common import (
    IGNORE,
    ArrayStream,
    Predict,
    Prepared,
    Setting,
    TaskConfig,
    cached_arrays,
    check_train_config,
    rng_for,
    small_int,
)
from srope.lab.tasks.release import zoology_batch_size

NAME = "mqar"
# Every example has kv_pairs targets among seq_len positions, so the head at the targets only
# (head_at_targets) skips most of the logits and keeps a captured step's shapes fixed.
FEW_TARGETS = True
ZOOLOGY_LRS = tuple(float(v) for v in np.logspace(-4, -2, 4))


@dataclass
class MQARPreset(TaskConfig):
    vocab: int = 8192
    configs: tuple[str, ...] = ("64x4", "128x8", "256x16", "512x64")  # seq_len x kv_pairs
    d_models: tuple[int, ...] = (64, 128, 256, 512)
    train_examples: int = 100_000
    test_examples: int = 3_000
    power_a: float = 0.01
    random_non_queries: bool = False
    data_seed: int = 123
    lrs: tuple[float, ...] = ZOOLOGY_LRS
    weight_decays: tuple[float, ...] = (0.1,)
    seeds: tuple[int, ...] = (123,)
    batch_size: int = 0  # 0: Zoology's batch by length (512 up to 128 tokens, 256 at 256, 128 at 512, 64 above)
    eval_batch_size: int = 256
    epochs: int = 64
    schedule: str = "cosine_epoch"
    min_lr: float = 0.0
    stop_at: float | None = 0.99
    select: str = "final"
    model: dict = field(default_factory=lambda: {"num_hidden_layers": 2, "num_heads": 2, "use_short_conv": False, "intermediate_size": 0})
    position: dict = field(default_factory=lambda: {
        "rope": {"theta": 500000.0},
        "selective_rope": {"projection": "low-rank", "projection_rank": 32, "conv_activation": None, "gate": None, "bias": False,
                           "spectrum": "rope", "theta": 500000.0},
    })
    threads: int = 0  # torch's CPU threads for the run (0: torch's default)


# ``cpu``: Zoology's smallest configuration (64 tokens, 4 key-value pairs) at width 64, small
# enough for a laptop CPU: vocabulary 128 (the smallest above the length), 3,600 training
# examples for 4 epochs in batches of 32 (452 steps), one of Zoology's learning rates. The GLA
# gets its short conv (Zoology's model puts a BaseConv layer before its GLA layer; the
# ``zoology`` preset has neither): it shortens the plateau before recall forms. Its times and
# results: docs/reports/2026-12-07-preset-notes.md.
CPU = MQARPreset(
    vocab=128, configs=("64x4",), d_models=(64,), train_examples=3_600, test_examples=500, lrs=(ZOOLOGY_LRS[2],), batch_size=32, epochs=4,
    threads=1, model={"num_hidden_layers": 2, "num_heads": 2, "use_short_conv": True},
)

# ``release``: Zoology's own two-layer GLA (``models_repo.add_gla``: a BaseConv layer, then a GLA
# layer with 2 heads and no short conv) in the Figure-2 protocol, field by field as
# docs/release-presets.md cites it: LayerNorm blocks with the identity state mixer, embedding
# dropout 0.1, head tied to the embedding, Zoology's initialisation, float32. Selective RoPE and
# RoPE sit in the GLA layer (the paper's MQAR configuration is not released).
RELEASE = MQARPreset(
    architecture="zoology", precision="float32",
    model={"layers": ["base_conv", "gla"], "num_hidden_layers": 2, "num_heads": 2, "use_short_conv": False},
)

# Their names are registered in srope.lab.tasks.registry, the default (`srope synth` without --preset) first.
PRESETS = {"release": RELEASE, "zoology": MQARPreset(), "paper": MQARPreset(lrs=tuple(float(v) for v in np.logspace(-4, -2, 8))), "cpu": CPU}
RELEASE_PRESETS = ("release",)
# Figure 2 sweeps these; one run may take any of its points (and any seed).
RELEASE_VARIES = {"configs": ("64x4", "128x8", "256x16", "512x64"), "d_models": (64, 128, 256, 512), "lrs": ZOOLOGY_LRS, "seeds": None, "position_type": None}


def parse_config(text: str) -> tuple[int, int]:
    """``"512x64"`` -> (seq_len 512, kv_pairs 64)."""
    try:
        seq_len, kv_pairs = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"MQAR configs look like SEQxKV (e.g. 512x64), got {text!r}") from None
    return seq_len, kv_pairs


def power_law(space: int, power_a: float) -> np.ndarray:
    """Zoology's gap distribution over ``0 … space-1``: ``∝ a·i^(a-1)``, ``i = 1 … space``."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def weighted_without_replacement(rng: np.random.Generator, probs: np.ndarray, rows: int, k: int) -> np.ndarray:
    """``[rows, k]`` indices drawn one after another without replacement, ``∝ probs``
    (Gumbel-top-k: the k largest ``log p + Gumbel`` in decreasing order)."""
    out = np.empty((rows, k), dtype=np.int64)
    chunk = max(1, (1 << 22) // len(probs))
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        scores = np.log(probs)[None, :] + rng.gumbel(size=(n, len(probs)))
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[start : start + n] = np.take_along_axis(top, order, axis=1)
    return out


def generate(vocab: int, seq_len: int, kv_pairs: int, count: int, rng: np.random.Generator, power_a: float = 0.01, random_non_queries: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``count`` MQAR examples: inputs and targets, both ``[count, seq_len]``."""
    if seq_len % 2 or vocab <= seq_len or 4 * kv_pairs > seq_len or kv_pairs < 1:
        raise ValueError(f"MQAR needs an even seq_len < vocab and 1 <= 4*kv_pairs <= seq_len; got seq_len={seq_len}, vocab={vocab}, kv_pairs={kv_pairs}")
    context = 2 * kv_pairs
    half = vocab // 2
    keys = 1 + np.stack([rng.choice(half - 1, size=kv_pairs, replace=False) for _ in range(count)])
    values = half + np.stack([rng.choice(vocab - half, size=kv_pairs, replace=False) for _ in range(count)])
    space = (seq_len - context) // 2
    gaps = weighted_without_replacement(rng, power_law(space, power_a), count, kv_pairs)

    full = np.zeros((count, seq_len + 1), dtype=np.int64)
    full[:, 0:context:2], full[:, 1:context:2] = keys, values
    rows = np.arange(count)[:, None]
    full[rows, context + 2 * gaps] = keys
    labels = np.full((count, seq_len + 1), IGNORE, dtype=np.int64)
    labels[rows, context + 2 * gaps + 1] = values
    inputs, targets = full[:, :-1], labels[:, 1:]
    if random_non_queries:
        noise = rng.integers(0, vocab, size=inputs.shape)
        inputs = np.where(inputs == 0, noise, inputs)
    return inputs, targets


def settings(preset: MQARPreset) -> list[Setting]:
    out = []
    for config in preset.configs:
        seq_len, kv_pairs = parse_config(config)
        for d_model in preset.d_models:
            out.append(Setting(
                name=f"T{seq_len}-kv{kv_pairs}-d{d_model}", group=f"T{seq_len}-kv{kv_pairs}", vocab_size=preset.vocab, max_len=seq_len,
                params={"seq_len": seq_len, "kv_pairs": kv_pairs}, model={"hidden_size": int(d_model)}, x=float(d_model),
            ))
    return out


def check(preset: MQARPreset) -> None:
    check_train_config(preset, auto_batch=True)
    if not preset.configs or not preset.d_models:
        raise ValueError("configs and d_models must each list at least one value")
    for config in preset.configs:
        seq_len, kv_pairs = parse_config(config)
        if seq_len % 2 or preset.vocab <= seq_len or 4 * kv_pairs > seq_len or kv_pairs < 1:
            raise ValueError(f"MQAR config {config}: need an even seq_len < vocab ({preset.vocab}) and 1 <= 4*kv_pairs <= seq_len")
    if preset.batch_size < 0 or preset.train_examples < 1 or preset.test_examples < 1 or not preset.power_a > 0:
        raise ValueError("batch_size >= 0, train_examples >= 1, test_examples >= 1 and power_a > 0 are required")


def datasets(preset: MQARPreset, seq_len: int, kv_pairs: int, cache_dir: Path | str | None) -> dict[str, np.ndarray]:
    def build() -> dict[str, np.ndarray]:
        out = {}
        for split, count in (("train", preset.train_examples), ("test", preset.test_examples)):
            x, y = generate(preset.vocab, seq_len, kv_pairs, count, rng_for(preset.data_seed, NAME, seq_len, kv_pairs, split), preset.power_a, preset.random_non_queries)
            out[f"{split}_inputs"], out[f"{split}_targets"] = small_int(x), small_int(y)
        return out

    params = {"vocab": preset.vocab, "seq_len": seq_len, "kv_pairs": kv_pairs, "train": preset.train_examples, "test": preset.test_examples,
              "power_a": preset.power_a, "random_non_queries": preset.random_non_queries, "data_seed": preset.data_seed}
    return cached_arrays(NAME, params, build, cache_dir)


def prepare(preset: MQARPreset, setting: Setting, cache_dir: Path | str | None) -> Prepared:
    seq_len, kv_pairs = setting.params["seq_len"], setting.params["kv_pairs"]
    data = datasets(preset, seq_len, kv_pairs, cache_dir)
    test_x, test_y = data["test_inputs"].astype(np.int64), data["test_targets"].astype(np.int64)

    def evaluate(predict: Predict) -> dict:
        hits = total = 0
        for start in range(0, len(test_x), preset.eval_batch_size):
            y = torch.as_tensor(test_y[start : start + preset.eval_batch_size])
            preds = predict(torch.as_tensor(test_x[start : start + preset.eval_batch_size]))
            valid = y != IGNORE
            hits += int((preds[valid] == y[valid]).sum())
            total += int(valid.sum())
        return {"score": hits / total, "accuracy": hits / total}

    batch = preset.batch_size or zoology_batch_size(seq_len)
    # Zoology walks its (already random) training set in a fixed order.
    return Prepared(train=ArrayStream(data["train_inputs"], data["train_targets"], batch, shuffle=False), evaluate=evaluate, info={"batch_size": batch})
