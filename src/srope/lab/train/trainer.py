"""Language-model pre-training, top to bottom.

``srope train --preset gla-tiny --data shakespeare --max-steps 50 --out DIR`` (also under
``torchrun --nproc-per-node K -m srope train ...``). One step: the learning rate for this
step (warm-up + cosine, a function of the step alone), this rank's share of the global
batch split into micro-batches, the summed token loss of each divided by the global number
of targets (so the result is the same for any world size or micro-batch size), gradient
clipping, a NaN/inf guard, AdamW, metrics; a checkpoint every ``checkpoint_every`` steps
and at the end. ``--resume`` continues from ``DIR``'s latest checkpoint bitwise exactly.
The steps run in the lab's loop (:func:`srope.lab.loop.train_steps`) with this module's step
(micro-batches, DDP/FSDP2, the CUDA graph) and its metrics, evaluation and checkpoints after it.

A planned stop writes a checkpoint first: ``stop_after`` (``--stop-after K``) and SIGTERM or
SIGINT (preemption, Ctrl-C), which end the run after the step in progress. A run killed
without warning (SIGKILL) resumes from the last complete checkpoint whose files match their
manifest (:mod:`srope.lab.train.checkpoint`).

One run per folder: the run holds a lock on ``DIR`` (:mod:`srope.lab.train.run_folder`), and
a folder that is not empty is refused unless ``--resume``. ``--resume`` on a finished run
(``run.json`` complete) changes nothing and returns its metrics. Settings and model options
are checked before the run folder is made, and a failed start removes the folder it made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import time
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srope.lab import provenance
from srope.models import PRESETS, SRopeForCausalLM, preset_config
from srope.modules import position_class
from srope.lab.config import RunConfig, apply_config_file
from srope.lab.overrides import coerce, parse_literal
from srope.lab.train.checkpoint import latest_checkpoint, load_checkpoint, remove_unfinished, save_checkpoint, usable_checkpoint
from srope.lab.train.corpus import local_path
from srope.lab.train.data import PackedBatches, check_store_options, eval_batches, is_store, load_corpus
from srope.lab.train.distributed import FlatGradients, World, close_world, init_world, unwrap, wrap_model
from srope.lab.graphed import GraphCaptureError, StepGraph
from srope.lab.loop import set_learning_rate, train_steps
from srope.lab.schedule import warmup_cosine
from srope.lab.train.optim import build_optimizer
from srope.lab.train.run_folder import RunFolder, used_entries
from srope.lab.train.stops import StopRequested, StopSignals
from srope.lab.train.tokenizer import MISTRAL_V1

# Settings a resumed run may change (they do not affect the numbers computed).
RESUME_MAY_CHANGE = {"checkpoint_every", "log_every", "eval_every", "tensorboard", "device", "cache", "cuda_graph"}
# Settings that are local paths: recorded absolute (resolve_recorded_paths reads older runs' relative ones).
PATH_SETTINGS = ("data", "tokenizer", "cache")


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


def token_loss_sum(model, batch, device, autocast) -> torch.Tensor:
    """Summed cross-entropy over the batch's targets (labels are already shifted)."""
    if batch.packing == "documents":
        input_ids, labels, cu_seqlens = batch.packed()
        cu_seqlens = cu_seqlens.to(device)
    else:
        input_ids, labels, cu_seqlens = batch.input_ids, batch.labels, None
    return summed_loss(model, input_ids.to(device), labels.to(device), cu_seqlens, autocast)


def summed_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor | None, autocast) -> torch.Tensor:
    """Summed cross-entropy of ``labels`` (already shifted; IGNORE_INDEX skipped) on device
    tensors: the model's own summed loss (fused on CUDA: the logits are never materialised)."""
    with autocast:
        return model(input_ids, cu_seqlens=cu_seqlens, use_cache=False, targets=labels).loss


@torch.no_grad()
def evaluate(model, store, config: TrainConfig, world: World, autocast, seq_len: int | None = None) -> dict:
    """Held-out mean token loss and perplexity over ``eval_rows`` rows."""
    model.eval()
    total, count = world.sum(0.0), world.sum(0.0)
    for batch in eval_batches(store, seq_len or config.seq_len, config.micro_batch_size or 8, rank=world.rank, world_size=world.size, packing=config.packing, max_rows=config.eval_rows):
        total += token_loss_sum(model, batch, world.device, autocast).double()
        count += batch.num_targets
    model.train()
    total, count = world.sum(total), world.sum(count)
    loss = float(total / count)
    return {"val_loss": loss, "val_ppl": math.exp(loss) if loss < 700 else float("inf")}


def _metrics_records(path: Path) -> list[tuple[int, str]]:
    """``(step, line)`` of every record in ``metrics.jsonl``. A torn last line (a run killed
    while writing it) is dropped with a warning; any other bad line is an error naming it."""
    lines = path.read_text().splitlines()
    last = max((number for number, line in enumerate(lines, 1) if line.strip()), default=0)
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            if number == last:
                warnings.warn(f"{path}: dropped a torn last line (a run killed while writing it): {line[:60]!r}", stacklevel=3)
                continue
            raise ValueError(f"{path}:{number}: not a JSON record ({error}); fix or delete that line, then --resume again") from None
        if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{number}: a record without an integer 'step'; fix or delete that line, then --resume again")
        records.append((record["step"], line))
    return records


class MetricsLog:
    """``metrics.jsonl`` (one JSON object per step) and TensorBoard, on rank 0."""

    def __init__(self, out: Path, world: World, tensorboard: bool, resume_step: int):
        self.path, self.enabled, self.writer = out / "metrics.jsonl", world.is_main, None
        self.last_step = 0  # of the records kept
        if not self.enabled:
            return
        if self.path.exists():  # drop the steps a resume will redo
            kept = [(step, line) for step, line in _metrics_records(self.path) if step <= resume_step]
            self.path.write_text("".join(line + "\n" for _, line in kept))
            self.last_step = max((step for step, _ in kept), default=0)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                tqdm.write("tensorboard is not installed: metrics go to metrics.jsonl only (pip install 'srope[lm]')")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def train(config: TrainConfig, out: str | Path, *, resume: bool = False, stop_after: int | None = None, verbose: bool = False) -> dict:
    """Run (or resume) a training run into ``out``; returns the final metrics (with the
    seconds spent per phase under ``time_s``). ``verbose`` prints what the run reads and writes.

    A SIGINT or SIGTERM during the run ends it after the step in progress with a checkpoint
    and raises :class:`StopRequested`; ``stop_after`` ends it after that step the same way.
    """
    config = config.resolved()
    source = provenance.commit()  # the code this run started with
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"stop_after must be a positive integer, got {stop_after!r}")
    out = Path(out)
    with torch.device("meta"):  # every model and position option checked before anything is read or written
        SRopeForCausalLM(config.model_config(vocab_size=config.model.get("vocab_size", 32000)))
    world = init_world(config.device)
    progress = {"steps": 0}
    try:
        with RunFolder(out, lock=world.is_main) as folder:
            try:
                return _train(config, out, world, resume, stop_after, verbose, progress, source)
            except BaseException:
                if folder.created and progress["steps"] == 0 and latest_checkpoint(out) is None:
                    shutil.rmtree(folder.created_root, ignore_errors=True)  # a failed start leaves no folder it made behind
                raise
    finally:
        close_world(world)


def _check_folder(out: Path, config: TrainConfig, resume: bool) -> dict | None:
    """Refuse a folder this run must not write into; return the finished run's ``run.json``
    when ``resume`` finds one (nothing is left to do), else None."""
    used = used_entries(out)
    if not resume:
        if latest_checkpoint(out) is not None:
            raise FileExistsError(f"{out} already holds checkpoints: pass --resume to continue, or choose another --out")
        if used:
            restart = "; or pass --resume to start its run again from step 0" if "train_config.json" in used else ""
            raise FileExistsError(f"{out} is not empty ({', '.join(used[:4])}{', ...' if len(used) > 4 else ''}) and holds no checkpoint: "
                                  f"choose another --out, or empty it{restart}")  # fmt: skip
        return None
    finished = _finished_run(out)
    if finished is not None:
        _check_same_settings(finished.get("config", {}), config)
        return finished
    if latest_checkpoint(out) is None and "train_config.json" not in used:
        raise FileNotFoundError(f"--resume: no checkpoint and no srope train run under {out}; start without --resume")
    return None


def _finished_run(out: Path) -> dict | None:
    """``run.json`` of a run that reached ``max_steps``, or None."""
    try:
        run = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) and run.get("complete") is True else None


def _check_same_settings(before: dict, config: TrainConfig) -> None:
    now = config.to_dict()
    before = resolve_recorded_paths(before, now)
    changed = {k: (v, now[k]) for k, v in before.items() if k not in RESUME_MAY_CHANGE and now.get(k) != v}
    if changed:
        raise ValueError(f"--resume: settings differ from the run's: {changed} (started with, now); resume with the same settings")


def resolve_recorded_paths(before: dict, now: dict) -> dict:
    """``before`` (a run's recorded settings) with each relative path in ``PATH_SETTINGS`` that
    names, from the current directory, the absolute path ``now`` has, replaced by it, with a
    one-line warning. Runs from before paths were recorded absolute kept them as given, and
    read them against the directory they ran in."""
    same = {key: before[key] for key in PATH_SETTINGS if _names_the_same(before.get(key), now.get(key), key)}
    if same:
        recorded = " and ".join(f"a relative {key} path {old!r}" for key, old in same.items())
        warnings.warn(f"the run recorded {recorded} (srope recorded paths as given then); from the current directory "
                      f"{'they name' if len(same) > 1 else 'it names'} {' and '.join(now[key] for key in same)}, what this run reads, so it resumes",
                      stacklevel=3)  # fmt: skip
    return {**before, **{key: now[key] for key in same}}


def _names_the_same(old, new, key: str) -> bool:
    """Whether the recorded ``old`` is a path other than ``new`` in text that names it from the current directory."""
    if not (isinstance(old, str) and isinstance(new, str)) or old == new:
        return False
    if key == "tokenizer" and old == MISTRAL_V1:
        return False  # a name, not a path
    path = local_path(old)
    return path is not None and str(path) == new


class _Phases:
    """Wall seconds per phase of a run (data, model, steps, eval, checkpoint, export)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def rounded(self) -> dict[str, float]:
        return {name: round(value, 3) for name, value in self.seconds.items()}


def _eager_step(model, optimizer, params, parts, lr: float, targets: torch.Tensor, world: World, autocast, grad_clip: float, flat: FlatGradients | None):
    """Forward and backward of every micro-batch, then clipping; returns the summed token
    loss of this rank and the gradient norm (the caller checks both, then steps). With
    ``flat`` (DDP without its wrapper) the ranks' gradients are averaged here."""
    set_learning_rate(optimizer, lr)
    loss_sum = torch.zeros((), dtype=torch.float64, device=world.device)
    if flat is not None:
        flat.attach()
    for i, part in enumerate(parts):
        sync = i == len(parts) - 1 or not hasattr(model, "no_sync")
        with model.no_sync() if not sync else contextlib.nullcontext():
            part_loss = token_loss_sum(model, part, world.device, autocast)
            # DDP averages gradients over ranks; scale so the result is the global token mean.
            (part_loss * (world.size / targets.to(part_loss.dtype))).backward()
        loss_sum += part_loss.detach().double()
    if flat is not None:
        flat.average(world)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or float("inf"))
    return loss_sum, grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: a DTensor


def _check_finite(loss: float, grad_norm: float, step: int, out: Path) -> None:
    for name, value in (("loss", loss), ("grad_norm", grad_norm)):
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite {name} ({value}) at step {step + 1}; the last checkpoint is {latest_checkpoint(out)}")


def _check_data(corpus, config: TrainConfig, world: World) -> None:
    """A model vocabulary that holds every token id, enough tokens for one global batch and one
    held-out row; else an error that says what is needed."""
    vocab = config.model.get("vocab_size")
    if vocab is not None and vocab < corpus.vocab_size:
        raise ValueError(
            f"model.vocab_size {vocab} is smaller than the tokenizer's vocabulary of {corpus.vocab_size} tokens (ids up to "
            f"{corpus.vocab_size - 1}); leave model.vocab_size unset (it is the tokenizer's) or set it >= {corpus.vocab_size}"
        )
    need_train = config.global_batch_size * config.seq_len + 1
    need_val = world.size * config.seq_len + 1
    hints = "use more text, fewer/shorter rows (--set global_batch_size=..., --set seq_len=...)"
    if corpus.train.num_tokens < need_train:
        raise ValueError(
            f"too little training data: {corpus.train.num_tokens:,} tokens in the train split of {config.data!r}, and one step "
            f"needs {need_train:,} (global_batch_size {config.global_batch_size} x seq_len {config.seq_len} + 1); {hints}"
        )
    if corpus.val.num_tokens < need_val:
        raise ValueError(
            f"too little held-out data: {corpus.val.num_tokens:,} tokens in the val split of {config.data!r} "
            f"({corpus.val.num_documents} documents), and evaluation needs {need_val:,} (seq_len {config.seq_len} + 1"
            f"{f' per process x {world.size}' if world.size > 1 else ''}); {hints}, or hold out more documents (--val-fraction)"
        )


def _use_cuda_graph(config: TrainConfig, world: World) -> bool:
    """Whether the step runs as a CUDA graph (see :mod:`srope.lab.graphed`)."""
    reasons = [
        reason
        for reason, applies in (
            (f"the device is {world.device.type}, not CUDA", world.device.type != "cuda"),
            ("FSDP2 gathers and frees the parameters inside the step", world.size > 1 and config.parallel == "fsdp"),
            ("packing='documents' changes the shapes from step to step", config.packing != "concat"),
            ("activation_checkpointing saves and restores the CUDA RNG state around each block, which a capture forbids",
             config.activation_checkpointing),
        )
        if applies
    ]
    if config.cuda_graph == "on" and reasons:
        raise ValueError(f"cuda_graph='on' cannot run here: {'; '.join(reasons)}")
    return config.cuda_graph != "off" and not reasons


def _describe(corpus, config: TrainConfig, model, autocast_dtype, world: World, out: Path) -> list[str]:
    bare = unwrap(model)
    mc = bare.config
    params = sum(p.numel() for p in bare.parameters())
    rows = (corpus.train.num_tokens - 1) // config.seq_len
    epochs = config.max_steps * config.global_batch_size / max(rows, 1)
    precision = f"float32 weights, {'bfloat16 autocast' if autocast_dtype is not None else 'float32'}"
    graphed = _use_cuda_graph(config, world)
    parallel = ""
    if world.size > 1:
        gathered = "bfloat16" if config.fsdp_param_dtype == "auto" and autocast_dtype is not None else "float32"
        parallel = {"ddp": ", DDP" + (" (one all-reduce of the flat gradients in the graph)" if graphed else ""),
                    "fsdp": f", FSDP2 (parameters gathered in {gathered}, gradients reduced in float32)"}[config.parallel]  # fmt: skip
    return [
        f"data   {config.data}: train {corpus.train.num_tokens:,} tokens in {corpus.train.num_documents:,} documents, "
        f"val {corpus.val.num_tokens:,} tokens in {corpus.val.num_documents:,} (token store {corpus.path})",
        f"       {config.max_steps} steps x {config.global_batch_size} rows of {config.seq_len} tokens = {epochs:.2f} epochs",
        f"model  {config.preset}, {mc.mixer} + {mc.position['type']}: {params / 1e6:.2f}M parameters, {mc.num_hidden_layers} layers, "
        f"hidden {mc.hidden_size}; {world.device}{f' x {world.size} processes' if world.size > 1 else ''}, {precision}"
        f"{parallel}{', torch.compile' if config.compile else ''}{', activation checkpointing' if config.activation_checkpointing else ''}"
        f"{', the step as a CUDA graph' if graphed else ''}",
        f"out    {out}: checkpoints/ every {config.checkpoint_every} steps, metrics.jsonl"
        f"{', tensorboard/' if config.tensorboard else ''}, model/ at the end",
    ]


def enable_checkpointing(model: SRopeForCausalLM) -> None:
    """transformers' activation checkpointing of every block (non-reentrant ``torch.utils.checkpoint``)."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # newer transformers; the old name is a deprecated alias
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _train(config: TrainConfig, out: Path, world: World, resume: bool, stop_after: int | None, verbose: bool, progress: dict, source) -> dict:
    say = tqdm.write if verbose and world.is_main else (lambda text: None)
    finished = _check_folder(out, config, resume)
    if finished is not None:
        say(f"{out} holds a finished run ({config.max_steps} of {config.max_steps} steps, run.json): nothing to resume")
        return finished["metrics"]
    if world.is_main:
        for stale in remove_unfinished(out):
            say(f"removed {stale} (a checkpoint whose writing never finished)")
    phases = _Phases()
    local_batch, rem = divmod(config.global_batch_size, world.size)
    if rem:
        raise ValueError(f"global_batch_size {config.global_batch_size} must be a multiple of the {world.size} processes")
    micro = config.micro_batch_size or local_batch
    if local_batch % micro:
        raise ValueError(f"micro_batch_size {micro} must divide each process's share of {local_batch} sequences")

    # Data: rank 0 prepares (downloads, tokenises) once; the others then open the cache.
    with phases("data"):
        if world.is_main:
            corpus = load_corpus(config.data, config.tokenizer, cache=config.cache, val_fraction=config.val_fraction)
        world.barrier()
        if not world.is_main:
            corpus = load_corpus(config.data, config.tokenizer, cache=config.cache, val_fraction=config.val_fraction, download=False)
        _check_data(corpus, config, world)
        loader = PackedBatches(corpus.train, config.seq_len, config.global_batch_size, rank=world.rank, world_size=world.size, seed=config.seed, packing=config.packing)

    autocast_dtype = torch.bfloat16 if config.dtype == "bfloat16" or (config.dtype == "auto" and world.device.type == "cuda") else None
    # no weight-cast cache: the same casts either way, and a CUDA graph capture needs none
    autocast = torch.autocast(world.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None, cache_enabled=False)
    graphed = _use_cuda_graph(config, world)
    # DDP's hooks cannot be captured: a captured step averages flat gradients itself
    flat_gradients = graphed and world.distributed and config.parallel == "ddp"

    # Model: the same seed on every rank gives identical initial weights.
    with phases("model"):
        torch.manual_seed(config.seed)
        model = SRopeForCausalLM(config.model_config(corpus.vocab_size)).to(world.device)
        if config.activation_checkpointing:
            enable_checkpointing(model)
        param_dtype = autocast_dtype if config.fsdp_param_dtype == "auto" else None
        model = wrap_model(model, world, config.parallel, flat_gradients=flat_gradients, param_dtype=param_dtype)
        if config.compile:
            model = torch.compile(model)
        optimizer = build_optimizer(unwrap(model), lr=config.lr, weight_decay=config.weight_decay, betas=(config.beta1, config.beta2), eps=config.eps)

    start, latest = 0, usable_checkpoint(out) if resume else None
    if latest is not None:
        with phases("checkpoint"):
            state = load_checkpoint(latest, model, optimizer, world, fields={"config": dict, "data": dict})
        _check_same_settings(state["config"], config)
        loader.load_state_dict(state["data"])
        start = state["step"]
    if stop_after is not None and stop_after <= start:
        raise ValueError(f"--stop-after {stop_after}: the run resumes at step {start}, so it would stop before it starts; "
                         f"pass a --stop-after above {start}, or leave it out")  # fmt: skip
    for line in _describe(corpus, config, model, autocast_dtype, world, out):
        say(line)
    if latest is not None:
        say(f"resume from {latest} (step {start})")
    elif resume:
        say(f"no checkpoint in {out}: its run starts again from step 0")
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    log = MetricsLog(out, world, config.tensorboard, start)
    params = [p for p in model.parameters() if p.requires_grad]
    flat = FlatGradients(params) if flat_gradients else None
    last = config.max_steps if stop_after is None else min(stop_after, config.max_steps)
    metrics: dict = {}
    saved_at = start

    def checkpoint(step: int) -> float:
        nonlocal saved_at
        began = time.perf_counter()
        with phases("checkpoint"):
            save_checkpoint(out, step, model, optimizer, {"config": config.to_dict(), "data": loader.state_dict()}, world)
        saved_at = step
        return time.perf_counter() - began

    clock = {"began": 0.0}
    graph = {"step": None, "on": graphed}

    def batches():
        for step in range(start, last):
            clock["began"] = time.perf_counter()
            yield step, next(loader)

    def lm_step(step: int, lr: float, batch) -> tuple[float, float, float]:
        """One optimiser step on this rank's share of the global batch: (loss, gradient norm, targets)."""
        targets = world.sum(batch.num_targets)
        parts = batch.split(micro)
        result = None
        if graph["on"]:
            if graph["step"] is None:
                graph["step"] = StepGraph(
                    model, optimizer, params, loss_sum=lambda ids, labels: summed_loss(model, ids, labels, None, autocast),
                    parts=len(parts), micro=micro, seq_len=config.seq_len, grad_clip=config.grad_clip, targets=batch.num_targets,
                    world=world, flat_gradients=flat, global_targets=int(targets),
                )  # fmt: skip
            try:
                result = graph["step"].step(parts, lr)
            except GraphCaptureError as error:
                if config.cuda_graph == "on":
                    raise
                graph["on"] = False
                tqdm.write(f"warning: {error}; training on without a CUDA graph (--set cuda_graph=off skips the attempt)")
        if result is None:
            result = _eager_step(model, optimizer, params, parts, lr, targets, world, autocast, config.grad_clip, flat)
        loss_sum, grad_norm = result
        loss = float(world.sum(loss_sum) / targets)
        _check_finite(loss, float(grad_norm), step, out)
        if not graph["on"]:  # the graph applies the update itself, before the check
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss, float(grad_norm), float(targets)

    def after(step: int, result: tuple[float, float, float]) -> None:
        nonlocal metrics
        loss, grad_norm, targets = result
        elapsed = time.perf_counter() - clock["began"]
        phases.seconds["steps"] = phases.seconds.get("steps", 0.0) + elapsed
        progress["steps"] += 1
        done = step + 1
        metrics = {"step": done, "loss": loss, "lr": lr_at(step), "grad_norm": grad_norm, "tokens_per_s": targets / elapsed, "step_s": elapsed}
        if world.device.type == "cuda":
            metrics["peak_gib"] = torch.cuda.max_memory_allocated(world.device) / 2**30
        if (config.eval_every and done % config.eval_every == 0) or done == config.max_steps:
            began = time.perf_counter()
            with phases("eval"):
                metrics |= evaluate(model, corpus.val, config, world, autocast)
            metrics["eval_s"] = time.perf_counter() - began
        if done % config.checkpoint_every == 0 or done == config.max_steps:
            metrics["checkpoint_s"] = checkpoint(done)
        if done % config.log_every == 0 or "val_loss" in metrics:
            log.write(metrics)
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
        bar.update(1)
        requested = stop.signum is not None
        if world.distributed:
            requested = bool(world.sum(float(requested)) > 0)  # every rank stops at the same step
        if requested and done < config.max_steps:
            if saved_at != done:
                checkpoint(done)
            log.close()
            signum = stop.signum or signal.SIGTERM
            message = f"stopped by {signal.Signals(signum).name} after step {done}: checkpoint {latest_checkpoint(out)}; continue with --resume"
            say(message)
            raise StopRequested(signum, message)

    def lr_at(step: int) -> float:
        return warmup_cosine(step, total=config.max_steps, peak=config.lr, start=config.lr_start, end=config.lr_end, warmup=config.warmup)

    model.train()
    with StopSignals(say) as stop, tqdm(total=config.max_steps, initial=start, disable=not (verbose and world.is_main), unit="step", dynamic_ncols=True) as bar:
        train_steps(batches(), lm_step, lr_at=lr_at, after=after)
    if start == config.max_steps:  # resumed after its last checkpoint, before run.json: the final numbers again
        metrics = {"step": start} | evaluate(model, corpus.val, config, world, autocast)
        if log.last_step < start:
            log.write(metrics)
    if last < config.max_steps:
        if saved_at != last:
            checkpoint(last)
        say(f"stopped after step {last} (--stop-after): checkpoint {latest_checkpoint(out)}; continue with --resume")
    log.close()
    if last == config.max_steps:
        with phases("export"):
            export_model(model, corpus, out / "model", world)
        say(f"model  {out / 'model'} (load: import srope.models; AutoModelForCausalLM.from_pretrained(...))")
        say(f"test   {corpus.test.num_tokens:,} tokens in {corpus.test.num_documents:,} documents, held out from training and the lr choice: "
            f"srope eval --model {out}" if corpus.test.num_tokens else f"test   empty (too few documents held out): srope eval --model {out} scores val")
    say(f"logs   {out / 'metrics.jsonl'}, {out / 'run.json'} (provenance)" + (f"; tensorboard --logdir {out / 'tensorboard'}" if config.tensorboard else ""))
    steps = phases.seconds.get("steps", 0.0)
    run = last - start
    say("time   " + ", ".join(
        f"{name} {value:.1f} s" + (f" ({run} steps, {steps / run:.2f} s/step)" if name == "steps" and run else "")
        for name, value in phases.seconds.items()
    ))  # fmt: skip
    metrics["time_s"] = phases.rounded()
    if world.is_main:
        summary = {
            "provenance": provenance.record(source=source, seeds=[config.seed], device=str(world.device), world_size=world.size, wall_s=round(sum(phases.seconds.values()), 3)),
            "complete": last == config.max_steps, "steps_run": [start, last], "config": config.to_dict(), "metrics": metrics,
        }  # fmt: skip
        (out / "run.json").write_text(json.dumps(summary, indent=2))
    return metrics


def export_model(model, corpus, path: Path, world: World) -> None:
    """``save_pretrained`` the final weights, config and tokenizer (loadable with
    ``AutoModelForCausalLM.from_pretrained`` after ``import srope``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.is_main:
        bare = unwrap(model)
        tokenizer = generation_tokenizer(corpus.path / "tokenizer")
        bare.generation_config.pad_token_id = tokenizer.pad_token_id
        bare.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)
        (path / "README.md").write_text(MODEL_CARD)
    world.barrier()


# transformers knows model_type "srope" only once srope.models is imported; without it, it
# suggests upgrading transformers. The folder says so itself.
MODEL_CARD = """# An srope model

Trained with `srope train`. Load it after importing `srope.models`, which registers the
`srope` model type with transformers:

```python
import srope.models
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")
tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")  # pads with eos, on the left
```
"""


def generation_tokenizer(folder: Path):
    """The tokenizer saved in ``folder`` as batched generation needs it: a pad token (eos when
    it has none; the attention mask hides padding) and padding on the left, where a causal
    model ignores it (``padding_side`` is saved only when given at load time)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, padding_side="left")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
