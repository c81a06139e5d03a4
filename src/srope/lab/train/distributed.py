"""Process-group setup and data/model parallel wrapping with PyTorch's own primitives."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def sum(self, value: float | int | torch.Tensor) -> torch.Tensor:
        """All-reduced sum, as a float64 tensor on this rank's device."""
        tensor = torch.as_tensor(value, dtype=torch.float64, device=self.device).clone()
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor


def init_world(device: str = "auto") -> World:
    """Read torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and start the process group
    (NCCL on CUDA, gloo on the CPU). A plain process is rank 0 of 1."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' asked for but no CUDA GPU is visible")
        torch.cuda.set_device(local_rank)
        where = torch.device("cuda", local_rank)
    elif device == "cpu":
        where = torch.device("cpu")
    else:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo", device_id=where if where.type == "cuda" else None)
    return World(rank=rank, size=size, local_rank=local_rank, device=where)


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, world: World, parallel: str, *, flat_gradients: bool = False, param_dtype: torch.dtype | None = None) -> nn.Module:
    """``ddp``: DistributedDataParallel, or with ``flat_gradients`` the bare model with rank 0's
    weights (the caller averages a :class:`FlatGradients`); ``fsdp``: FSDP2 (``fully_shard``
    per block, then the root), parameters gathered in ``param_dtype`` (None: their own) and
    gradients reduced in float32. A single process gets the model back unchanged."""
    if parallel not in ("ddp", "fsdp"):
        raise ValueError(f"parallel must be 'ddp' or 'fsdp', got {parallel!r}")
    if not world.distributed:
        return model
    if parallel == "ddp":
        if flat_gradients:
            with torch.no_grad():
                for tensor in model.state_dict().values():
                    dist.broadcast(tensor, src=0)
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[world.local_rank] if world.device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


class FlatGradients:
    """Every parameter's gradient as a view into one flat buffer per dtype, so that
    data-parallel ranks average all of them with one all-reduce per dtype. Unlike DDP's
    autograd hooks this can be captured in a CUDA graph; it gives up overlapping the
    reduction with the backward pass, which costs little next to a step of this size
    (one all-reduce of the float32 gradients, ~4 bytes a parameter)."""

    def __init__(self, params):
        groups: dict[torch.dtype, list[nn.Parameter]] = {}
        for param in params:
            groups.setdefault(param.dtype, []).append(param)
        self.buffers: list[torch.Tensor] = []
        self.views: list[tuple[nn.Parameter, torch.Tensor]] = []
        for dtype, group in groups.items():
            flat = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=group[0].device)
            offset = 0
            for param in group:
                self.views.append((param, flat[offset : offset + param.numel()].view(param.shape)))
                offset += param.numel()
            self.buffers.append(flat)

    def attach(self) -> None:
        """Zero the buffers and point every ``.grad`` at its view (backward then accumulates in place)."""
        for flat in self.buffers:
            flat.zero_()
        for param, view in self.views:
            param.grad = view

    def average(self, world: World) -> None:
        """The mean over ranks, in place."""
        for flat in self.buffers:
            dist.all_reduce(flat)
            flat.div_(world.size)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under DDP / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner
