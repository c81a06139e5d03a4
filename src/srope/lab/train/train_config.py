"""``srope train``'s settings: :class:`TrainConfig`, the allowed range of each, and how model and position options are read."""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from srope.lab.config import RunConfig, apply_config_file
from srope.lab.overrides import coerce, parse_literal
from srope.lab.train.corpus import local_path
from srope.lab.train.token_store import check_store_options, is_store
from srope.lab.train.tokenizer import MISTRAL_V1
from srope.models import PRESETS, preset_config
from srope.modules import position_class

# The allowed range of every numeric setting, checked by TrainConfig.resolved() (the one place).
INTEGER_RANGES = (  # name, minimum, what the smallest means
    ("max_steps", 1, ""), ("seq_len", 1, ""), ("global_batch_size", 1, ""), ("checkpoint_every", 1, ""), ("log_every", 1, ""),
    ("eval_rows", 1, ""), ("eval_every", 0, " (0: only at the end)"), ("seed", 0, ""),
)  # fmt: skip
NUMBER_RANGES = (  # name, test, the range in words (each also finite)
    ("lr", lambda v: v > 0, "> 0"),
    ("lr_start", lambda v: v >= 0, ">= 0"),
    ("lr_end", lambda v: v >= 0, ">= 0"),
    ("warmup", lambda v: 0 <= v < 1, "in [0, 1) (warmup is the fraction of the steps spent warming up)"),
    ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("eps", lambda v: v > 0, "> 0"),
    ("grad_clip", lambda v: v >= 0, ">= 0 (0: no clipping)"),
)
CHOICES = (
    ("packing", ("concat", "documents")), ("dtype", ("auto", "float32", "bfloat16")), ("parallel", ("ddp", "fsdp")),
    ("fsdp_param_dtype", ("auto", "float32")), ("cuda_graph", ("auto", "on", "off")),
)  # fmt: skip


@dataclass
class TrainConfig(RunConfig):
    """Everything a run depends on. ``None`` sizes come from the preset's training defaults."""

    preset: str = "gla-tiny"
    position: Any = "selective_rope"  # a type name or {"type": ..., options}
    model: dict = field(default_factory=dict)  # SRopeConfig overrides
    data: str = "shakespeare"
    cache: str | None = None  # data cache folder (default $SROPE_CACHE or ~/.cache/srope)
    val_fraction: float | None = None  # held-out documents of a local or hf source (default 0.01; fixed for shakespeare)
    tokenizer: str | None = None  # "mistral-v1" (None: it, for a source; a token store has its own) or a local Hugging Face tokenizer folder
    max_steps: int = 100
    seq_len: int | None = None
    global_batch_size: int | None = None  # sequences per optimiser step
    micro_batch_size: int | None = None  # sequences per forward on one rank (default: all of its share)
    lr: float | None = None  # peak
    lr_start: float = 1e-5
    lr_end: float = 1e-4
    warmup: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    packing: str = "concat"  # "concat" (the paper) or "documents" (cu_seqlens per document)
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"  # autocast dtype: "auto" = bfloat16 on CUDA, float32 on the CPU
    compile: bool = False
    activation_checkpointing: bool = False  # recompute each block in the backward (less memory, ~1 more forward)
    cuda_graph: str = "auto"  # capture the step (compiled or not) as a CUDA graph: "auto" (CUDA, concat packing, not FSDP2), "on", "off"
    parallel: str = "ddp"  # "ddp" or "fsdp" (FSDP2) when torchrun starts several processes
    fsdp_param_dtype: str = "auto"  # FSDP2 gathers parameters in: "auto" = the autocast dtype, "float32"
    checkpoint_every: int = 100
    eval_every: int = 0  # 0: only at the end
    eval_rows: int = 64
    log_every: int = 1
    tensorboard: bool = True

    def resolved(self) -> "TrainConfig":
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        defaults = PRESETS[self.preset].training
        if is_store(self.data):  # its tokenizer and splits were fixed when it was prepared: none is recorded
            check_store_options(self.data, tokenizer=self.tokenizer, val_fraction=self.val_fraction)
            tokenizer = None
        else:
            tokenizer = MISTRAL_V1 if self.tokenizer in (None, MISTRAL_V1) else _absolute(self.tokenizer)
        out = dataclasses.replace(
            self,
            # local paths absolute, so that the run records what it reads, for srope eval from any directory
            data=_absolute(self.data),
            tokenizer=tokenizer,
            cache=None if self.cache is None else os.path.abspath(os.path.expanduser(self.cache)),
            seq_len=defaults.context_length if self.seq_len is None else self.seq_len,  # 0 is refused below, not the preset's
            global_batch_size=defaults.global_batch_size if self.global_batch_size is None else self.global_batch_size,
            lr=self.lr if self.lr is not None else defaults.learning_rate,
        )
        for name, minimum, meaning in INTEGER_RANGES:
            value = getattr(out, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
                raise ValueError(f"{name} must be {allowed}{meaning}, got {value!r}")
        for name, accept, allowed in NUMBER_RANGES:
            value = getattr(out, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not accept(value):
                raise ValueError(f"{name} must be {allowed}, got {value!r}")
        for name, choices in CHOICES:
            if getattr(out, name) not in choices:
                raise ValueError(f"{name} must be {' or '.join(map(repr, choices))}, got {getattr(out, name)!r}")
        if out.val_fraction is not None and not (isinstance(out.val_fraction, float) and 0 < out.val_fraction < 1):
            raise ValueError(f"val_fraction must be a number in (0, 1), got {out.val_fraction!r}")
        if not isinstance(out.activation_checkpointing, bool):
            raise ValueError(f"activation_checkpointing must be true or false, got {out.activation_checkpointing!r}")
        if out.lr_end > out.lr:
            raise ValueError(f"lr_end ({out.lr_end:g}) must not exceed the peak lr ({out.lr:g}): the cosine decays to it; --set lr_end=... lower")
        if out.warmup > 0 and out.lr_start > out.lr:
            raise ValueError(f"lr_start ({out.lr_start:g}) must not exceed the peak lr ({out.lr:g}): the warm-up climbs from it; --set lr_start=... lower")
        if out.micro_batch_size is not None and (not isinstance(out.micro_batch_size, int) or out.micro_batch_size < 1):
            raise ValueError(f"micro_batch_size must be a positive integer, got {out.micro_batch_size!r}")
        return out

    @classmethod
    def from_file(cls, values: dict, path) -> "TrainConfig":
        """The defaults with the settings ``values`` read from ``path`` (``srope train --config``:
        a run's ``train_config.json`` or a hand-written file) applied; an unknown key, a bad
        value or a ``srope synth`` config raises naming the file."""
        if "task" in values:
            raise ValueError(f"--config {path}: a srope synth config (task {values['task']!r}), not srope train's; "
                             f"give it to srope synth {values['task']} --config")  # fmt: skip
        config = apply_config_file(cls(), values, path)
        if isinstance(values.get("position"), str):  # a bare type name is recorded as such, as --position records it
            config = dataclasses.replace(config, position=values["position"])
        return config

    def coerce_field(self, key: str, value, annotation):
        """``model=`` takes a JSON object of SRopeConfig fields (merged into the run's),
        ``position=`` a type name or a JSON object ``{"type": ..., options}``."""
        if key == "model":
            parsed = parse_literal(value) if isinstance(value, str) else value
            if not isinstance(parsed, dict):
                raise ValueError(f"--set model=... takes a JSON object of SRopeConfig fields, got {value!r}")
            return {**self.model, **{name: _model_value(name, v) for name, v in parsed.items()}}
        if key == "position":
            parsed = parse_literal(value) if isinstance(value, str) else value
            return _position_values(dict(parsed) if isinstance(parsed, dict) else {"type": parsed})
        return super().coerce_field(key, value, annotation)

    def nested_overrides(self, changes: dict, model: dict, position: dict) -> dict:
        """``model.FIELD`` is an SRopeConfig field, ``position.OPTION`` an option of the
        run's encoding; each is converted to the type its class annotates."""
        out = {}
        if model:
            out["model"] = {**changes.get("model", self.model), **{name: _model_value(name, v) for name, v in model.items()}}
        if position:
            base = changes.get("position", self.position)
            out["position"] = _position_values({**({"type": base} if isinstance(base, str) else base), **position})
        return out

    def model_config(self, vocab_size: int):
        """The run's ``SRopeConfig`` (a bad model or position option raises here)."""
        return preset_config(self.preset, position=self.position, **{"vocab_size": vocab_size, **self.model})


def _absolute(spec):
    """An existing local path of ``--data`` or ``--tokenizer`` made absolute; anything else as it is
    (``shakespeare``, ``hf:NAME``, a missing path, which fails later with a hint)."""
    path = local_path(spec) if isinstance(spec, (str, os.PathLike)) else None
    return str(path) if path is not None and path.exists() else spec


def _model_value(name: str, value):
    from srope.models import SRopeConfig

    hints = typing.get_type_hints(SRopeConfig.__init__)
    if name not in hints or name in ("kwargs", "position", "return"):
        known = sorted(set(hints) - {"kwargs", "position", "return"})
        raise ValueError(f"unknown model setting 'model.{name}'; SRopeConfig fields: {known} (positions: position.OPTION)")
    return coerce(value, hints[name], f"model.{name}")


def _position_values(position: dict) -> dict:
    """The position spec with each option converted to the type its module annotates."""
    cls = position_class(position.get("type"))
    hints = typing.get_type_hints(cls.__init__)
    return {key: value if key == "type" or key not in hints else coerce(value, hints[key], f"position.{key}") for key, value in position.items()}
