"""String copying (paper §5.3, following Jelassi et al. 2024; the authors' ``copying`` package).

An example is ``$<s>|<s>.`` with ``<s>`` uniform over the first ``alphabet`` (26) lowercase
letters. Tokens: letters ``0 … 25``, ``$`` = 26 (BOS), ``|`` = 27 (separator), ``.`` = 28
(EOS), ``*`` = 29 (pad); vocabulary 30.

Training (as the authors do): every row is a ``context_len`` (420) character context packed
with fresh examples of length uniform in ``[min_len, max_len]`` (2–64); the last example is
cut at the context end and carries no loss. Inputs are the first 419 tokens, targets the
next tokens; the loss covers only each complete example's answer and its ``.``. Batches are
drawn fresh at every step (a seeded stream per run).

Evaluation: for every length ``L`` in ``eval_lengths`` (default 2–512; the authors' loop
stops at 511), ``eval_examples`` (1000) fresh strings, scored **teacher-forced** as the
authors do: one forward pass over ``$s|s`` and the argmax at the positions of ``|`` …
``s[L-2]`` must reproduce ``s``. ``str_acc`` is the fraction of strings copied exactly,
``char_acc`` the fraction of characters right (averaged per string). The authors pad each
eval example with ``*`` to ``max(2L+1, 420)``; trailing pads cannot change a causal model's
predictions, so they are left out. With ``autoregressive=True`` the model also generates
the answer greedily from ``$s|`` (``ar_examples`` strings per length, full recompute per
token: slow), reported as ``ar_str_acc`` / ``ar_char_acc``.

Presets: ``release`` (default; the released sweep: lr 2e-3, seeds 0–2, GLA 4 layers d512 16
heads without short conv, Selective RoPE with the first difference instead of the conv and
the rfa spectrum ε=1e-4, max 0.25, with the release's float32 rounding; gate and bias off, the sweep
also tries them; the release's initialisation), ``authors`` (the same with srope's initialisation
and the exact rfa spectrum) and ``paper``
(Table 7: lr 5e-5, seed 42). With the first difference and neither gate nor bias the phase
telescopes to ``Θ·W x̂_t``: a rotation by the current token's content alone, which carries no
position, so that arm is NoPE-like by construction; bias (``e^b`` per step) or a gate give it
position. Both: 5000 steps of batch 256, AdamW (0.9, 0.999,
ε 1e-8) with weight decay 0.1, linear warm-up over 10% then linear decay to 0, gradient
clipping at 1.0. ``epochs`` splits the steps into that many rounds with an evaluation after
each (default 1: evaluate once at the end). ``cpu``: strings of 2-8 letters, evaluated up to
16, that a laptop CPU runs in about a minute (see :data:`CPU`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from srope.lab.tasks.common import IGNORE, Predict, Prepared, SampledStream, Setting, TaskConfig, check_train_config, parse_lengths, rng_for

NAME = "copying"
BOS, SEP, EOS, PAD = 26, 27, 28, 29
SYMBOLS = {"$": BOS, "|": SEP, ".": EOS, "*": PAD}


def positions(spectrum: str) -> dict:
    """The released sweep's position options, with Selective RoPE's temperature ``spectrum``."""
    return {
        "rope": {"theta": 500000.0},
        "selective_rope": {
            "projection": "low-rank", "projection_rank": 32, "skip_conv": True, "conv_activation": None, "gate": None, "bias": False,
            "spectrum": spectrum, "epsilon": 1e-4, "max_temperature": 0.25,
        },
    }


@dataclass
class CopyingPreset(TaskConfig):
    alphabet: int = 26
    context_len: int = 420
    min_len: int = 2
    max_len: int = 64
    steps: int = 5000
    eval_lengths: str = "2-512"
    eval_examples: int = 1000
    autoregressive: bool = False
    ar_examples: int = 100
    ar_lengths: str = ""  # empty: the eval lengths
    data_seed: int = 0
    lrs: tuple[float, ...] = (2e-3,)
    weight_decays: tuple[float, ...] = (0.1,)
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 256
    eval_batch_size: int = 256
    epochs: int = 1
    grad_clip: float | None = 1.0
    schedule: str = "linear_warmup"
    warmup: float = 0.1
    select: str = "final"
    model: dict = field(default_factory=lambda: {
        "hidden_size": 512, "num_hidden_layers": 4, "num_heads": 16, "expand_k": 1.0, "expand_v": 1.0,
        "use_short_conv": False, "tie_word_embeddings": False,
    })
    position: dict = field(default_factory=lambda: positions("rfa"))
    threads: int = 0  # torch's CPU threads for the run (0: torch's default)


# ``cpu``: strings of 2-8 letters, small enough for a laptop CPU: the authors' protocol, model
# options and position options at a smaller scale (2 layers of width 64, 4 heads; 40-character
# training contexts; 450 steps of batch 40), evaluated at lengths 2-16, i.e. up to twice the
# longest training string. Its times and results: docs/reports/2026-12-07-preset-notes.md.
CPU = CopyingPreset(
    context_len=40, min_len=2, max_len=8, steps=450, batch_size=40, eval_lengths="2-16", eval_examples=200, eval_batch_size=200, seeds=(0,),
    threads=1,
    model={"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "expand_k": 1.0, "expand_v": 1.0, "use_short_conv": False,
           "tie_word_embeddings": False},
)

# ``release``: the released sweep field by field as docs/release-presets.md cites it: ``authors``
# plus the release's initialisation (N(0, 0.02) for every linear map, the φ projection's too), its
# evaluation lengths (``range(2, 512)``) and its temperatures as it computes them (``rfa-float32``:
# at ε = 1e-4 its float32 rounding makes the inner pairs 1.099 times the exact rfa spectrum, which
# ``authors`` and ``paper`` keep).
# Its four arms: the plain encoding, ``--set position.bias=true``, ``--set position.gate=standard``
# (one gate per head, the release's default parametrisation), and both.
# Their names are registered in srope.lab.tasks.registry, the default (`srope synth` without --preset) first.
PRESETS = {"release": CopyingPreset(init="release", eval_lengths="2-511", position=positions("rfa-float32")), "authors": CopyingPreset(),
           "paper": CopyingPreset(lrs=(5e-5,), seeds=(42,)), "cpu": CPU}
RELEASE_PRESETS = ("release",)
# The released sweep's axes (gate x bias, seeds); the learning rate of its grid comment or Table 7.
RELEASE_VARIES = {"position.selective_rope.gate": (None, "standard"), "position.selective_rope.bias": (True, False), "seeds": None,
                  "lrs": (5e-3, 2e-3, 1e-3, 5e-4, 1e-4, 5e-5, 1e-5), "position_type": None}


def encode(text: str) -> list[int]:
    """``"$ab|ab."`` -> token ids."""
    return [SYMBOLS[c] if c in SYMBOLS else ord(c) - ord("a") for c in text]


def decode(tokens) -> str:
    names = {v: k for k, v in SYMBOLS.items()}
    return "".join(names.get(int(t), chr(ord("a") + int(t)) if 0 <= int(t) < 26 else "?") for t in tokens)


def packed_row(rng: np.random.Generator, context_len: int, min_len: int, max_len: int, alphabet: int) -> tuple[np.ndarray, np.ndarray]:
    """One training context: tokens ``[context_len]`` and loss mask (1 on answers and ``.``)."""
    tokens, mask = [], []
    while len(tokens) < context_len:
        length = int(rng.integers(min_len, max_len + 1))
        s = rng.integers(0, alphabet, size=length).tolist()
        example = [BOS, *s, SEP, *s, EOS]
        room = context_len - len(tokens)
        if len(example) > room:  # the cut example carries no loss
            tokens += example[:room]
            mask += [0] * room
            break
        tokens += example
        mask += [0] * (length + 2) + [1] * (length + 1)
    return np.asarray(tokens, dtype=np.int64), np.asarray(mask, dtype=bool)


def train_batch(rng: np.random.Generator, batch_size: int, context_len: int, min_len: int, max_len: int, alphabet: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``[B, context_len-1]`` and next-token targets (IGNORE outside the answers)."""
    rows = [packed_row(rng, context_len, min_len, max_len, alphabet) for _ in range(batch_size)]
    tokens = np.stack([r[0] for r in rows])
    mask = np.stack([r[1] for r in rows])
    return tokens[:, :-1], np.where(mask[:, 1:], tokens[:, 1:], IGNORE)


def eval_strings(length: int, count: int, data_seed: int, alphabet: int, salt: str = "eval") -> np.ndarray:
    """``[count, length]`` strings for evaluation at one length (the same for every run)."""
    return rng_for(data_seed, NAME, salt, length).integers(0, alphabet, size=(count, length))


def teacher_forced_inputs(strings: np.ndarray) -> np.ndarray:
    """``$s|s`` (the final ``.`` is not needed to score): ``[N, 2L+2]``."""
    n, length = strings.shape
    return np.concatenate([np.full((n, 1), BOS), strings, np.full((n, 1), SEP), strings], axis=1)


def answer_predictions(logits_or_preds: torch.Tensor, length: int) -> torch.Tensor:
    """The argmax at positions ``L+1 … 2L`` (``|`` … ``s[L-2]``): the model's copy of ``s``."""
    preds = logits_or_preds.argmax(-1) if logits_or_preds.dim() == 3 else logits_or_preds
    return preds[:, length + 1 : 2 * length + 1]


def copy_scores(pred: torch.Tensor, strings: torch.Tensor) -> tuple[float, float]:
    """(exact-string accuracy, mean per-string character accuracy) over ``[N, L]`` rows."""
    if pred.shape != strings.shape or pred.dim() != 2 or pred.shape[1] < 1:
        raise ValueError(f"pred and strings must both be [N, L] with L >= 1, got {tuple(pred.shape)} and {tuple(strings.shape)}")
    hits = pred == strings
    return float(hits.all(1).double().mean()), float(hits.double().mean(1).mean())


def greedy_copy(predict: Predict, strings: np.ndarray, batch_size: int) -> torch.Tensor:
    """Generate ``L`` tokens greedily after ``$s|`` (no cache: one full forward per token)."""
    n, length = strings.shape
    outputs = []
    for start in range(0, n, batch_size):
        chunk = strings[start : start + batch_size]
        seq = torch.as_tensor(np.concatenate([np.full((len(chunk), 1), BOS), chunk, np.full((len(chunk), 1), SEP)], axis=1))
        for _ in range(length):
            nxt = predict(seq)[:, -1:]
            seq = torch.cat([seq, nxt], dim=1)
        outputs.append(seq[:, length + 2 :])
    return torch.cat(outputs)


def settings(preset: CopyingPreset) -> list[Setting]:
    longest = max(parse_lengths(preset.eval_lengths))
    return [Setting(name="copy", group="copy", vocab_size=30, max_len=max(preset.context_len, 2 * longest + 2),
                    params={"min_len": preset.min_len, "max_len": preset.max_len})]


def check(preset: CopyingPreset) -> None:
    check_train_config(preset)
    if not 1 <= preset.alphabet <= 26:
        raise ValueError(f"alphabet must be in [1, 26], got {preset.alphabet}")
    if not 1 <= preset.min_len <= preset.max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {preset.min_len}, {preset.max_len}")
    if preset.context_len <= 2 * preset.max_len + 3:
        raise ValueError(f"context_len ({preset.context_len}) must exceed 2*max_len+3 ({2 * preset.max_len + 3}) so an example fits")
    if preset.steps < 1 or preset.eval_examples < 1 or preset.ar_examples < 1:
        raise ValueError("steps, eval_examples and ar_examples must be >= 1")
    parse_lengths(preset.eval_lengths)


def prepare(preset: CopyingPreset, setting: Setting, cache_dir: Path | str | None) -> Prepared:
    lengths = parse_lengths(preset.eval_lengths)
    ar_lengths = parse_lengths(preset.ar_lengths) if preset.ar_lengths else lengths

    def sample(rng: np.random.Generator):
        return train_batch(rng, preset.batch_size, preset.context_len, preset.min_len, preset.max_len, preset.alphabet)

    def evaluate(predict: Predict) -> dict:
        curves: dict[str, list[float]] = {"str_acc": [], "char_acc": []}
        for length in lengths:
            strings = eval_strings(length, preset.eval_examples, preset.data_seed, preset.alphabet)
            inputs = teacher_forced_inputs(strings)
            preds = []
            for start in range(0, len(inputs), preset.eval_batch_size):
                preds.append(answer_predictions(predict(torch.as_tensor(inputs[start : start + preset.eval_batch_size])), length))
            s_acc, c_acc = copy_scores(torch.cat(preds), torch.as_tensor(strings))
            curves["str_acc"].append(s_acc)
            curves["char_acc"].append(c_acc)
        out = {"curves": {f"{k}_by_length": {"x": lengths, "y": v} for k, v in curves.items()}}
        if preset.autoregressive:
            ar = {"ar_str_acc": [], "ar_char_acc": []}
            for length in ar_lengths:
                strings = eval_strings(length, preset.ar_examples, preset.data_seed, preset.alphabet, salt="ar")
                s_acc, c_acc = copy_scores(greedy_copy(predict, strings, preset.eval_batch_size), torch.as_tensor(strings))
                ar["ar_str_acc"].append(s_acc)
                ar["ar_char_acc"].append(c_acc)
            out["curves"].update({f"{k}_by_length": {"x": ar_lengths, "y": v} for k, v in ar.items()})
        for name, values in curves.items():
            inside = [v for length, v in zip(lengths, values) if length <= preset.max_len]
            beyond = [v for length, v in zip(lengths, values) if length > preset.max_len]
            out[f"{name}_mean"] = float(np.mean(values))
            if inside:
                out[f"{name}_train_range"] = float(np.mean(inside))
            if beyond:
                out[f"{name}_extrapolation"] = float(np.mean(beyond))
        out["score"] = out["str_acc_mean"]
        return out

    steps_per_round = math.ceil(preset.steps / preset.epochs)
    return Prepared(train=SampledStream(sample, steps_per_round), evaluate=evaluate, total_steps=preset.steps, info={"eval_lengths": [lengths[0], lengths[-1], len(lengths)]})
