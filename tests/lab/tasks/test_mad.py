"""MAD: the 66 settings, each task's targets re-derived from its inputs, the protocol score,
and the compression auto-encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srope.lab.tasks import mad
from srope.lab.config import apply_overrides
from srope.lab.tasks.common import IGNORE, ClassCounts, rng_for
from tests.lab.tasks.standin import TinyGRU


def test_sixty_six_settings():
    everything = mad.all_settings()
    assert len(everything) == 66
    counts = {task: sum(1 for t, _, _ in everything if t == task) for task in mad.MAD_TASKS}
    assert counts == {"in-context-recall": 11, "fuzzy-in-context-recall": 11, "noisy-in-context-recall": 14,
                      "selective-copying": 13, "compression": 11, "memorization": 6}
    assert counts == mad.SETTINGS_PER_TASK
    names = [name for _, name, _ in everything]
    assert len(set(names)) == 66
    params = dict((name, p) for _, name, p in everything)
    assert params["noisy-in-context-recall/frac_noise=0.6"] == {"vocab_size": 32, "noise_vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True, "frac_noise": 0.6}
    assert params["memorization/vocab_size=8192"]["seq_len"] == 32  # one factor at a time
    assert len(mad.settings(mad.PRESETS["paper"])) == 66
    one = apply_overrides(mad.PRESETS["paper"], {"tasks": "compression", "only": "compression/baseline"})
    assert [s.name for s in mad.settings(one)] == ["compression/baseline"]
    with pytest.raises(ValueError, match="unknown MAD tasks"):
        mad.check(apply_overrides(mad.PRESETS["paper"], {"tasks": "recall"}))


def _check_recall(inputs, targets, n_keys, symbols, noise_vocab, training_targets=None):
    """Re-derive (noisy) in-context recall targets: walk the pairs, remember each key's value."""
    for x, y in zip(inputs, targets):
        full = np.append(x, y[-1])  # the last target is the probe's value
        pairs = full.reshape(-1, 2)
        value_of, expected = {}, []
        for i, (k, v) in enumerate(pairs):
            if k >= symbols:  # a noise pair
                assert symbols <= v < symbols + noise_vocab and i < len(pairs) - 1
                expected += [IGNORE, IGNORE]
                continue
            assert 0 <= k < n_keys <= v < symbols
            if k in value_of:
                assert value_of[k] == v, "a key keeps its value"
                expected += [IGNORE, v]
            else:
                assert i < len(pairs) - 1, "the final probe asks a key seen before"
                value_of[k] = v
                expected += [IGNORE, IGNORE]
        assert np.array_equal(y, np.array(expected[1:]))


@pytest.mark.parametrize("vocab,seq_len,noise_vocab,frac", [(16, 128, 0, 0.0), (64, 64, 0, 0.0), (32, 128, 16, 0.2), (48, 32, 16, 0.8)])
def test_in_context_recall_targets(vocab, seq_len, noise_vocab, frac):
    kw = dict(vocab_size=vocab, seq_len=seq_len, multi_query=True, noise_vocab_size=noise_vocab, frac_noise=frac)
    x_test, y_test = mad.in_context_recall(rng_for(0, "icr"), 60, training=False, **kw)
    x_train, y_train = mad.in_context_recall(rng_for(0, "icr"), 60, training=True, **kw)
    assert x_test.shape == y_test.shape == (60, seq_len - 1)
    assert np.array_equal(x_train, x_test), "same stream, same inputs"
    assert np.array_equal(y_train[:, :-1], x_train[:, 1:]), "training targets are the next tokens"
    symbols = vocab - noise_vocab
    _check_recall(x_test, y_test, symbols // 2, symbols, noise_vocab)
    if frac > 0:
        noise_share = (x_test >= symbols).mean()
        assert 0.5 * frac < noise_share < 1.5 * frac


def _runs(seq, n_keys):
    """Split a token row into alternating key motifs (< n_keys) and value motifs (>= n_keys)."""
    runs, start = [], 0
    for i in range(1, len(seq) + 1):
        if i == len(seq) or (seq[i] < n_keys) != (seq[start] < n_keys):
            runs.append((start, tuple(seq[start:i])))
            start = i
    return runs


@pytest.mark.parametrize("training", [False, True])
def test_fuzzy_recall_targets(training):
    vocab, seq_len = 16, 128
    x, y = mad.fuzzy_in_context_recall(rng_for(1, "fuzzy"), 40, vocab, seq_len, 3, 3, training=training)
    assert x.shape == y.shape == (40, seq_len)
    pad, n_keys = vocab - 1, (vocab - 1) // 2
    for row_x, row_y in zip(x, y):
        full = np.append(row_x, row_y[-1])  # the last target is the last token (train) or the probe's last value token (test)
        body = full[np.argmax(full != pad):]
        assert (full[: len(full) - len(body)] == pad).all() and (body != pad).all()
        runs = _runs(body.tolist(), n_keys)
        assert len(runs) % 2 == 0 and runs[0][1][0] < n_keys
        value_of, expected = {}, [IGNORE] * (len(full) - len(body))
        for (_, key), (_, value) in zip(runs[0::2], runs[1::2]):
            assert 1 <= len(key) <= 3 and 1 <= len(value) <= 3 and len(set(key)) == len(key) and len(set(value)) == len(value)
            if key in value_of:
                assert value_of[key] == value
                expected += [IGNORE] * len(key) + list(value)
            else:
                value_of[key] = value
                expected += [IGNORE] * (len(key) + len(value))
        probe = runs[-2][1]
        assert sum(1 for _, k in runs[0::2] if k == probe) >= 2, "the probe key was presented before the final query"
        if training:
            assert np.array_equal(row_y[:-1], row_x[1:])
        else:
            assert all(len(k) == 3 for _, k in runs[0::2]), "test keys are full motifs"
            assert np.array_equal(row_y, np.array(expected[1:]))


def test_selective_copying_targets():
    vocab, seq_len, n = 16, 64, 8
    x, y = mad.selective_copying(rng_for(2, "sc"), 50, vocab, seq_len, n)
    assert x.shape == y.shape == (50, seq_len)
    blank, copy = vocab - 2, vocab - 1
    for row_x, row_y in zip(x, y):
        at = int(np.nonzero(row_x == copy)[0][0])
        assert at == seq_len - n - 1 and (row_x == copy).sum() == 1
        shown = row_x[:at][row_x[:at] != blank]
        assert len(shown) == n and (shown < vocab - 2).all()
        assert (row_x[at + 1 :] == blank).all() and (row_y[: at + 1] == IGNORE).all()
        assert np.array_equal(row_y[at + 1 :], shown), "the tokens, in order, after the copy token"
        assert row_x[at - 1] != blank, "MAD never puts a blank after the last token"
    assert len({tuple(np.nonzero(r[:47] != blank)[0]) for r in x}) > 40, "blank positions vary"


def test_compression_and_memorization_targets():
    x, y = mad.compression(rng_for(3, "c"), 30, 16, 32)
    assert np.array_equal(x, y) and (x[:, -1] == 15).all() and (x[:, :-1] < 15).all()
    vocab = 64
    kv_map = mad.memorization_map(vocab, seed=12345)
    assert np.array_equal(kv_map, mad.memorization_map(vocab, seed=12345))
    assert len(kv_map) == (vocab - 1) // 2 and len(set(kv_map.tolist())) == len(kv_map)
    assert kv_map.min() >= (vocab - 1) // 2 and kv_map.max() < vocab - 1
    train = mad.generate({"task": "memorization", "vocab_size": vocab, "seq_len": 32, "num_train_examples": 40}, "train", 40, 12345)
    test = mad.generate({"task": "memorization", "vocab_size": vocab, "seq_len": 32, "num_train_examples": 40}, "test", 20, 12345)
    mapping = {}
    for xs, ys in (train, test):  # one fixed map across rows and splits
        assert (xs[:, 1::2] == vocab - 1).all() and (ys[:, 0::2] == IGNORE).all()
        for k, v in zip(xs[:, 0::2].ravel().tolist(), ys[:, 1::2].ravel().tolist()):
            assert mapping.setdefault(k, v) == v
    assert len(set(mapping.values())) == len(mapping)


def test_generate_is_deterministic_per_setting_and_split():
    params = {"task": "in-context-recall", "vocab_size": 16, "seq_len": 32, "num_train_examples": 10, "multi_query": True}
    a, b = mad.generate(params, "test", 10, 7), mad.generate(params, "test", 10, 7)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], mad.generate(params, "test", 10, 8)[0])
    assert not np.array_equal(a[0], mad.generate(params, "train", 10, 7)[0])
    assert not np.array_equal(a[0], mad.generate({**params, "vocab_size": 32}, "test", 10, 7)[0])


def test_protocol_score():
    best = {"compression/baseline": 0.8, "compression/vocab_size=32": 0.6, "memorization/baseline": 0.5}
    score = mad.protocol_score(best)
    assert score["per_task"] == pytest.approx({"compression": 0.7, "memorization": 0.5})
    assert score["average"] == pytest.approx(0.6) and score["complete"] is False
    full = mad.protocol_score({name: 1.0 if task == "compression" else 0.0 for task, name, _ in mad.all_settings()})
    assert full["complete"] and full["average"] == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="unknown MAD setting"):
        mad.protocol_score({"compression/vocab_size=99": 1.0})
    # the runner's summary picks the best optimiser point per setting, then mad.aggregate averages
    from srope.lab.tasks.summary import summarize

    runs = [{"setting": "compression/baseline", "group": "compression", "x": None, "lr": lr, "weight_decay": wd, "seed": 0, "score": s,
             "metrics": {"score": s}} for lr, wd, s in [(1e-4, 0.0, 0.2), (1e-3, 0.0, 0.9), (1e-3, 0.1, 0.4)]]
    summary = summarize(runs)
    assert summary["compression/baseline"]["score_mean"] == 0.9 and summary["compression/baseline"]["lr"] == 1e-3
    assert mad.aggregate(summary)["average"] == pytest.approx(0.9)


def test_compression_autoencoder_wraps_a_causal_model():
    torch.manual_seed(0)
    model = mad.CompressionAutoEncoder(TinyGRU(16, hidden=12), vocab_size=16, seq_len=10)
    x = torch.randint(0, 16, (3, 10))
    logits = model(x)
    assert logits.shape == (3, 10, 16)
    x2 = x.clone()
    x2[:, 3] = (x2[:, 3] + 1) % 16
    assert not torch.allclose(model(x2), logits), "the code depends on the whole sequence"
    logits.sum().backward()
    assert model.backbone.rnn.weight_ih_l0.grad is not None and model.backbone.rnn.weight_ih_l0.grad.abs().sum() > 0
    with pytest.raises(TypeError, match="output layer"):
        mad.CompressionAutoEncoder(torch.nn.Sequential(torch.nn.Embedding(16, 4)), 16, 10)


def scoring(logits_of, vocab: int):
    """The runner's ``predict`` for a function of the inputs to logits: argmax, and with
    targets also their summed cross-entropy and count."""

    def predict(x, targets=None):
        logits = logits_of(x)
        if targets is None:
            return logits.argmax(-1)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return logits.argmax(-1), float(nll), int((targets != IGNORE).sum())

    return predict


def guessing(guess, vocab: int):
    """``scoring`` for a function that gives predictions: logits 2 at the guess, 0 elsewhere."""
    return scoring(lambda x: 2.0 * torch.nn.functional.one_hot(guess(x), vocab).float(), vocab)


def test_mad_evaluate_uses_macro_accuracy():
    cfg = apply_overrides(mad.PRESETS["paper"], {"only": "selective-copying/baseline", "max_train_examples": 8, "num_test_examples": 16})
    setting = mad.settings(cfg)[0]
    prepared = mad.prepare(cfg, setting, None)
    test = mad.datasets(cfg, setting, None)

    def oracle(x):
        table = {tuple(r.tolist()): i for i, r in enumerate(torch.as_tensor(test["test_inputs"].astype(np.int64)))}
        labels = torch.stack([torch.as_tensor(test["test_targets"][table[tuple(r.tolist())]].astype(np.int64)) for r in x]).clamp(min=0)
        return torch.nn.functional.one_hot(labels, setting.vocab_size).float()

    perfect = prepared.evaluate(scoring(lambda x: 3.0 * oracle(x), setting.vocab_size))
    assert perfect["score"] == 1.0
    # the mean test loss over the scored targets: every one right with logit 3 against V - 1 zeros
    assert perfect["loss"] == pytest.approx(-np.log(np.exp(3.0) / (np.exp(3.0) + setting.vocab_size - 1)))
    constant = prepared.evaluate(guessing(torch.zeros_like, setting.vocab_size))
    scored = test["test_targets"][test["test_targets"] != IGNORE]
    assert constant["accuracy_micro"] == pytest.approx((scored == 0).mean())
    assert constant["accuracy_macro"] == pytest.approx(1 / len(np.unique(scored)))  # recall 1 for class 0, 0 for the rest
    right, wrong = -np.log(np.exp(2.0) / (np.exp(2.0) + setting.vocab_size - 1)), -np.log(1 / (np.exp(2.0) + setting.vocab_size - 1))
    assert constant["loss"] == pytest.approx((scored == 0).mean() * right + (scored != 0).mean() * wrong)


def test_mad_accuracy_is_the_row_weighted_mean_of_each_test_batchs_macro_accuracy():
    """As MAD logs it (torchmetrics per batch, averaged by Lightning), not one macro over the set."""
    cfg = apply_overrides(mad.PRESETS["paper"], {"only": "memorization/baseline", "max_train_examples": 8, "num_test_examples": 20,
                                                 "eval_batch_size": 8})  # fmt: skip
    setting = mad.settings(cfg)[0]
    prepared = mad.prepare(cfg, setting, None)
    test_y = torch.as_tensor(mad.datasets(cfg, setting, None)["test_targets"].astype(np.int64))
    guess = lambda x: (x * 7 + 3) % setting.vocab_size  # noqa: E731  (right on some targets, wrong on most)
    result = prepared.evaluate(guessing(guess, setting.vocab_size))
    test_x = torch.as_tensor(mad.datasets(cfg, setting, None)["test_inputs"].astype(np.int64))
    per_batch, pooled = [], ClassCounts(setting.vocab_size)
    for start in range(0, 20, 8):
        batch = ClassCounts(setting.vocab_size)
        batch.update(guess(test_x[start : start + 8]), test_y[start : start + 8])
        pooled.update(guess(test_x[start : start + 8]), test_y[start : start + 8])
        per_batch.append((batch.macro(), len(test_x[start : start + 8])))
    assert [rows for _, rows in per_batch] == [8, 8, 4]
    assert result["score"] == result["accuracy_macro"] == pytest.approx(sum(v * n for v, n in per_batch) / 20)
    assert result["accuracy_macro_pooled"] == pytest.approx(pooled.macro())
    assert result["accuracy_macro"] != pytest.approx(result["accuracy_macro_pooled"])  # the two differ here
