"""Copying: packed training rows and their loss targets, eval alignment, both scorers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srope.lab.tasks import copying as cp
from srope.lab.config import apply_overrides
from srope.lab.tasks.common import IGNORE, rng_for


def test_tokens():
    assert cp.encode("$az|az.*") == [26, 0, 25, 27, 0, 25, 28, 29]
    assert cp.decode(cp.encode("$abc|abc.")) == "$abc|abc."


@pytest.mark.parametrize("context,lo,hi", [(420, 2, 64), (61, 3, 9), (40, 1, 1)])
def test_packed_training_rows(context, lo, hi):
    x, y = cp.train_batch(rng_for(0, "pack", context), 16, context, lo, hi, 26)
    assert x.shape == y.shape == (16, context - 1)
    lengths_seen = set()
    for row_x, row_y in zip(x, y):
        # the row's tokens: the last one is known from the targets unless it carries no loss
        text = cp.decode(np.append(row_x, row_y[-1]) if row_y[-1] != IGNORE else row_x)
        assert text[0] == "$"
        expected = np.full(context - 1, IGNORE)
        pos = 0
        for chunk in text.split("$")[1:]:
            start = pos + 1  # position just after this example's "$"
            if "." in chunk:  # a complete example: "s|s."
                s, rest = chunk.split("|")
                assert rest == s + "." and lo <= len(s) <= hi and set(s) <= set("abcdefghijklmnopqrstuvwxyz")
                lengths_seen.add(len(s))
                answer_at = start + len(s)  # index of "|"; it predicts s[0]
                for i, c in enumerate(s + "."):
                    expected[answer_at + i] = cp.encode(c)[0]
            pos += len(chunk) + 1
        assert np.array_equal(row_y, expected), "loss exactly on complete answers and their '.'"
    assert len(lengths_seen) > min(3, hi - lo)


def test_training_stream_is_seeded():
    a = cp.train_batch(rng_for(1, "s"), 4, 100, 2, 20, 26)
    b = cp.train_batch(rng_for(1, "s"), 4, 100, 2, 20, 26)
    c = cp.train_batch(rng_for(2, "s"), 4, 100, 2, 20, 26)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and not np.array_equal(a[0], c[0])
    assert np.array_equal(cp.eval_strings(7, 5, 0, 26), cp.eval_strings(7, 5, 0, 26))
    assert not np.array_equal(cp.eval_strings(7, 5, 0, 26), cp.eval_strings(7, 5, 1, 26))


class CopyOracle(torch.nn.Module):
    """Predicts the true next character after "|" (shifted by ``offset`` positions when != 0)."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        logits = torch.zeros(*x.shape, 30)
        for b, row in enumerate(x.tolist()):
            sep = row.index(cp.SEP)
            length = sep - 1
            for t in range(sep, x.shape[1]):
                src = t - length + self.offset  # position t predicts s[t - sep] = row[t - length]
                if 1 <= src <= length:
                    logits[b, t, row[src]] = 1.0
        return logits


def test_teacher_forced_scoring_aligns_with_the_answer():
    strings = cp.eval_strings(9, 6, 0, 26)
    inputs = torch.as_tensor(cp.teacher_forced_inputs(strings))
    assert cp.decode(inputs[0]) == "$" + cp.decode(strings[0]) + "|" + cp.decode(strings[0])
    good = cp.answer_predictions(CopyOracle()(inputs), 9)
    assert cp.copy_scores(good, torch.as_tensor(strings)) == (1.0, 1.0)
    shifted = cp.answer_predictions(CopyOracle(offset=1)(inputs), 9)
    s_acc, c_acc = cp.copy_scores(shifted, torch.as_tensor(strings))
    assert s_acc == 0.0 and c_acc < 0.5


def test_copy_scores_edge_cases():
    truth = torch.tensor([[1, 2, 3], [4, 5, 6]])
    pred = torch.tensor([[1, 2, 3], [4, 0, 6]])
    assert cp.copy_scores(pred, truth) == (pytest.approx(0.5), pytest.approx((1 + 2 / 3) / 2))
    with pytest.raises(ValueError):
        cp.copy_scores(pred[:, :2], truth)
    with pytest.raises(ValueError):
        cp.copy_scores(torch.zeros(2, 0), torch.zeros(2, 0))


def test_greedy_generation_with_the_oracle():
    strings = cp.eval_strings(5, 3, 0, 26)
    out = cp.greedy_copy(lambda x: CopyOracle()(x).argmax(-1), strings, batch_size=2)
    assert out.shape == (3, 5) and torch.equal(out, torch.as_tensor(strings))


def test_evaluate_reports_per_length_curves_and_ranges():
    cfg = apply_overrides(cp.PRESETS["authors"], {"eval_lengths": "2-4,70", "eval_examples": 5, "autoregressive": True, "ar_examples": 2, "ar_lengths": "3"})
    prepared = cp.prepare(cfg, cp.settings(cfg)[0], None)
    perfect = prepared.evaluate(lambda x: CopyOracle()(x).argmax(-1))
    assert perfect["score"] == 1.0 and perfect["str_acc_extrapolation"] == 1.0 and perfect["str_acc_train_range"] == 1.0
    assert perfect["curves"]["str_acc_by_length"]["x"] == [2, 3, 4, 70] and perfect["curves"]["ar_str_acc_by_length"]["y"] == [1.0]

    class ShortOnly(CopyOracle):  # right only for strings up to 64 characters
        def forward(self, x):
            logits = super().forward(x)
            return logits if x.shape[1] <= 2 * 64 + 2 else logits.roll(1, dims=-1)

    short = prepared.evaluate(lambda x: ShortOnly()(x).argmax(-1))
    assert short["str_acc_train_range"] == 1.0 and short["str_acc_extrapolation"] == 0.0 and short["score"] == 0.75


def test_presets_differ_as_documented():
    authors, paper = cp.PRESETS["authors"], cp.PRESETS["paper"]
    assert authors.lrs == (2e-3,) and authors.seeds == (0, 1, 2) and paper.lrs == (5e-5,) and paper.seeds == (42,)
    assert authors.context_len == 420 and authors.steps == 5000 and authors.batch_size == 256
    assert cp.parse_lengths(authors.eval_lengths) == list(range(2, 513))
    with pytest.raises(ValueError, match="context_len"):
        cp.check(apply_overrides(authors, {"max_len": 300}))
