"""Language-model pre-training, top to bottom.

``srope train --preset gla-tiny --data shakespeare --max-steps 50 --out DIR`` (also under
``torchrun --nproc-per-node K -m srope train ...``). One step: the learning rate for this
step (warm-up + cosine, a function of the step alone), this rank's share of the global
batch split into micro-batches, the summed token loss of each divided by the global number
of targets (so the result is the same for any world size or micro-batch size), gradient
clipping, a NaN/inf guard, AdamW, metrics; a checkpoint every ``checkpoint_every`` steps
and at the end. ``--resume`` continues from ``DIR``'s latest checkpoint bitwise exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from srope.models import PRESETS, SRopeForCausalLM, preset_config
from srope.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from srope.train.data import IGNORE_INDEX, PackedBatches, eval_batches, load_corpus
from srope.train.distributed import World, close_world, init_world, unwrap, wrap_model
from srope.train.optim import build_optimizer, warmup_cosine


# Settings a resumed run may change (they do not affect the numbers computed).
RESUME_MAY_CHANGE = {"checkpoint_every", "log_every", "eval_every", "tensorboard", "device", "cache"}


@dataclass
class TrainConfig:
    """Everything a run depends on. ``None`` sizes come from the preset's training defaults."""

    preset: str = "gla-tiny"
    position: Any = "selective_rope"  # a type name or {"type": ..., options}
    model: dict = field(default_factory=dict)  # SRopeConfig overrides
    data: str = "shakespeare"
    cache: str | None = None  # data cache folder (default $SROPE_CACHE or ~/.cache/srope)
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
    parallel: str = "ddp"  # "ddp" or "fsdp" (FSDP2) when torchrun starts several processes
    checkpoint_every: int = 100
    eval_every: int = 0  # 0: only at the end
    eval_rows: int = 64
    log_every: int = 1
    tensorboard: bool = True

    def resolved(self) -> "TrainConfig":
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        defaults = PRESETS[self.preset].training
        out = dataclasses.replace(
            self,
            seq_len=self.seq_len or defaults.context_length,
            global_batch_size=self.global_batch_size or defaults.global_batch_size,
            lr=self.lr if self.lr is not None else defaults.learning_rate,
        )
        for name in ("max_steps", "seq_len", "global_batch_size", "checkpoint_every", "log_every", "eval_rows"):
            if not isinstance(getattr(out, name), int) or getattr(out, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(out, name)!r}")
        if not (isinstance(out.grad_clip, (int, float)) and out.grad_clip >= 0):
            raise ValueError(f"grad_clip must be >= 0 (0: no clipping), got {out.grad_clip!r}")
        if out.packing not in ("concat", "documents"):
            raise ValueError(f"packing must be 'concat' or 'documents', got {out.packing!r}")
        if out.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16', got {out.dtype!r}")
        return out


def apply_overrides(config: TrainConfig, pairs: list[str]) -> TrainConfig:
    """``key=value`` overrides: a TrainConfig field, ``model.FIELD`` (SRopeConfig) or
    ``position.OPTION``; values are parsed as JSON when they parse, else kept as strings."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    updates, model, position = {}, dict(config.model), None
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set takes key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key == "model":
            if not isinstance(value, dict):
                raise ValueError(f"model=... takes a JSON object of SRopeConfig fields, got {raw!r}")
            model.update(value)
        elif key.startswith("model."):
            model[key[6:]] = value
        elif key.startswith("position."):
            position = position or ({"type": config.position} if isinstance(config.position, str) else dict(config.position))
            position[key[9:]] = value
        elif key in fields - {"model"}:
            updates[key] = value
        else:
            raise ValueError(f"unknown setting {key!r}; expected a TrainConfig field {sorted(fields)}, model.FIELD or position.OPTION")
    if position is not None:
        updates["position"] = position
    return dataclasses.replace(config, **updates, model=model)


def token_loss_sum(model, batch, device, autocast) -> torch.Tensor:
    """Summed cross-entropy over the batch's targets (labels are already shifted)."""
    if batch.packing == "documents":
        input_ids, labels, cu_seqlens = batch.packed()
        cu_seqlens = cu_seqlens.to(device)
    else:
        input_ids, labels, cu_seqlens = batch.input_ids, batch.labels, None
    with autocast:
        logits = model(input_ids.to(device), cu_seqlens=cu_seqlens, use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), labels.to(device).flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


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


class MetricsLog:
    """``metrics.jsonl`` (one JSON object per step) and TensorBoard, on rank 0."""

    def __init__(self, out: Path, world: World, tensorboard: bool, resume_step: int):
        self.path, self.enabled, self.writer = out / "metrics.jsonl", world.is_main, None
        if not self.enabled:
            return
        if self.path.exists():  # drop the steps a resume will redo
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line).get("step", -1) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
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


def train(config: TrainConfig, out: str | Path, *, resume: bool = False, stop_after: int | None = None) -> dict:
    """Run (or resume) a training run into ``out``; returns the final metrics."""
    config = config.resolved()
    out = Path(out)
    world = init_world(config.device)
    try:
        return _train(config, out, world, resume, stop_after)
    finally:
        close_world(world)


def _train(config: TrainConfig, out: Path, world: World, resume: bool, stop_after: int | None) -> dict:
    local_batch, rem = divmod(config.global_batch_size, world.size)
    if rem:
        raise ValueError(f"global_batch_size {config.global_batch_size} must be a multiple of the {world.size} processes")
    micro = config.micro_batch_size or local_batch
    if local_batch % micro:
        raise ValueError(f"micro_batch_size {micro} must divide each process's share of {local_batch} sequences")
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)

    # Data: rank 0 prepares (downloads, tokenises) once; the others then open the cache.
    if world.is_main:
        corpus = load_corpus(config.data, cache=config.cache)
    world.barrier()
    if not world.is_main:
        corpus = load_corpus(config.data, cache=config.cache, download=False)
    loader = PackedBatches(corpus.train, config.seq_len, config.global_batch_size, rank=world.rank, world_size=world.size, seed=config.seed, packing=config.packing)

    # Model: the same seed on every rank gives identical initial weights.
    torch.manual_seed(config.seed)
    model_config = preset_config(config.preset, position=config.position, **{"vocab_size": corpus.vocab_size, **config.model})
    model = SRopeForCausalLM(model_config).to(world.device)
    model = wrap_model(model, world, config.parallel)
    if config.compile:
        model = torch.compile(model)
    optimizer = build_optimizer(unwrap(model), lr=config.lr, weight_decay=config.weight_decay, betas=(config.beta1, config.beta2), eps=config.eps)
    autocast_dtype = torch.bfloat16 if config.dtype == "bfloat16" or (config.dtype == "auto" and world.device.type == "cuda") else None
    autocast = torch.autocast(world.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

    start = 0
    if resume:
        latest = latest_checkpoint(out)
        if latest is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
        state = load_checkpoint(latest, model, optimizer, world)
        changed = {k: (v, asdict(config)[k]) for k, v in state["config"].items() if k not in RESUME_MAY_CHANGE and asdict(config).get(k) != v}
        if changed:
            raise ValueError(f"--resume: settings differ from the run's: {changed} (started with, now); resume with the same settings")
        loader.load_state_dict(state["data"])
        start = state["step"]
    elif latest_checkpoint(out) is not None:
        raise FileExistsError(f"{out} already holds checkpoints: pass --resume to continue, or choose another --out")
    if world.is_main:
        (out / "train_config.json").write_text(json.dumps(asdict(config), indent=2))
    log = MetricsLog(out, world, config.tensorboard, start)
    params = [p for p in model.parameters() if p.requires_grad]
    last = config.max_steps if stop_after is None else min(stop_after, config.max_steps)
    bar = tqdm(total=config.max_steps, initial=start, disable=not world.is_main, unit="step", dynamic_ncols=True)
    metrics: dict = {}

    def checkpoint(step: int) -> None:
        state = {"config": asdict(config), "data": loader.state_dict()}
        save_checkpoint(out, step, model, optimizer, state, world)

    model.train()
    for step in range(start, last):
        began = time.perf_counter()
        lr = warmup_cosine(step, total=config.max_steps, peak=config.lr, start=config.lr_start, end=config.lr_end, warmup=config.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = next(loader)
        targets = world.sum(batch.num_targets)
        loss_sum = torch.zeros((), dtype=torch.float64, device=world.device)
        parts = batch.split(micro)
        for i, part in enumerate(parts):
            sync = i == len(parts) - 1 or not hasattr(model, "no_sync")
            context = model.no_sync() if not sync else contextlib.nullcontext()
            with context:
                part_loss = token_loss_sum(model, part, world.device, autocast)
                # DDP averages gradients over ranks; scale so the result is the global token mean.
                (part_loss * (world.size / targets.to(part_loss.dtype))).backward()
            loss_sum += part_loss.detach().double()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip or float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: a DTensor
        loss = float(world.sum(loss_sum) / targets)
        for name, value in (("loss", loss), ("grad_norm", float(grad_norm))):
            if not math.isfinite(value):
                raise FloatingPointError(f"non-finite {name} ({value}) at step {step + 1}; the last checkpoint is {latest_checkpoint(out)}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - began
        metrics = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": float(targets) / elapsed, "step_s": elapsed}
        done = step + 1
        if (config.eval_every and done % config.eval_every == 0) or done == config.max_steps:
            metrics |= evaluate(model, corpus.val, config, world, autocast)
        if done % config.log_every == 0 or "val_loss" in metrics:
            log.write(metrics)
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
        bar.update(1)
        if done % config.checkpoint_every == 0 or done == config.max_steps:
            checkpoint(done)
    bar.close()
    log.close()
    if last == config.max_steps:
        export_model(model, corpus, out / "model", world)
    return metrics


def export_model(model, corpus, path: Path, world: World) -> None:
    """``save_pretrained`` the final weights, config and tokenizer (loadable with
    ``AutoModelForCausalLM.from_pretrained`` after ``import srope``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.is_main:
        bare = unwrap(model)
        bare.save_pretrained(path, state_dict=state)
        corpus.tokenizer().save_pretrained(path)
    world.barrier()
