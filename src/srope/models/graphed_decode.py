"""One-token decoding replayed from a CUDA graph, which ``model.generate`` uses on CUDA.

A cached decoding step of a recurrent host (GLA, Gated DeltaNet: ``recurrent`` in
:data:`srope.registry.mixers`) reads and writes a state of fixed size, so the whole step --
embedding, every layer with its position encoding, the head -- can be captured once and
replayed: eagerly the step waits on Python for hundreds of launches, replayed it launches the
same kernels with none in between. The captured step reads a static token and static state
tensors and writes the new state back into them; the generating cache holds those static
tensors, so each replay advances it in place.

Used when: CUDA, no autograd, eval mode, one new token per row, a cache from a previous call
(prefill) whose every layer has a fixed-size state, and no padding in the new column (the
columns ``generate`` appends are real tokens; padding of the prompt lives in the state).
Anything else runs eagerly. ``model.decode_graphs = False`` turns it off. Graphs are kept per
batch size, autocast dtype, :mod:`srope.backend` setting (a graph replays the kernels it
captured) and state layout.
"""

from __future__ import annotations

import weakref

import torch

from srope import backend as srope_backend
from srope.models.cache import CACHE_FIELD, SRopeCache
from srope.registry import mixers


def _tensors(layers) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for state in layers:
        state.map(lambda t: found.append(t) or t)
    return found


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _layout(layers) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in _tensors(layers))


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for every pair, as one multi-tensor copy per dtype: the captured step
    then holds a few copy kernels instead of one per state tensor (four to six per layer)."""
    groups: dict[torch.dtype, tuple[list, list]] = {}
    for target, source in zip(targets, sources, strict=True):
        pair = groups.setdefault(target.dtype, ([], []))
        pair[0].append(target)
        pair[1].append(source)
    for group_targets, group_sources in groups.values():
        torch._foreach_copy_(group_targets, group_sources)


class DecodeGraphs:
    """The captured decoding steps of one model, by batch size, autocast dtype, backend setting
    and state layout."""

    def __init__(self, model):
        # the model holds this object: a strong reference back would be a cycle, and a model
        # deleted by its user would keep its device memory until the garbage collector ran
        self._model = weakref.ref(model)
        self.graphs: dict[tuple, _DecodeGraph] = {}

    @property
    def model(self):
        return self._model()

    def __deepcopy__(self, memo) -> "DecodeGraphs":  # a copied model captures its own graphs
        return DecodeGraphs(memo.get(id(self.model), self.model))

    def __getstate__(self) -> dict:  # graphs are not picklable and not worth keeping
        return {"model": self.model}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model"])

    def applies(self, input_ids, cache, *, attention_mask, inputs_embeds, labels, cu_seqlens, use_cache) -> bool:
        model = self.model
        if not (getattr(model, "decode_graphs", True) and mixers[model.config.mixer].recurrent and not model.training):
            return False
        if torch.is_grad_enabled() or inputs_embeds is not None or labels is not None or cu_seqlens is not None or use_cache is False:
            return False
        if input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] != 1 or input_ids.device.type != "cuda":
            return False
        if not isinstance(cache, SRopeCache) or cache.seen_tokens == 0 or any(state is None for state in cache.layers):
            return False
        if torch.cuda.is_current_stream_capturing():
            return False
        # the new column is a real token for every row (one small sync per step, as generate's own stopping checks)
        return attention_mask is None or bool(attention_mask[:, -1].all())

    def step(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        key = (input_ids.shape[0], dtype, srope_backend.get(), _layout(cache.layers))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = _DecodeGraph(self.model, cache, input_ids.shape[0], dtype)
        return graph.step(input_ids, cache)


class _DecodeGraph:
    def __init__(self, model, cache, batch: int, dtype):
        self.dtype = dtype  # the model only captures: a reference kept here would be a cycle (DecodeGraphs)
        self.layers = [state.map(torch.clone) for state in cache.layers]
        self.static = _tensors(self.layers)
        self.token = torch.zeros((batch, 1), dtype=torch.long, device="cuda")
        self.work = SRopeCache(len(self.layers))  # the cache the captured step runs on
        self.work.seen_tokens = cache.seen_tokens
        self.owner = None  # the generating cache that holds the static tensors now
        snapshot = [t.clone() for t in self.static]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # autotuning and lazy initialisation happen outside the capture
            for _ in range(2):
                self._run(model)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._run(model)
        for static, value in zip(self.static, snapshot):  # the warm-up advanced the state
            static.copy_(value)

    def _run(self, model) -> torch.Tensor:
        self.work.layers = list(self.layers)
        with torch.autocast("cuda", dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None, cache_enabled=False):
            out = model.model(self.token, cache=self.work, use_cache=True)
            logits = model.lm_head(out.last_hidden_state)
        new = _tensors(getattr(out, CACHE_FIELD).layers)
        if [(t.shape, t.dtype) for t in new] != [(t.shape, t.dtype) for t in self.static]:
            raise RuntimeError("the decoding state changed its layout; only fixed-size (recurrent) states can be replayed")
        _copy_all(self.static, new)
        return logits

    def step(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        if cache is not self.owner or not _same(cache.layers, self.layers):
            if self.owner is not None and self.owner is not cache and _same(self.owner.layers, self.layers):
                self.owner.layers = [state.map(torch.clone) for state in self.layers]  # the previous owner keeps its state
            for static, value in zip(self.static, _tensors(cache.layers)):
                static.copy_(value)
            cache.layers = list(self.layers)
            self.owner = cache
        self.token.copy_(input_ids)
        self.graph.replay()
        cache.seen_tokens += 1
        return self.logits.clone()
