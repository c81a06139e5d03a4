"""Batches of a token store: fixed-length rows, documents packed or not, a resumable sharded order.

its ``input_ids`` are the first ``L`` and its ``labels`` the last ``L``. ``labels`` are the
targets, already shifted (``labels[:, t]`` is the token after ``input_ids[:, t]``; do not
shift again). Every token after the first is a target exactly once per epoch. Packing:

* ``"concat"`` -- plain concatenation, the paper's setting: attention and targets run across
  document boundaries.
* ``"documents"`` -- the same rows, but a target that would be the first token of another
  document is ``IGNORE_INDEX``, and ``Batch.packed()`` flattens a batch to ``[1, B·L]`` with
  ``cu_seqlens`` at every document start and every row start, for the models' varlen path.

**Order** (:class:`PackedBatches`): epoch ``e`` visits the rows in the order of a PCG64
permutation seeded by ``(seed, e)`` (or in order when ``shuffle=False``); global step ``s`` is
the ``i``-th block of ``global_batch_size`` rows of epoch ``e``, with ``e, i = divmod(s,
steps_per_epoch)``; the rows left over at the end of an epoch are skipped in that epoch.
Rank ``r`` of ``W`` takes block ``r`` of ``W`` equal blocks of each global batch, so the
global batch is the same for every ``W`` that divides it. The state is ``{epoch, position,
seed, ...}``; a loader that loads it yields exactly the batches that follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from srope.lab.train.token_store import TokenStore

IGNORE_INDEX = -100
PACKING = ("concat", "documents")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_packing(packing: str) -> str:
    if packing not in PACKING:
        raise ValueError(f"packing must be one of {PACKING}, got {packing!r}")
    return packing


def num_rows(num_tokens: int, seq_len: int) -> int:
    """Rows of ``seq_len`` inputs (+1 target) that fit in a stream of ``num_tokens`` tokens."""
    return max(0, (num_tokens - 1) // seq_len)


@dataclass
class Batch:
    """``B`` rows of ``L`` tokens.

    input_ids: int64 ``[B, L]``.
    labels: int64 ``[B, L]``, the target of each position (already shifted), ``IGNORE_INDEX`` where none.
    doc_start: bool ``[B, L]``, True where a document's first token sits.
    rows: int64 ``[B]``, the row indices in the split's stream.
    packing: ``"concat"`` or ``"documents"``.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_start: torch.Tensor
    rows: torch.Tensor
    packing: str

    @property
    def num_targets(self) -> int:
        """Positions that carry a target; normalise a summed loss by the global total of this."""
        return int((self.labels != IGNORE_INDEX).sum())

    def to(self, device, non_blocking: bool = False) -> Batch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.input_ids), move(self.labels), move(self.doc_start), self.rows, self.packing)

    def split(self, micro_batch_size: int) -> list[Batch]:
        """Consecutive micro-batches of ``micro_batch_size`` rows (gradient accumulation)."""
        size = _check_int("micro_batch_size", micro_batch_size, 1)
        rows = self.input_ids.shape[0]
        if rows % size:
            raise ValueError(f"micro_batch_size {size} must divide the batch of {rows} rows")
        return [
            Batch(self.input_ids[i : i + size], self.labels[i : i + size], self.doc_start[i : i + size], self.rows[i : i + size], self.packing)
            for i in range(0, rows, size)
        ]

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids [1, B·L], labels [1, B·L], cu_seqlens int32 [N+1])`` for the varlen path.

        Segments start at every document start and every row start. Needs ``packing="documents"``
        (with ``"concat"`` a target may be the next document's first token).
        """
        if self.packing != "documents":
            raise ValueError("Batch.packed() needs a batch made with packing='documents'; with 'concat' labels cross documents")
        return flatten_packed(self.input_ids, self.labels, self.doc_start)


def flatten_packed(input_ids: torch.Tensor, labels: torch.Tensor, doc_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten ``[B, L]`` rows into one packed sequence ``[1, B·L]`` with ``cu_seqlens`` (int32).

    ``labels`` must already be masked at document ends (``packing="documents"``).
    """
    for name, value in (("input_ids", input_ids), ("labels", labels), ("doc_start", doc_start)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor [B, L], got {getattr(value, 'shape', type(value).__name__)}")
    if labels.shape != input_ids.shape or doc_start.shape != input_ids.shape:
        raise ValueError(f"input_ids, labels and doc_start must share a shape [B, L], got {tuple(input_ids.shape)}, {tuple(labels.shape)}, {tuple(doc_start.shape)}")
    if doc_start.dtype != torch.bool:
        raise TypeError(f"doc_start must be a bool tensor, got {doc_start.dtype}")
    batch, length = input_ids.shape
    starts = doc_start.clone()
    starts[:, 0] = True
    positions = torch.nonzero(starts.reshape(-1)).squeeze(1)
    cu_seqlens = torch.cat([positions, positions.new_tensor([batch * length])]).to(torch.int32)
    return input_ids.reshape(1, -1), labels.reshape(1, -1), cu_seqlens


def make_batch(store: TokenStore, rows, seq_len: int, packing: str = "concat") -> Batch:
    """The :class:`Batch` of the given row indices of ``store`` (rows of ``seq_len`` inputs)."""
    seq_len = _check_int("seq_len", seq_len, 1)
    _check_packing(packing)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    available = num_rows(store.num_tokens, seq_len)
    if rows.size and (rows.min() < 0 or rows.max() >= available):
        raise ValueError(f"row indices must lie in [0, {available}) for {store.num_tokens} tokens and seq_len {seq_len}")
    window = np.empty((rows.size, seq_len + 1), dtype=np.int64)
    for i, row in enumerate(rows):
        window[i] = store.tokens[row * seq_len : row * seq_len + seq_len + 1]
    positions = rows[:, None] * seq_len + np.arange(seq_len + 1)
    index = np.minimum(np.searchsorted(store.offsets, positions), store.offsets.shape[0] - 1)
    is_start = store.offsets[index] == positions
    labels = window[:, 1:].copy()
    if packing == "documents":
        labels[is_start[:, 1:]] = IGNORE_INDEX
    return Batch(
        input_ids=torch.from_numpy(np.ascontiguousarray(window[:, :-1])),
        labels=torch.from_numpy(labels),
        doc_start=torch.from_numpy(np.ascontiguousarray(is_start[:, :-1])),
        rows=torch.from_numpy(rows.copy()),
        packing=packing,
    )


class PackedBatches:
    """Training batches in a deterministic, resumable order, sharded over data-parallel ranks.

    Iterating yields this rank's share (``global_batch_size / world_size`` rows) of global step
    0, 1, 2, ... without end (epochs roll over; the trainer stops at its ``max_steps``).
    ``batch(step)`` gives any step directly. See the module docstring for the order.
    """

    def __init__(
        self,
        store: TokenStore,
        seq_len: int,
        global_batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        packing: str = "concat",
    ):
        self.store = store
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        self.seed = _check_int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.packing = _check_packing(packing)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.global_batch_size % self.world_size:
            raise ValueError(f"global_batch_size {self.global_batch_size} must be a multiple of world_size {self.world_size}")
        self.rows_per_epoch = num_rows(store.num_tokens, self.seq_len)
        self.steps_per_epoch = self.rows_per_epoch // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the split has {store.num_tokens} tokens = {self.rows_per_epoch} rows of {self.seq_len}, "
                f"fewer than one global batch of {self.global_batch_size} rows"
            )
        self.step = 0
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            if self.shuffle:
                order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.rows_per_epoch)
            else:
                order = np.arange(self.rows_per_epoch)
            self._order = (epoch, order)
        return self._order[1]

    def global_rows(self, step: int) -> np.ndarray:
        """Row indices of global step ``step`` (all ranks)."""
        epoch, position = divmod(_check_int("step", step, 0), self.steps_per_epoch)
        size = self.global_batch_size
        return self._epoch_order(epoch)[position * size : (position + 1) * size]

    def batch(self, step: int) -> Batch:
        """This rank's share of global step ``step``."""
        local = self.global_batch_size // self.world_size
        rows = self.global_rows(step)[self.rank * local : (self.rank + 1) * local]
        return make_batch(self.store, rows, self.seq_len, self.packing)

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> Batch:
        batch = self.batch(self.step)
        self.step += 1
        return batch

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def state_dict(self) -> dict:
        """Where the next batch comes from, plus what must match on resume (JSON-able)."""
        return {
            "epoch": self.epoch,
            "position": self.step % self.steps_per_epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "rows_per_epoch": self.rows_per_epoch,
            "store": self.store.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from any world size); the settings that fix the order must match."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "seq_len", "global_batch_size", "rows_per_epoch", "store"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state has {key}={state[key]!r} but this loader has {mine[key]!r}")
        epoch, position = _check_int("epoch", state["epoch"], 0), _check_int("position", state["position"], 0)
        if position >= self.steps_per_epoch:
            raise ValueError(f"position must be < steps_per_epoch={self.steps_per_epoch}, got {position}")
        self.step = epoch * self.steps_per_epoch + position


def eval_batches(
    store: TokenStore,
    seq_len: int,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    packing: str = "concat",
    max_rows: int | None = None,
) -> Iterator[Batch]:
    """Held-out batches, in order: rows ``0..n-1`` (at most ``max_rows``), rank ``r`` taking rows ``r, r+W, ...``.

    ``n`` is rounded down to a multiple of ``world_size``, so every rank gets the same number
    of batches of the same sizes (the last may be short); at most ``W-1`` rows and the final
    partial row are left out. ``seq_len`` may exceed the training length (extrapolation).
    """
    seq_len = _check_int("seq_len", seq_len, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    _check_packing(packing)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    total = num_rows(store.num_tokens, seq_len)
    if max_rows is not None:
        total = min(total, _check_int("max_rows", max_rows, 1))
    per_rank = total // world_size
    if per_rank == 0:
        raise ValueError(f"{store.num_tokens} tokens give {total} rows of {seq_len}, fewer than world_size {world_size}")
    rows = np.arange(per_rank * world_size).reshape(per_rank, world_size)[:, rank]
    for start in range(0, per_rank, batch_size):
        yield make_batch(store, rows[start : start + batch_size], seq_len, packing)


__all__ = ["IGNORE_INDEX", "PACKING", "Batch", "PackedBatches", "eval_batches", "flatten_packed", "make_batch", "num_rows"]
