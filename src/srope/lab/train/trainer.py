"""Language-model pre-training, top to bottom.

``srope train --preset gla-tiny --data shakespeare --max-steps 50 --out DIR`` (also under
``torchrun --nproc-per-node K -m srope train ...``). One step: the learning rate for this
step (warm-up + cosine, a function of the step alone), this rank's share of the global
batch split into micro-batches, the summed token loss of each divided by the global number
of targets (so the result is the same for any world size or micro-batch size), gradient
clipping, a NaN/inf guard, AdamW, metrics; a checkpoint every ``checkpoint_every`` steps
and at the end. ``--resume`` continues from ``DIR``'s latest checkpoint bitwise exactly.
The run is a :class:`LMTrainer`, the lab's :class:`~srope.lab.trainer.Trainer` with this
module's step (micro-batches, DDP/FSDP2, the CUDA graph) and its metrics, evaluation and
checkpoints after it; what it checks and says before the first step is in
:mod:`srope.lab.train.preflight`.

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
import json
import math
import shutil
import signal
import time
from pathlib import Path

import torch
from tqdm import tqdm

from srope.lab import provenance
from srope.lab.graphed import GraphCaptureError, StepGraph
from srope.lab.schedule import warmup_cosine
from srope.lab.train.batches import PackedBatches, eval_batches
from srope.lab.train.checkpoint import latest_checkpoint
from srope.lab.train.distributed import FlatGradients, World, close_world, init_world, unwrap, wrap_model
from srope.lab.train.export import export_model
from srope.lab.train.metrics_log import MetricsLog
from srope.lab.train.optim import parameter_groups
from srope.lab.train.preflight import check_data, describe, enable_checkpointing, use_cuda_graph
from srope.lab.train.prepare import load_corpus
from srope.lab.train.resume import _check_folder, _check_same_settings
from srope.lab.train.run_folder import RunFolder
from srope.lab.train.stops import StopRequested, StopSignals
from srope.lab.train.train_config import TrainConfig
from srope.lab.step import set_learning_rate
from srope.lab.trainer import Trainer
from srope.models import SRopeForCausalLM


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


class LMTrainer(Trainer):
    """``srope train``'s :class:`~srope.lab.trainer.Trainer`: AdamW over the paper's parameter
    groups (:func:`~srope.lab.train.optim.parameter_groups`), the warm-up + cosine schedule, its
    own step (this rank's share of the global batch in micro-batches; DDP, FSDP2, the CUDA graph)
    and, after every step, the metrics, evaluation, checkpoints and planned stops."""

    def __init__(self, model, config: TrainConfig, world: World, out: Path, *, autocast, micro: int, graphed: bool, flat_gradients: bool,
                 corpus, loader, phases: _Phases, progress: dict, say):  # fmt: skip
        super().__init__(model, parameter_groups(unwrap(model), config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps)
        self.config, self.world, self.out, self.autocast, self.micro = config, world, out, autocast, micro
        self.corpus, self.loader, self.phases, self.progress, self.say = corpus, loader, phases, progress, say
        self.flat_gradients, self.params, self.flat = flat_gradients, None, None  # set by run(), after a resume has loaded the weights
        self.graph, self.graph_on = None, graphed
        self.metrics: dict = {}
        self.began = 0.0  # when the step in progress began (its batch drawn)
        self.saved_at = self.start = 0
        self.log = self.bar = self.stop = None  # set by run()

    def lr_at(self, step: int) -> float:
        c = self.config
        return warmup_cosine(step, total=c.max_steps, peak=c.lr, start=c.lr_start, end=c.lr_end, warmup=c.warmup)

    def checkpoint(self, step: int) -> float:
        """A checkpoint of step ``step`` with the data's position; returns the seconds it took."""
        began = time.perf_counter()
        with self.phases("checkpoint"):
            self.save(self.out, step, {"config": self.config.to_dict(), "data": self.loader.state_dict()}, self.world)
        self.saved_at = step
        return time.perf_counter() - began

    def batches(self, last: int):
        for step in range(self.start, last):
            self.began = time.perf_counter()
            yield step, next(self.loader)

    def train_step(self, step: int, lr: float, batch) -> tuple[float, float, float]:
        """One optimiser step on this rank's share of the global batch: (loss, gradient norm, targets)."""
        world, config = self.world, self.config
        targets = world.sum(batch.num_targets)
        parts = batch.split(self.micro)
        result = None
        if self.graph_on:
            if self.graph is None:
                self.graph = StepGraph(
                    self.model, self.optimizer, self.params, loss_sum=lambda ids, labels: summed_loss(self.model, ids, labels, None, self.autocast),
                    parts=len(parts), micro=self.micro, seq_len=config.seq_len, grad_clip=config.grad_clip, targets=batch.num_targets,
                    world=world, flat_gradients=self.flat, global_targets=int(targets),
                )  # fmt: skip
            try:
                result = self.graph.step(parts, lr)
            except GraphCaptureError as error:
                if config.cuda_graph == "on":
                    raise
                self.graph_on = False
                tqdm.write(f"warning: {error}; training on without a CUDA graph (--set cuda_graph=off skips the attempt)")
        if result is None:
            result = _eager_step(self.model, self.optimizer, self.params, parts, lr, targets, world, self.autocast, config.grad_clip, self.flat)
        loss_sum, grad_norm = result
        loss = float(world.sum(loss_sum) / targets)
        _check_finite(loss, float(grad_norm), step, self.out)
        if not self.graph_on:  # the graph applies the update itself, before the check
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss, float(grad_norm), float(targets)

    def after_step(self, step: int, result: tuple[float, float, float]) -> None:
        config, world = self.config, self.world
        loss, grad_norm, targets = result
        elapsed = time.perf_counter() - self.began
        self.phases.seconds["steps"] = self.phases.seconds.get("steps", 0.0) + elapsed
        self.progress["steps"] += 1
        done = step + 1
        metrics = {"step": done, "loss": loss, "lr": self.lr_at(step), "grad_norm": grad_norm, "tokens_per_s": targets / elapsed, "step_s": elapsed}
        if world.device.type == "cuda":
            metrics["peak_gib"] = torch.cuda.max_memory_allocated(world.device) / 2**30
        if (config.eval_every and done % config.eval_every == 0) or done == config.max_steps:
            began = time.perf_counter()
            with self.phases("eval"):
                metrics |= evaluate(self.model, self.corpus.val, config, world, self.autocast)
            metrics["eval_s"] = time.perf_counter() - began
        if done % config.checkpoint_every == 0 or done == config.max_steps:
            metrics["checkpoint_s"] = self.checkpoint(done)
        if done % config.log_every == 0 or "val_loss" in metrics:
            self.log.write(metrics)
        self.metrics = metrics
        self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
        self.bar.update(1)
        requested = self.stop.signum is not None
        if world.distributed:
            requested = bool(world.sum(float(requested)) > 0)  # every rank stops at the same step
        if requested and done < config.max_steps:
            if self.saved_at != done:
                self.checkpoint(done)
            self.log.close()
            signum = self.stop.signum or signal.SIGTERM
            message = f"stopped by {signal.Signals(signum).name} after step {done}: checkpoint {latest_checkpoint(self.out)}; continue with --resume"
            self.say(message)
            raise StopRequested(signum, message)

    def run(self, last: int, verbose: bool) -> None:
        """Steps ``start`` to ``last`` under the stop signals, with a progress bar."""
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.flat = FlatGradients(self.params) if self.flat_gradients else None
        self.model.train()
        with StopSignals(self.say) as self.stop, tqdm(total=self.config.max_steps, initial=self.start, disable=not (verbose and self.world.is_main),
                                                      unit="step", dynamic_ncols=True) as self.bar:  # fmt: skip
            self.fit(self.batches(last))


def _train(config: TrainConfig, out: Path, world: World, resume: bool, stop_after: int | None, verbose: bool, progress: dict, source) -> dict:
    say = tqdm.write if verbose and world.is_main else (lambda text: None)
    finished = _check_folder(out, config, resume)
    if finished is not None:
        say(f"{out} holds a finished run ({config.max_steps} of {config.max_steps} steps, run.json): nothing to resume")
        return finished["metrics"]
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
        check_data(corpus, config, world)
        loader = PackedBatches(corpus.train, config.seq_len, config.global_batch_size, rank=world.rank, world_size=world.size, seed=config.seed, packing=config.packing)

    autocast_dtype = torch.bfloat16 if config.dtype == "bfloat16" or (config.dtype == "auto" and world.device.type == "cuda") else None
    # no weight-cast cache: the same casts either way, and a CUDA graph capture needs none
    autocast = torch.autocast(world.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None, cache_enabled=False)
    graphed = use_cuda_graph(config, world)
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
        trainer = LMTrainer(model, config, world, out, autocast=autocast, micro=micro, graphed=graphed, flat_gradients=flat_gradients,
                            corpus=corpus, loader=loader, phases=phases, progress=progress, say=say)  # fmt: skip

    state = None
    if resume:
        with phases("checkpoint"):
            state = trainer.resume(out, world, say=say, fields={"config": dict, "data": dict})
    if state is not None:
        _check_same_settings(state["config"], config)
        loader.load_state_dict(state["data"])
        trainer.start = trainer.saved_at = start = state["step"]
    else:
        start = 0
    if stop_after is not None and stop_after <= start:
        raise ValueError(f"--stop-after {stop_after}: the run resumes at step {start}, so it would stop before it starts; "
                         f"pass a --stop-after above {start}, or leave it out")  # fmt: skip
    for line in describe(corpus, config, model, autocast_dtype, world, out):
        say(line)
    if state is not None:
        say(f"resume from {state['path']} (step {start})")
    elif resume:
        say(f"no checkpoint in {out}: its run starts again from step 0")
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    log = trainer.log = MetricsLog(out, world, config.tensorboard, start)
    last = config.max_steps if stop_after is None else min(stop_after, config.max_steps)
    trainer.run(last, verbose)
    metrics = trainer.metrics
    if start == config.max_steps:  # resumed after its last checkpoint, before run.json: the final numbers again
        metrics = {"step": start} | evaluate(model, corpus.val, config, world, autocast)
        if log.last_step < start:
            log.write(metrics)
    if last < config.max_steps:
        if trainer.saved_at != last:
            trainer.checkpoint(last)
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
