"""MQAR: answers by lookup, layout, the power-law placement, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srope.lab.tasks import mqar
from srope.lab.config import apply_overrides
from srope.lab.tasks.common import IGNORE, rng_for


@pytest.mark.parametrize("seq_len,kv_pairs,vocab", [(64, 4, 8192), (128, 8, 300), (66, 16, 100), (512, 64, 8192)])
def test_answers_by_lookup(seq_len, kv_pairs, vocab):
    inputs, targets = mqar.generate(vocab, seq_len, kv_pairs, 50, rng_for(0, "mqar-test"))
    assert inputs.shape == targets.shape == (50, seq_len)
    context, half = 2 * kv_pairs, vocab // 2
    for x, y in zip(inputs, targets):
        keys, values = x[0:context:2], x[1:context:2]
        assert len(set(keys)) == kv_pairs and len(set(values)) == kv_pairs
        assert keys.min() >= 1 and keys.max() < half and values.min() >= half and values.max() < vocab
        lookup = dict(zip(keys.tolist(), values.tolist()))
        asked = np.nonzero(y != IGNORE)[0]
        assert len(asked) == kv_pairs and (asked >= context).all() and ((asked - context) % 2 == 0).all()
        assert sorted(x[asked].tolist()) == sorted(keys.tolist()), "every key is asked exactly once"
        assert all(y[i] == lookup[x[i]] for i in asked)
        rest = np.ones(seq_len, dtype=bool)
        rest[:context], rest[asked] = False, False
        assert (x[rest] == 0).all()


def test_gaps_follow_the_power_law():
    space, a = 12, 0.01
    p = mqar.power_law(space, a)
    assert p[0] > p[1] > p[-1] and p.sum() == pytest.approx(1.0)
    gaps = mqar.weighted_without_replacement(np.random.default_rng(0), p, 40000, 3)
    assert all(len(set(row)) == 3 for row in gaps[:200].tolist())
    first = np.bincount(gaps[:, 0], minlength=space) / len(gaps)
    assert np.abs(first - p).max() < 0.01  # the first draw is ∝ p
    # the second draw, given the first: P(second = j) = Σ_i p_i p_j / (1 - p_i)
    second_expected = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(space) if i != j) for j in range(space)])
    second = np.bincount(gaps[:, 1], minlength=space) / len(gaps)
    assert np.abs(second - second_expected).max() < 0.01
    uniform = mqar.weighted_without_replacement(np.random.default_rng(1), np.full(space, 1 / space), 40000, 1)
    assert np.abs(np.bincount(uniform[:, 0], minlength=space) / 40000 - 1 / space).max() < 0.01


def test_query_positions_favour_short_gaps():
    inputs, targets = mqar.generate(8192, 256, 8, 400, rng_for(1, "gaps"))
    offsets = np.nonzero(targets != IGNORE)[1] - 16
    assert np.median(offsets) < 0.25 * (256 - 16)


def test_determinism_random_non_queries_and_bad_input():
    a = mqar.generate(1000, 64, 4, 20, rng_for(3, "d"))
    b = mqar.generate(1000, 64, 4, 20, rng_for(3, "d"))
    c = mqar.generate(1000, 64, 4, 20, rng_for(4, "d"))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and not np.array_equal(a[0], c[0])
    noisy_x, noisy_y = mqar.generate(1000, 64, 4, 20, rng_for(3, "d"), random_non_queries=True)
    assert (noisy_x != 0).mean() > 0.95 and (noisy_y != IGNORE).sum() == 80
    for args in [(1000, 63, 4), (60, 64, 4), (1000, 64, 17)]:
        with pytest.raises(ValueError):
            mqar.generate(*args, 2, rng_for(0, "x"))


def test_settings_presets_and_evaluation():
    cfg = mqar.PRESETS["zoology"]
    names = [s.name for s in mqar.settings(cfg)]
    assert len(names) == 16 and "T512-kv64-d64" in names
    assert [mqar.zoology_batch_size(t) for t in (64, 128, 256, 512)] == [512, 512, 256, 128]
    assert len(mqar.PRESETS["paper"].lrs) == 8 and cfg.lrs[0] == pytest.approx(1e-4) and cfg.lrs[-1] == pytest.approx(1e-2)
    small = apply_overrides(cfg, {"configs": "64x4", "d_models": "8", "vocab": "200", "train_examples": 16, "test_examples": 12, "eval_batch_size": 5})
    setting = mqar.settings(small)[0]
    prepared = mqar.prepare(small, setting, None)
    test_x = mqar.datasets(small, 64, 4, None)["test_inputs"].astype(np.int64)

    def oracle(x):
        out = torch.zeros(*x.shape, 200)
        for b, row in enumerate(x.tolist()):
            lookup = dict(zip(row[0:8:2], row[1:8:2]))
            for t, tok in enumerate(row):
                if t >= 8 and tok in lookup:
                    out[b, t, lookup[tok]] = 1.0
        return out

    assert prepared.evaluate(lambda x: oracle(x).argmax(-1))["score"] == 1.0
    assert prepared.evaluate(lambda x: torch.zeros_like(x))["score"] == 0.0
    assert len(test_x) == 12
