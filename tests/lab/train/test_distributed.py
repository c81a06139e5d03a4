"""Data-parallel pieces that run without a GPU (gloo, two processes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from srope.lab.train.distributed import FlatGradients, World


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3, bias=False), nn.LayerNorm(3)).double()  # float64: sums in another order agree


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 5, generator=generator, dtype=torch.float64), torch.randn(8, 3, generator=generator, dtype=torch.float64)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum()


def _rank(rank: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = _model()
        params = list(model.parameters())
        flat = FlatGradients(params)
        x, y = _data()
        for _ in range(2):  # a second step re-zeroes the buffers
            flat.attach()
            for part in range(2):  # two micro-batches, accumulated in place
                rows = slice(4 * rank + 2 * part, 4 * rank + 2 * part + 2)
                (_loss(model, x[rows], y[rows]) * 2 / 8).backward()  # size / global rows, as the trainer scales
            flat.average(World(rank=rank, size=2))
        assert all(p.grad.data_ptr() == v.data_ptr() for p, v in flat.views)
        # numpy arrays go by value: a tensor would be sent as a shared-memory handle that
        # the parent can only open while this process still runs
        queue.put((rank, [p.grad.numpy().copy() for p in params]))
    finally:
        dist.destroy_process_group()


def test_flat_gradients_average_over_ranks_equals_one_process():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(rank, port, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    model = _model()
    x, y = _data()
    (_loss(model, x, y) / 8).backward()
    for rank in range(2):
        for got, param in zip(results[rank], model.parameters()):
            torch.testing.assert_close(torch.from_numpy(got), param.grad, rtol=1e-12, atol=1e-14)


def test_flat_gradients_group_by_dtype():
    params = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2, 2, dtype=torch.float64)), nn.Parameter(torch.ones(4))]
    flat = FlatGradients(params)
    assert sorted(b.numel() for b in flat.buffers) == [4, 7]
    flat.attach()
    assert all(p.grad.shape == p.shape and p.grad.dtype == p.dtype and not p.grad.any() for p in params)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_single_process_is_not_wrapped(parallel):
    from srope.lab.train.distributed import wrap_model

    model = _model()
    assert wrap_model(model, World(), parallel, flat_gradients=True) is model
