"""What ``srope train`` checks and says before its first step: the data it needs
(:func:`check_data`), whether the step runs as a CUDA graph (:func:`use_cuda_graph`), the
run's description (:func:`describe`) and activation checkpointing (:func:`enable_checkpointing`)."""

from __future__ import annotations

from pathlib import Path

from srope.lab.train.distributed import World, unwrap
from srope.lab.train.train_config import TrainConfig
from srope.models import SRopeForCausalLM


def check_data(corpus, config: TrainConfig, world: World) -> None:
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


def use_cuda_graph(config: TrainConfig, world: World) -> bool:
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


def describe(corpus, config: TrainConfig, model, autocast_dtype, world: World, out: Path) -> list[str]:
    bare = unwrap(model)
    mc = bare.config
    params = sum(p.numel() for p in bare.parameters())
    rows = (corpus.train.num_tokens - 1) // config.seq_len
    epochs = config.max_steps * config.global_batch_size / max(rows, 1)
    precision = f"float32 weights, {'bfloat16 autocast' if autocast_dtype is not None else 'float32'}"
    graphed = use_cuda_graph(config, world)
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
