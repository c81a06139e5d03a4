"""The lab's learning-rate schedules (srope.lab.schedule)."""

import types

import pytest

from srope.lab.schedule import stage_of, task_schedule, warmup_cosine, warmup_stable_decay, warmup_stable_decay_by_stage


def test_schedule_is_the_papers():
    peak, total = 1e-3, 100
    assert warmup_cosine(0, total=total, peak=peak) == pytest.approx(1e-5)
    assert warmup_cosine(10, total=total, peak=peak) == pytest.approx(peak)
    assert warmup_cosine(99, total=total, peak=peak) == pytest.approx(1e-4)
    values = [warmup_cosine(s, total=total, peak=peak) for s in range(total)]
    assert all(a <= b for a, b in zip(values[:10], values[1:11])) and all(a >= b for a, b in zip(values[10:], values[11:]))


def test_task_schedules():
    def cfg(**kw):
        return types.SimpleNamespace(**{"schedule": "constant", "warmup": 0.0, "min_lr": 0.0, **kw})

    def learning_rate(c, base, step, total, epoch, epochs):
        return task_schedule(c.schedule, base, step, total, epoch=epoch, epochs=epochs, min_lr=c.min_lr, warmup=c.warmup)

    warm = cfg(schedule="linear_warmup", warmup=0.1)
    assert learning_rate(warm, 1.0, 0, 100, 0, 1) == 0.0 and learning_rate(warm, 1.0, 5, 100, 0, 1) == 0.5
    assert learning_rate(warm, 1.0, 10, 100, 0, 1) == 1.0 and learning_rate(warm, 1.0, 99, 100, 0, 1) == pytest.approx(1 / 90)
    cos = cfg(schedule="cosine", min_lr=0.1)
    assert learning_rate(cos, 1.0, 0, 10, 0, 1) == 1.0 and learning_rate(cos, 1.0, 5, 10, 0, 1) == pytest.approx(0.55)
    per_epoch = cfg(schedule="cosine_epoch", min_lr=1e-6)
    assert learning_rate(per_epoch, 1e-3, 123, 999, 0, 200) == 1e-3
    assert learning_rate(per_epoch, 1e-3, 0, 999, 100, 200) == pytest.approx((1e-3 + 1e-6) / 2)
    assert learning_rate(cfg(), 0.3, 7, 10, 2, 3) == 0.3
    with pytest.raises(ValueError, match="unknown schedule"):
        task_schedule("cosine_restarts", 1.0, 0, 10)


def test_warmup_stable_decay():
    values = [warmup_stable_decay(s, total=10, peak=1.0, warmup_steps=2, cooldown_steps=4, min_ratio=0.2) for s in range(10)]
    assert values == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
    assert warmup_stable_decay(9, total=10, peak=1.0, warmup_steps=0, cooldown_steps=0, min_ratio=0.2) == 1.0


def test_warmup_stable_decay_by_stage():
    stages = (3, 2, 5)
    assert [stage_of(s, stages) for s in range(12)] == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2]  # past the end: the last stage
    plain = [warmup_stable_decay(s, total=10, peak=1.0, warmup_steps=2, cooldown_steps=4, min_ratio=0.2) for s in range(10)]
    options = dict(stage_steps=stages, peak=1.0, warmup_steps=2, cooldown_steps=4, min_ratio=0.2)
    assert [warmup_stable_decay_by_stage(s, **options) for s in range(10)] == plain
    factors = [0.5] * 3 + [0.25] * 2 + [0.125] * 5
    assert [warmup_stable_decay_by_stage(s, **options, stage_factors=(0.5, 0.25, 0.125)) for s in range(10)] == [f * v for f, v in zip(factors, plain)]
    rewarm = [1, 1, 1, 1 / 2, 1, 1 / 2, 1, 1, 1, 1]  # a fresh 2-step warm-up where stages 1 and 2 begin (steps 3 and 5)
    assert [warmup_stable_decay_by_stage(s, **options, switch_warmup_steps=2) for s in range(10)] == pytest.approx([f * v for f, v in zip(rewarm, plain)])


def test_no_warm_up_starts_at_the_peak():
    assert warmup_cosine(0, total=100, peak=1e-3, warmup=0.0) == pytest.approx(1e-3)
    assert warmup_cosine(99, total=100, peak=1e-3, warmup=0.0) == pytest.approx(1e-4)


def test_train_config_refuses_a_schedule_that_would_climb():
    from srope.lab.train.train_config import TrainConfig

    with pytest.raises(ValueError, match="lr_end .* must not exceed the peak lr"):
        TrainConfig(lr=5e-5).resolved()
    with pytest.raises(ValueError, match="warmup is the fraction"):
        TrainConfig(warmup=1.0).resolved()
