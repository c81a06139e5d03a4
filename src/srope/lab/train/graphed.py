"""The training step as one CUDA graph.

In eager mode a training step of a model of this library's size waits on Python: hundreds of
small kernel launches with autograd and the layers' code between them. With fixed shapes
(one process, ``packing="concat"``: every step has the same ``[micro, T]`` micro-batches
and the same number of targets) the whole step -- every micro-batch's forward, summed token
loss and backward, gradient clipping and the AdamW update -- is captured once as a CUDA
graph and replayed, which launches the same kernels with no Python in between.

The first ``warmup`` steps run eagerly on a side stream (Triton's autotuning, cuBLAS
workspaces and lazy allocations happen there, as capture requires); the next step is
captured and replayed. They are all real training steps. AdamW runs with ``capturable=True``
and a learning rate held in a device tensor that each step fills. The NaN guard reads the
loss and gradient norm after the replay, so a non-finite step has already been applied when
it stops the run (the last checkpoint is intact).

With several processes (DDP) the gradients are views into a flat buffer
(:class:`~srope.lab.train.distributed.FlatGradients`) that one NCCL all-reduce averages inside
the graph, before clipping; every rank replays the same graph on its own micro-batches.
"""

from __future__ import annotations

import torch


class GraphCaptureError(RuntimeError):
    """The step could not be captured (something in it synchronises with the host)."""


class StepGraph:
    """``step(parts, lr)`` runs one optimiser step on the micro-batches ``parts`` (``Batch``
    objects of equal shape) and returns the (device) summed token loss and gradient norm."""

    def __init__(self, model, optimizer, params, *, loss_sum, parts: int, micro: int, seq_len: int, grad_clip: float, targets: int,
                 warmup: int = 2, world=None, flat_gradients=None, global_targets: int | None = None):  # fmt: skip
        """``targets``: this rank's targets a step; with several ranks, ``world``,
        ``flat_gradients`` (a FlatGradients over ``params``) and ``global_targets``, the
        targets of all ranks together (the loss is their token mean, as in the eager step)."""
        device = next(iter(params)).device
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs the model on a CUDA device, got {device}")
        distributed = world is not None and world.distributed
        if distributed and (flat_gradients is None or global_targets is None):
            raise ValueError("a captured step of several processes needs flat_gradients and global_targets")
        self.model, self.optimizer, self.params, self.loss_sum_fn = model, optimizer, params, loss_sum
        self.grad_clip, self.targets, self.warmup = grad_clip, targets, warmup
        self.world, self.flat = (world, flat_gradients) if distributed else (None, None)
        # as the eager step scales: the ranks' mean of (size / global targets) x their sums
        per_rank = global_targets / world.size if distributed else targets
        self.scale = 1 / torch.tensor(float(per_rank), dtype=torch.float32, device=device)
        self.ids = torch.zeros((parts, micro, seq_len), dtype=torch.long, device=device)
        self.labels = torch.zeros((parts, micro, seq_len), dtype=torch.long, device=device)
        for group in optimizer.param_groups:
            group["capturable"] = True
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def _compute(self) -> tuple[torch.Tensor, torch.Tensor]:
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
        for group in self.optimizer.param_groups:
            group["lr"].fill_(lr)
        if self.warmup > 0:
            self.warmup -= 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                outputs = self._compute()
                self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(side)
            return outputs
        if self.graph is None:
            self.optimizer.zero_grad(set_to_none=True)  # the gradients live in the graph's memory pool
            graph = torch.cuda.CUDAGraph()
            try:
                # NCCL's watchdog thread queries events while this thread captures: only this
                # thread's calls must be capture-safe
                with torch.cuda.graph(graph, capture_error_mode="thread_local" if self.world is not None else "global"):
                    self.outputs = self._compute()
            except RuntimeError as error:  # nothing ran: a capture records the kernels, it does not execute them
                self.optimizer.zero_grad(set_to_none=True)
                raise GraphCaptureError(f"the training step could not be captured as a CUDA graph ({' '.join(str(error).split())[:300]})") from error
            self.graph = graph
        self.graph.replay()
        return self.outputs
