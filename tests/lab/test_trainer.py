"""The lab's Trainer (srope.lab.trainer): its plain step is what a hand-written AdamW step is,
hooks run around every step, a truthy after_step ends the loop, checkpoints resume exactly."""

import pytest
import torch

from srope.lab.step import set_learning_rate
from srope.lab.trainer import Hook, Trainer


def _model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    data = [(step, torch.randn(16, 4), torch.randn(16, 1)) for step in range(6)]
    return model, data


class _Seen(Hook):
    def __init__(self, seen, stop_at=None):
        self.seen, self.stop_at = seen, stop_at

    def before_step(self, trainer, step):
        self.seen.append(("before", step))

    def after_step(self, trainer, step, loss):
        self.seen.append(("after", step, loss.requires_grad))
        return "stop" if step == self.stop_at else None

    def end(self, trainer):
        self.seen.append(("end",))


def _trainer(model, hooks=(), grad_clip=0.1, lr_at=lambda step: 1e-2 * (step + 1)):
    groups = [{"params": model[0].parameters(), "lr_scale": 0.5}, {"params": model[2].parameters()}]
    return Trainer(model, groups, lr=1.0, lr_at=lr_at, betas=(0.9, 0.999), weight_decay=0.01, hooks=hooks, grad_clip=grad_clip,
                   loss=lambda x, y: torch.nn.functional.mse_loss(model(x), y))


def test_steps_equal_a_hand_written_loop_with_group_scales_and_clipping():
    def lr_at(step):
        return 1e-2 * (step + 1)

    model, data = _model_and_data()
    seen = []
    assert _trainer(model, [_Seen(seen)]).fit(data) is None

    reference, _ = _model_and_data()
    ref_optimizer = torch.optim.AdamW([{"params": reference[0].parameters()}, {"params": reference[2].parameters()}], lr=1.0, betas=(0.9, 0.999),
                                      weight_decay=0.01)
    for step, x, y in data:
        ref_optimizer.param_groups[0]["lr"], ref_optimizer.param_groups[1]["lr"] = 0.5 * lr_at(step), lr_at(step)
        loss = torch.nn.functional.mse_loss(reference(x), y)
        ref_optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        ref_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    assert seen[:2] == [("before", 0), ("after", 0, False)] and len(seen) == 13 and seen[-1] == ("end",)


def test_a_truthy_after_step_ends_the_loop_and_is_returned():
    model, data = _model_and_data()
    seen = []
    assert _trainer(model, [_Seen(seen, stop_at=2)]).fit(data) == "stop"
    assert [s for s in seen if s[0] == "after"] == [("after", i, False) for i in range(3)] and seen[-1] == ("end",)


def test_the_step_gets_the_step_index_the_learning_rate_and_the_batch():
    calls = []

    class Recording(Trainer):
        def train_step(self, step, lr, *batch):
            calls.append((step, lr, batch))

    model, _ = _model_and_data()
    trainer = Recording(model, model.parameters(), lr=1.0, lr_at=lambda step: step / 10)
    assert trainer.fit([(3, "a", "b"), (4, "c")]) is None and calls == [(3, 0.3, ("a", "b")), (4, 0.4, ("c",))]


def test_a_trainer_without_a_step_or_a_schedule_says_what_it_needs():
    model, data = _model_and_data()
    with pytest.raises(NotImplementedError, match="pass loss= or override train_step"):
        Trainer(model, model.parameters(), lr=1.0, lr_at=lambda step: 0.1).fit(data)
    with pytest.raises(NotImplementedError, match="needs lr_at"):
        Trainer(model, model.parameters(), lr=1.0, loss=lambda x, y: model(x).sum()).fit(data)
    with pytest.raises(ValueError, match="cuda_graph must be one of"):
        Trainer(model, model.parameters(), lr=1.0, cuda_graph="yes")


def test_a_checkpoint_resumes_exactly(tmp_path):
    """Three steps, a checkpoint, three more equal six steps; the caller's state comes back."""
    model, data = _model_and_data()
    _trainer(model).fit(data)
    cut, _ = _model_and_data()
    first = _trainer(cut)
    first.fit(data[:3])
    first.save(tmp_path, 3, {"position": 3})
    resumed_model, _ = _model_and_data(seed=1)  # other weights: the checkpoint overwrites them
    resumed = _trainer(resumed_model)
    state = resumed.resume(tmp_path, strict_optimizer=True, fields={"position": int})
    assert state["step"] == 3 and state["position"] == 3
    resumed.fit(data[3:])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))
    assert _trainer(_model_and_data()[0]).resume(tmp_path / "none") is None


def test_a_learning_rate_held_in_a_tensor_is_filled_in_place():
    """A captured step reads the learning rate from the group's tensor: it must stay the same tensor."""
    model, _ = _model_and_data()
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "lr_scale": 0.5}, {"params": model[2].parameters()}], lr=1.0)
    held = optimizer.param_groups[0]["lr"] = torch.tensor(1.0)
    set_learning_rate(optimizer, 0.25)
    assert optimizer.param_groups[0]["lr"] is held and float(held) == 0.125 and optimizer.param_groups[1]["lr"] == 0.25
