"""The token embedding, with a weight gradient that is the same in every run on CUDA.

PyTorch's CUDA embedding backward sums the gradients of the rows that share a token with
atomic additions unless deterministic algorithms are on, so the sum's rounding, and with it a
training run, varies from one run to the next: on an H100 the weight gradient of a
synthetic task's step (4 tokens, 132,096 positions) differed between repeats by about 2e-6
while every other gradient and every activation repeated bitwise
(``benchmarks/check_repeat.py``). Such differences grow over thousands of steps into runs
that do not repeat, and a resumed run that does not continue its uninterrupted twin. Here the
backward runs PyTorch's own deterministic algorithm (sorted indices, sums in a fixed order),
switched on for that one call only; the forward is ``F.embedding``.

Not covered: a model under ``torch.compile`` (the compiler generates its own backward for the
lookup) and an embedding replaced by ``resize_token_embeddings`` (transformers builds a
plain ``nn.Embedding``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


@contextlib.contextmanager
def deterministic_algorithms():
    """PyTorch's deterministic algorithms for the ops run inside, the previous settings after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    # filling new buffers with NaN makes uninitialised reads visible; these sums read none
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


class _DeterministicEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows, ctx.padding_idx = weight.shape[0], padding_idx
        return F.embedding(ids, weight, None if padding_idx < 0 else padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        with deterministic_algorithms():
            grad_weight = torch.ops.aten.embedding_dense_backward(grad, ids, ctx.rows, ctx.padding_idx, False)
        return None, grad_weight, None


def deterministic_embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient is summed in a fixed order."""
    return _DeterministicEmbedding.apply(ids, weight, -1 if padding_idx is None else padding_idx)


class Embedding(nn.Embedding):
    """``nn.Embedding`` whose weight gradient repeats bitwise on CUDA (see the module's doc).

    The CPU's embedding backward is deterministic already, and the options this path does not
    carry (``max_norm``, ``scale_grad_by_freq``, ``sparse``) take ``nn.Embedding``'s path."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        plain = self.max_norm is not None or self.scale_grad_by_freq or self.sparse
        if ids.is_cuda and self.weight.requires_grad and torch.is_grad_enabled() and not plain and not torch.compiler.is_compiling():
            return deterministic_embedding(ids, self.weight, self.padding_idx)
        return super().forward(ids)
