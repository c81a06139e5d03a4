"""Views of a batch as rows of real tokens, for ops that mix along time.

A batch arrives dense (``[B, T]``, every token real), padded (``attention_mask [B, T]``,
left or right padding) or packed (``cu_seqlens``, ``B == 1``). Sequence-mixing ops with
a carried state, like a short causal convolution, are easiest to get right on one shape:
each sequence's real tokens first, in order, as rows ``[N, L]`` with their ``lengths``.
Padded tokens then are truly invisible: they neither enter a window nor the final state.
"""

from __future__ import annotations

import torch


def sequence_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """Index of the packed sequence each of ``length`` tokens belongs to."""
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:], positions, right=True)


class RowLayout:
    """Maps ``[B, T, ...]`` to rows of real tokens ``[N, L, ...]`` and back.

    ``lengths [N]`` is the number of real tokens of each row. Positions past a row's
    length hold zeros in :meth:`to_rows`; :meth:`from_rows` writes zeros at padded tokens.
    """

    def __init__(
        self,
        batch: int,
        length: int,
        *,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.batch, self.length = batch, length
        self.mask = self.order = self.index = None
        self.cu_seqlens = cu_seqlens
        if cu_seqlens is not None:
            starts = cu_seqlens[:-1].long()
            self.lengths = cu_seqlens[1:].long() - starts
            # Rows as wide as the longest document. Under torch.compile that width would be a
            # host sync and a data-dependent shape (a graph break); there the rows are as wide
            # as the packed batch (no document is longer), a static shape. The extra steps are
            # zeros past each row's length, like a shorter document's, and never read back;
            # they cost N·T instead of N·max(lengths) elements.
            if torch.compiler.is_compiling():
                width = length
            else:
                width = int(self.lengths.max()) if self.lengths.numel() else 0
            steps = torch.arange(width, device=cu_seqlens.device)
            self.valid = steps < self.lengths[:, None]
            self.index = (starts[:, None] + steps).clamp(max=max(length - 1, 0))
            self.seq = torch.searchsorted(cu_seqlens[1:].long(), torch.arange(length, device=cu_seqlens.device), right=True)
            self.step = torch.arange(length, device=cu_seqlens.device) - starts[self.seq]
        # (an all-ones mask is no padding; under torch.compile it takes the general path
        # rather than a host sync to find that out)
        elif attention_mask is not None and (torch.compiler.is_compiling() or not bool(attention_mask.all())):
            self.mask = attention_mask != 0
            self.lengths = self.mask.sum(dim=1)
            # Stable sort puts each row's real tokens first, in their order.
            self.order = torch.argsort((~self.mask).to(torch.int8), dim=1, stable=True)
            self.valid = torch.arange(length, device=self.mask.device) < self.lengths[:, None]
        else:
            self.lengths = torch.full((batch,), length, dtype=torch.long, device=device)

    @classmethod
    def of(cls, batch: int, length: int, *, attention_mask=None, cu_seqlens=None, device=None, given=None) -> "RowLayout":
        """``given``, a layout the caller built once for this batch (from the same
        ``attention_mask`` / ``cu_seqlens``), after checking its shape; else a new one."""
        if given is None:
            return cls(batch, length, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=device)
        if not isinstance(given, RowLayout) or (given.batch, given.length) != (batch, length):
            got = (given.batch, given.length) if isinstance(given, RowLayout) else type(given).__name__
            raise ValueError(f"layout must be a RowLayout of this batch [B, T] = [{batch}, {length}], got {got}")
        return given

    @property
    def identity(self) -> bool:
        return self.order is None and self.index is None

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return x
        if self.index is not None:
            rows = x[0][self.index]
        else:
            rows = x.gather(1, self.order.view(*self.order.shape, *([1] * (x.dim() - 2))).expand_as(x))
        # a select, not a product with the mask: it keeps NaN/inf out of the padding, and inductor's
        # CPU code computed the product's gradient wrong for a packed gated delta rule's decay
        return torch.where(self.valid.view(*self.valid.shape, *([1] * (x.dim() - 2))), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))

    def take(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """``rows[n, steps[n, s]]`` as ``[N, S, ...]`` without building every row
        (``steps [N, S]`` in ``[0, L)``)."""
        if self.index is not None:
            return x[0][self.index.gather(1, steps)]
        if self.order is not None:
            steps = self.order.gather(1, steps)
        return x.gather(1, steps.view(*steps.shape, *([1] * (x.dim() - 2))).expand(*steps.shape, *x.shape[2:]))

    def from_rows(self, rows: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return rows
        if self.index is not None:
            return rows[self.seq, self.step][None]
        rows = torch.where(self.valid.view(*self.valid.shape, *([1] * (rows.dim() - 2))), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
        index = self.order.view(*self.order.shape, *([1] * (rows.dim() - 2))).expand_as(rows)
        return torch.zeros_like(rows).scatter(1, index, rows)
