"""Groups built from permutations and verified; word-problem labels recomputed independently."""

from __future__ import annotations

import itertools
import math
from functools import reduce

import numpy as np
import pytest
import torch

from srope.lab.tasks import state_tracking as st
from srope.lab.tasks.common import rng_for
from srope.lab.tasks.groups import Group, get_group, prefix_products, verify_group


@pytest.mark.parametrize("name,order", [("S2", 2), ("A3", 3), ("S3", 6), ("A4", 12), ("S5", 120), ("Z5", 5)])
def test_group_order_and_table_against_explicit_composition(name, order):
    group = get_group(name)
    assert group.order == order and len(set(group.elements)) == order
    n = group.degree
    assert group.elements[0] == tuple(range(n))
    if name[0] == "S":
        assert set(group.elements) == set(itertools.permutations(range(n)))
    if name[0] == "A":  # even permutations: sign from the cycle count
        def sign(p):
            seen, cycles = set(), 0
            for i in range(n):
                if i not in seen:
                    cycles += 1
                    j = i
                    while j not in seen:
                        seen.add(j)
                        j = p[j]
            return (-1) ** (n - cycles)
        assert all(sign(p) == 1 for p in group.elements) and order == math.factorial(n) // 2
    rng = np.random.default_rng(0)
    for _ in range(200):  # table[i, j] is "apply elements[i], then elements[j]"
        i, j = rng.integers(0, order, 2)
        a, b = group.elements[i], group.elements[j]
        assert group.elements[group.table[i, j]] == tuple(b[a[x]] for x in range(n))


def test_s2_is_xor():
    assert get_group("S2").table.tolist() == [[0, 1], [1, 0]]


def test_verify_group_rejects_broken_tables():
    good = get_group("S3")
    verify_group(good, 6)
    with pytest.raises(AssertionError, match="elements"):
        verify_group(good, 5)
    table = good.table.copy()
    table[1, 2], table[1, 3] = table[1, 3], table[1, 2]  # still a closed table, but not a group
    with pytest.raises(AssertionError):
        verify_group(Group("bad", 3, good.elements, table))
    table = good.table.copy()
    table[2, 4] = 9
    with pytest.raises(AssertionError, match="closed"):
        verify_group(Group("bad", 3, good.elements, table))
    with pytest.raises(ValueError, match="S<n>"):
        get_group("Q8")


def test_parity_labels_by_xor():
    group = get_group("S2")
    inputs, targets = st.make_split(group, length=37, count=64, rng=rng_for(1, "t"))
    assert inputs.shape == targets.shape == (64, 38)
    bos = st.bos_id(group)
    assert (inputs[:, 0] == bos).all() and (targets[:, 0] == bos).all()
    bits = inputs[:, 1:].astype(np.int64)
    assert set(np.unique(bits)) <= {0, 1}
    assert np.array_equal(targets[:, 1:], np.bitwise_xor.accumulate(bits, axis=1))
    assert st.vocab_size(group) == 4


@pytest.mark.parametrize("name", ["A3", "S3", "S5"])
def test_group_labels_by_permutation_composition(name):
    group = get_group(name)
    inputs, targets = st.make_split(group, length=19, count=40, rng=rng_for(2, name))
    n = group.degree
    for row_in, row_out in zip(inputs[:, 1:], targets[:, 1:]):
        state = tuple(range(n))
        for x, s in zip(row_in, row_out):
            p = group.elements[x]
            state = tuple(p[state[i]] for i in range(n))  # state · x: first state, then x
            assert group.elements[s] == state


def test_prefix_products_of_a_hand_written_word():
    group = get_group("S3")
    index = {p: i for i, p in enumerate(group.elements)}
    swap01, cycle = index[(1, 0, 2)], index[(1, 2, 0)]
    states = prefix_products(group, np.array([[swap01, cycle, cycle, swap01]]))[0]
    # (1,0,2) then (1,2,0): 0->1->2, 1->0->1, 2->2->0  =>  (2,1,0)
    assert [group.elements[s] for s in states[:2]] == [(1, 0, 2), (2, 1, 0)]
    assert group.elements[states[-1]] == reduce(lambda a, b: tuple(b[a[i]] for i in range(3)), [(1, 0, 2), (1, 2, 0), (1, 2, 0), (1, 0, 2)])


def test_determinism_and_distinct_rows():
    group = get_group("S2")
    a = st.make_split(group, 12, 300, rng_for(5, "x"))
    b = st.make_split(group, 12, 300, rng_for(5, "x"))
    c = st.make_split(group, 12, 300, rng_for(6, "x"))
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    assert len(np.unique(a[0], axis=0)) == 300
    capped = st.sample_words(group, 3, 100, rng_for(0, "cap"))  # only 2^3 words exist
    assert capped.shape == (8, 3) and len(np.unique(capped, axis=0)) == 8


def test_datasets_follow_the_preset_seed_and_lengths(tmp_path):
    from srope.lab.config import apply_overrides

    cfg = apply_overrides(st.PRESETS["authors"], {"train_size": 50, "eval_size": 20, "train_len": 6, "eval_len": 11})
    one, two = st.datasets(cfg, None), st.datasets(cfg, tmp_path)
    assert one["train_inputs"].shape == (50, 7) and one["eval_inputs"].shape == (20, 12)
    assert all(np.array_equal(one[k], two[k]) for k in one)
    other = st.datasets(apply_overrides(cfg, {"data_seed": 1}), None)
    assert not np.array_equal(one["train_inputs"], other["train_inputs"])
    assert not np.array_equal(one["train_inputs"][:, 1:], one["eval_inputs"][:, 1:7])  # train and eval are separate draws


def test_cumulative_and_sequence_accuracy():
    targets = torch.tensor([[9, 1, 0, 1], [9, 0, 0, 0], [9, 1, 1, 0]])
    preds = torch.tensor([[9, 1, 0, 1], [9, 0, 1, 0], [5, 1, 1, 0]])
    assert st.cumulative_accuracy(preds, targets).tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert st.sequence_accuracy(preds, targets) == pytest.approx(1 / 3)
    assert st.sequence_accuracy(targets, targets) == 1.0
    with pytest.raises(ValueError):
        st.cumulative_accuracy(preds[:, :2], targets)


def test_evaluate_scores_an_oracle_and_a_broken_model():
    from srope.lab.config import apply_overrides

    cfg = apply_overrides(st.PRESETS["authors"], {"train_size": 16, "eval_size": 30, "train_len": 5, "eval_len": 9, "eval_batch_size": 7})
    setting = st.settings(cfg)[0]
    prepared = st.prepare(cfg, setting, None)
    group = get_group("S2")

    def oracle(x):  # the true parity from the inputs
        states = torch.as_tensor(prefix_products(group, x[:, 1:].numpy()))
        labels = torch.cat([x[:, :1], states], dim=1)
        return torch.nn.functional.one_hot(labels, setting.vocab_size).float()

    def late_error(x):  # right up to element 6, then wrong
        logits = oracle(x)
        logits[:, 7:] = logits[:, 7:].flip(-1)
        return logits

    perfect = prepared.evaluate(lambda x: oracle(x).argmax(-1))
    assert perfect["score"] == 1.0 and perfect["seq_acc_at_train_len"] == 1.0
    broken = prepared.evaluate(lambda x: late_error(x).argmax(-1))
    curve = broken["curves"]["seq_acc_by_length"]
    assert curve["x"] == list(range(1, 10)) and curve["y"][:6] == [1.0] * 6 and curve["y"][6:] == [0.0] * 3
    assert broken["score"] == 0.0 and broken["seq_acc_at_train_len"] == 1.0
