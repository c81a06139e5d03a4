"""The captured step (srope.lab.graphed) off the GPU: everything but the capture itself.

The warm-up steps, the eager steps of other shapes between them and the optimiser state they
leave behind are plain PyTorch; only the side stream and the capture need CUDA. Here the
stream calls are stood in for and the graph is never reached (``warmup`` exceeds the steps),
so the test checks the steps' bookkeeping against the eager step; the capture and replay are
checked on the GPU (tests/lab/tasks/test_runner.py, benchmarks/check_cuda.py).
"""

import contextlib
import types

import pytest
import torch

from srope.lab import graphed
from srope.lab.trainer import optimizer_step


def _model_and_batches(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    full = [(torch.randn(16, 4), torch.randn(16, 1)) for _ in range(3)]
    small = (torch.randn(5, 4), torch.randn(5, 1))
    return model, [full[0], small, full[1], small, full[2]]


@pytest.fixture
def streams_on_the_cpu(monkeypatch):
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(graphed.torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(graphed.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(graphed.torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(graphed, "_require_cuda", lambda device: None)
    monkeypatch.setattr(graphed.CapturedStep, "run", _never_capture(graphed.CapturedStep.run))


def _never_capture(run):
    def guarded(self, lr):
        assert self.warmup > 0, "the test's steps must all be warm-ups: capture needs CUDA"
        return run(self, lr)

    return guarded


def test_warm_ups_between_eager_steps_of_other_shapes_train_as_the_eager_step(streams_on_the_cpu):
    """Full batches warm up (the graph's shapes), the smaller ones run eagerly: each warm-up
    must start from cleared gradients, not add the eager step's before it."""

    def loss_of(model):
        return lambda x, y: torch.nn.functional.mse_loss(model(x), y)

    model, batches = _model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = graphed.graphed_optimizer_step(model, optimizer, loss_of(model), grad_clip=0.5)
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(0.1)  # as CapturedStep holds it, on the CPU
    reference, _ = _model_and_batches()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    ref_step = optimizer_step(reference, ref_optimizer, loss_of(reference), grad_clip=0.5)

    original = graphed._BatchGraph.__init__

    def many_warm_ups(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.warmup = len(batches)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphed._BatchGraph, "__init__", many_warm_ups)
        for at, batch in enumerate(batches):
            loss, ref_loss = step(at, 0.1 / (at + 1), *batch), ref_step(at, 0.1 / (at + 1), *batch)
            assert torch.equal(loss, ref_loss), at
            for (name, a), b in zip(model.named_parameters(), reference.parameters()):
                assert torch.equal(a, b), (at, name)
    assert step.replayed == 0


def test_the_first_batch_captured_need_not_be_the_first_batch_seen(streams_on_the_cpu):
    """A run that starts at an epoch's last, smaller batch (a resume) still captures the full one."""
    model, batches = _model_and_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = graphed.graphed_optimizer_step(model, optimizer, lambda x, y: model(x).square().mean())
    made = []
    original = graphed._BatchGraph.__init__

    def recording(self, model, optimizer, loss, batch, grad_clip):
        original(self, model, optimizer, loss, batch, grad_clip)
        self.warmup = 10
        made.append(batch[0].shape[0])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphed._BatchGraph, "__init__", recording)
        for at, batch in enumerate([batches[1], batches[0], batches[1], batches[2]]):
            step(at, 0.1, *batch)
    assert made == [5, 16]  # rebuilt for the full batch while nothing was captured, then kept


def test_optimiser_step_counts_move_to_the_device_with_the_graph(streams_on_the_cpu):
    """A capturable AdamW wants its step counts on the model's device in float32; a state
    loaded from a non-capturable run's checkpoint may hold them elsewhere."""
    model, batches = _model_and_batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    optimizer_step(model, optimizer, lambda x, y: model(x).square().mean())(0, 0.1, *batches[0])
    for state in optimizer.state.values():
        state["step"] = state["step"].double()
    graphed.CapturedStep(optimizer, torch.device("cpu"))
    assert all(state["step"].dtype == torch.float32 for state in optimizer.state.values())


def test_a_captured_step_needs_cuda():
    model, batches = _model_and_batches()
    step = graphed.graphed_optimizer_step(model, torch.optim.AdamW(model.parameters()), lambda x, y: model(x).square().mean())
    with pytest.raises(ValueError, match="CUDA"):
        step(0, 0.1, *batches[0])


def test_one_graph_per_key_sharing_the_learning_rate_tensors(streams_on_the_cpu):
    """With ``key``, each value (a curriculum stage) gets a graph of its own, warmed up on its own
    first steps; all of them read the same learning-rate tensor per group, so a graph captured
    earlier follows the schedule too. The steps train as the eager step does."""
    model, batches = _model_and_batches()
    reference, _ = _model_and_batches()
    # SGD: a capturable AdamW runs on accelerators only
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    made, rates = [], []
    original = graphed._BatchGraph.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.warmup = 10
        made.append(self.inputs[0].shape[0])
        rates.append([group["lr"] for group in optimizer.param_groups])

    stage = {0: "a", 1: "a", 2: "b", 3: "b", 4: "a"}
    step = graphed.graphed_optimizer_step(model, optimizer, lambda x, y: model(x).square().mean(), key=stage.__getitem__)
    ref_step = optimizer_step(reference, ref_optimizer, lambda x, y: reference(x).square().mean())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphed._BatchGraph, "__init__", recording)
        for at, batch in enumerate([batches[0], batches[2], batches[1], batches[3], batches[4]]):
            assert torch.equal(step(at, 0.1 / (at + 1), *batch), ref_step(at, 0.1 / (at + 1), *batch)), at
    assert made == [16, 5]  # stage "a" keeps its graph when it comes back
    assert all(a is b for a, b in zip(*rates))
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
