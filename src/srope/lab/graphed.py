"""A training step as one CUDA graph, for ``srope train`` and for the lab's plain step.

In eager mode a training step of a model of this library's size waits on Python: hundreds of
small kernel launches with autograd and the layers' code between them. With fixed shapes the
whole step -- forward, loss, backward, gradient clipping and the AdamW update -- is captured
once as a CUDA graph and replayed, which launches the same kernels with no Python in between.

The first ``warmup`` steps run eagerly on a side stream (Triton's autotuning, cuBLAS
workspaces and lazy allocations happen there, as capture requires); the next step is
captured and replayed. They are all real training steps. AdamW runs with ``capturable=True``
and learning rates held in device tensors that each step fills. A caller that checks the
loss for NaN reads it after the replay, so a non-finite step has already been applied.

- :class:`StepGraph`: ``srope train``'s step, every micro-batch of a rank's share and the
  summed token loss. With several processes (DDP) the gradients are views into a flat buffer
  (:class:`~srope.lab.train.distributed.FlatGradients`) that one NCCL all-reduce averages
  inside the graph, before clipping; every rank replays the same graph on its own micro-batches.
- :func:`graphed_optimizer_step`: :func:`srope.lab.step.optimizer_step` (the synthetic tasks'
  and the demo's step) captured; a batch of another shape than the first (an epoch's last,
  smaller batch) runs eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn

from srope.lab.step import optimizer_step


class GraphCaptureError(RuntimeError):
    """The step could not be captured (something in it synchronises with the host)."""


class CapturedStep:
    """``run(lr)``: ``compute()`` (which reads only tensors that stay in place, filled before
    the call) as eager warm-up steps on a side stream, then captured once and replayed."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, *, warmup: int = 2, thread_local: bool = False):
        _require_cuda(device)
        self.optimizer, self.warmup, self.thread_local = optimizer, warmup, thread_local
        for group in optimizer.param_groups:
            group["capturable"] = True
            # one tensor per group for every graph of this optimiser: a graph captured earlier
            # reads the rate that each step fills, not one it was handed at its capture
            if not (isinstance(group["lr"], torch.Tensor) and group["lr"].device == device):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        # a capturable AdamW keeps its step counts on the device; a state loaded from a
        # checkpoint of a non-capturable run (e.g. written on the CPU) has them on the host
        for state in optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(device=device, dtype=torch.float32)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None

    def compute(self) -> Any:
        raise NotImplementedError

    def run(self, lr: float) -> Any:
        for group in self.optimizer.param_groups:
            group["lr"].fill_(lr * group.get("lr_scale", 1.0))
        if self.warmup > 0:
            self.warmup -= 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.optimizer.zero_grad(set_to_none=True)  # an eager step before this one leaves its gradients
                outputs = self.compute()
                self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(side)
            return outputs
        if self.graph is None:
            self.optimizer.zero_grad(set_to_none=True)  # the gradients live in the graph's memory pool
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
            try:
                # NCCL's watchdog thread queries events while this thread captures: only this
                # thread's calls must be capture-safe
                with torch.cuda.graph(graph, capture_error_mode="thread_local" if self.thread_local else "global"):
                    self.outputs = self.compute()
            except RuntimeError as error:  # nothing ran: a capture records the kernels, it does not execute them
                # a failed capture_end leaves the capture stream current (torch.cuda.graph
                # restores it only after a clean end)
                torch.cuda.set_stream(stream)
                self.optimizer.zero_grad(set_to_none=True)
                raise GraphCaptureError(f"the training step could not be captured as a CUDA graph ({' '.join(str(error).split())[:300]})") from error
            self.graph = graph
        self.graph.replay()
        return self.outputs


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"a CUDA graph needs the model on a CUDA device, got {device}")


class StepGraph(CapturedStep):
    """``step(parts, lr)`` runs one optimiser step on the micro-batches ``parts`` (``Batch``
    objects of equal shape) and returns the (device) summed token loss and gradient norm."""

    def __init__(self, model, optimizer, params, *, loss_sum, parts: int, micro: int, seq_len: int, grad_clip: float, targets: int,
                 warmup: int = 2, world=None, flat_gradients=None, global_targets: int | None = None):  # fmt: skip
        """``targets``: this rank's targets a step; with several ranks, ``world``,
        ``flat_gradients`` (a FlatGradients over ``params``) and ``global_targets``, the
        targets of all ranks together (the loss is their token mean, as in the eager step)."""
        device = next(iter(params)).device
        distributed = world is not None and world.distributed
        if distributed and (flat_gradients is None or global_targets is None):
            raise ValueError("a captured step of several processes needs flat_gradients and global_targets")
        super().__init__(optimizer, device, warmup=warmup, thread_local=world is not None)
        self.model, self.params, self.loss_sum_fn = model, params, loss_sum
        self.grad_clip, self.targets = grad_clip, targets
        self.world, self.flat = (world, flat_gradients) if distributed else (None, None)
        # as the eager step scales: the ranks' mean of (size / global targets) x their sums
        per_rank = global_targets / world.size if distributed else targets
        self.scale = 1 / torch.tensor(float(per_rank), dtype=torch.float32, device=device)
        self.ids = torch.zeros((parts, micro, seq_len), dtype=torch.long, device=device)
        self.labels = torch.zeros((parts, micro, seq_len), dtype=torch.long, device=device)

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.ids.device)
        if self.flat is not None:
            self.flat.attach()
        for ids, labels in zip(self.ids, self.labels):
            part = self.loss_sum_fn(ids, labels)
            (part * self.scale).backward()
            loss_sum += part.detach().double()
        if self.flat is not None:
            self.flat.average(self.world)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip or float("inf"))
        self.optimizer.step()
        return loss_sum, grad_norm

    def step(self, parts, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        if sum(part.num_targets for part in parts) != self.targets:
            raise ValueError(f"a captured step trains on {self.targets} targets, this one has {sum(p.num_targets for p in parts)}")
        for i, part in enumerate(parts):
            self.ids[i].copy_(part.input_ids, non_blocking=True)
            self.labels[i].copy_(part.labels, non_blocking=True)
        return self.run(lr)


class _BatchGraph(CapturedStep):
    """The plain step on tensors that stay in place: ``loss(*inputs)``, backward, clipping, step."""

    def __init__(self, model: nn.Module, optimizer, loss: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...], grad_clip: float | None):
        super().__init__(optimizer, batch[0].device)
        self.model, self.loss, self.grad_clip = model, loss, grad_clip
        self.inputs = tuple(torch.empty_like(tensor) for tensor in batch)

    def matches(self, batch: tuple[Any, ...]) -> bool:
        return len(batch) == len(self.inputs) and all(
            isinstance(t, torch.Tensor) and t.shape == s.shape and t.dtype == s.dtype and t.device == s.device for t, s in zip(batch, self.inputs)
        )

    def compute(self) -> torch.Tensor:
        value = self.loss(*self.inputs)
        value.backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return value.detach()

    def step(self, batch: tuple[torch.Tensor, ...], lr: float) -> torch.Tensor:
        for buffer, tensor in zip(self.inputs, batch):
            buffer.copy_(tensor, non_blocking=True)
        return self.run(lr).clone()  # the graph overwrites its output at the next replay


def graphed_optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: Callable[..., torch.Tensor], *,
                           grad_clip: float | None = None, strict: bool = False,
                           key: Callable[[int], Hashable] | None = None) -> Callable[..., torch.Tensor]:  # fmt: skip
    """:func:`srope.lab.step.optimizer_step` as a CUDA graph: the batch captured fixes the
    shapes (until then a batch with a larger first tensor starts the warm-up again), a batch
    of other shapes runs eagerly (same update). ``step.replayed`` counts the captured steps. ``loss`` must not
    synchronise with the host (no ``.item()``, no data-dependent shapes) and should run under
    an autocast without its weight cache (``cache_enabled=False``). If the capture fails the
    step goes on eagerly with a warning, or raises :class:`GraphCaptureError` when ``strict``.

    ``key(step)``: one graph per value, for a run whose shapes or Python-side settings change
    in stages (the demo's curriculum: each stage's length and phase noise); each key's graph
    warms up and captures on its own first steps, and keeps its memory pool for as long as the
    step lives (a key may come back). Without it, one graph for the whole run."""
    eager = optimizer_step(model, optimizer, loss, grad_clip=grad_clip)
    graphs: dict[Hashable, _BatchGraph] = {}
    state = {"failed": False}

    def step(at: int, lr: float, *batch: torch.Tensor) -> torch.Tensor:
        name = None if key is None else key(at)
        graph = graphs.get(name)
        # until the capture a larger batch takes over the graph: a resume may start at an epoch's last, smaller batch
        larger = graph is not None and graph.graph is None and not graph.matches(batch) and batch[0].numel() > graph.inputs[0].numel()
        if (graph is None or larger) and not state["failed"]:
            graph = graphs[name] = _BatchGraph(model, optimizer, loss, batch, grad_clip)
        if graph is not None and graph.matches(batch):
            try:
                out = graph.step(batch, lr)
                step.replayed += graph.graph is not None
                return out
            except GraphCaptureError as error:
                if strict:
                    raise
                warnings.warn(f"{error}; training on without a CUDA graph", stacklevel=2)
                graphs.clear()
                state["failed"] = True
        return eager(at, lr, *batch)  # fills the lr tensors a capture left in the groups

    step.replayed = 0
    return step
