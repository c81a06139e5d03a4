"""CUDA-graph captures for the model benchmark: a whole training step, and a whole greedy
one-token decode step of a recurrent model (fixed-size state).

In eager mode at the benchmark's sizes the layers wait on Python (launch overhead:
``benchmarks/bench_host.py``), so eager tokens/s measure the host as much
as the kernels. Replaying a captured graph launches the same kernels with no Python in
between, which is what the issue's "CUDA graphs allowed" targets compare.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def state_tensors(cache) -> list[torch.Tensor]:
    """Every tensor of an :class:`srope.models.modeling.SRopeCache`, in ``LayerState.map`` order."""
    found: list[torch.Tensor] = []
    for state in cache.layers:
        state.map(lambda t: found.append(t) or t)
    return found


def _side_stream_warmup(fn, times: int) -> None:
    """Run ``fn`` ``times`` times on a side stream (autotuning and lazy allocations happen
    outside the capture, as torch.cuda.graph requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


class GraphedTrainStep:
    """Forward, backward and optimizer step of ``model`` on the static token ids ``ids
    [B, T+1]``, captured once; ``step()`` replays it and returns the (static) loss tensor.

    The optimizer's groups are switched to ``capturable`` (step counters on the GPU)."""

    def __init__(self, model, optimizer: torch.optim.Optimizer, ids: torch.Tensor, dtype=torch.bfloat16, warmup: int = 3):
        for group in optimizer.param_groups:
            group["capturable"] = True
        self.model, self.optimizer, self.ids, self.dtype = model, optimizer, ids, dtype
        _side_stream_warmup(self._step, warmup)
        optimizer.zero_grad(set_to_none=True)  # gradients are allocated inside the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._step()

    def _step(self) -> torch.Tensor:
        with torch.autocast("cuda", dtype=self.dtype, cache_enabled=False):
            logits = self.model(self.ids[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), self.ids[:, 1:].flatten())
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def step(self) -> torch.Tensor:
        self.graph.replay()
        return self.loss


class GraphedGreedyDecode:
    """Greedy one-token decoding from ``cache`` (returned by a prefill) and the next input
    ``token [N, 1]``, captured once: ``step()`` replays the model call, writes the new state
    into the cache's (static) tensors and the argmax into ``token``; returns the static
    logits ``[N, 1, V]`` of the token that was fed."""

    def __init__(self, model, cache, token: torch.Tensor, dtype=torch.bfloat16, warmup: int = 2):
        self.model, self.cache, self.dtype = model, cache, dtype
        self.static = [t.clone() for t in state_tensors(cache)]
        snapshot = [t.clone() for t in self.static]
        self.token = token.clone()
        first_token = self.token.clone()
        self._install()
        _side_stream_warmup(self._step, warmup)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        for static, value in zip(self.static, snapshot):  # the warm-up advanced the state
            static.copy_(value)
        self.token.copy_(first_token)

    def _install(self) -> None:
        tensors = iter(self.static)
        self.cache.layers = [state.map(lambda _: next(tensors)) for state in self.cache.layers]

    @torch.no_grad()
    def _step(self) -> torch.Tensor:
        with torch.autocast("cuda", dtype=self.dtype, cache_enabled=False):
            out = self.model(self.token, cache=self.cache, use_cache=True)
        from srope.models.cache import CACHE_FIELD

        new = state_tensors(getattr(out, CACHE_FIELD))
        if len(new) != len(self.static) or any(a.shape != b.shape for a, b in zip(new, self.static)):
            raise RuntimeError("the decode state changed shape; only fixed-size (recurrent) states can be graphed")
        for static, value in zip(self.static, new):
            static.copy_(value)
        self._install()
        self.cache.seen_tokens -= 1  # counted by step(), once per replay
        logits = out.logits
        self.token.copy_(logits[:, -1:].argmax(-1))
        return logits

    def step(self) -> torch.Tensor:
        self.graph.replay()
        self.cache.seen_tokens += 1
        return self.logits
