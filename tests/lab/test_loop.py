"""The lab's training loop (srope.lab.loop): the plain step is what a hand-written AdamW step is."""

import torch

from srope.lab.loop import optimizer_step, set_learning_rate, train_steps


def _model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    data = [(step, torch.randn(16, 4), torch.randn(16, 1)) for step in range(6)]
    return model, data


def test_steps_equal_a_hand_written_loop_with_group_scales_and_clipping():
    def optimizer_of(model):
        return torch.optim.AdamW([{"params": model[0].parameters(), "lr_scale": 0.5}, {"params": model[2].parameters()}], lr=1.0)

    def lr_at(step):
        return 1e-2 * (step + 1)

    model, data = _model_and_data()
    optimizer = optimizer_of(model)
    seen = []
    step = optimizer_step(model, optimizer, lambda x, y: torch.nn.functional.mse_loss(model(x), y), grad_clip=0.1)
    train_steps(data, step, lr_at=lr_at, before=lambda step: seen.append(("before", step)), after=lambda step, loss: seen.append(("after", step, loss.requires_grad)))

    reference, _ = _model_and_data()
    ref_optimizer = optimizer_of(reference)
    for step, x, y in data:
        ref_optimizer.param_groups[0]["lr"], ref_optimizer.param_groups[1]["lr"] = 0.5 * lr_at(step), lr_at(step)
        loss = torch.nn.functional.mse_loss(reference(x), y)
        ref_optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        ref_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    assert seen[:2] == [("before", 0), ("after", 0, False)] and len(seen) == 12


def test_a_truthy_after_ends_the_loop_and_is_returned():
    model, data = _model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    done = []
    step = optimizer_step(model, optimizer, lambda x, y: model(x).square().mean())
    ended = train_steps(data, step, lr_at=lambda step: 0.1, after=lambda step, loss: done.append(step) or ("stop" if step == 2 else None))
    assert ended == "stop" and done == [0, 1, 2]
    assert train_steps(data[:1], step, lr_at=lambda step: 0.1) is None


def test_the_step_gets_the_step_index_the_learning_rate_and_the_batch():
    calls = []
    result = train_steps([(3, "a", "b"), (4, "c")], lambda step, lr, *batch: calls.append((step, lr, batch)), lr_at=lambda step: step / 10,
                         after=lambda step, value: value)
    assert result is None and calls == [(3, 0.3, ("a", "b")), (4, 0.4, ("c",))]


def test_a_learning_rate_held_in_a_tensor_is_filled_in_place():
    """A captured step reads the learning rate from the group's tensor: it must stay the same tensor."""
    model, _ = _model_and_data()
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "lr_scale": 0.5}, {"params": model[2].parameters()}], lr=1.0)
    held = optimizer.param_groups[0]["lr"] = torch.tensor(1.0)
    set_learning_rate(optimizer, 0.25)
    assert optimizer.param_groups[0]["lr"] is held and float(held) == 0.125 and optimizer.param_groups[1]["lr"] == 0.25
