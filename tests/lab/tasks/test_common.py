"""Presets and overrides, seeded streams, the cache, and the accuracy metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srope.lab.config import apply_overrides
from srope.lab.overrides import parse_assignments
from srope.lab.tasks.common import (
    IGNORE,
    ArrayStream,
    ClassCounts,
    cached_arrays,
    default_cache_dir,
    parse_lengths,
    rng_for,
)
from srope.lab.tasks.state_tracking import PRESETS as ST_PRESETS


def test_overrides_are_typed_and_unknown_keys_fail():
    base = ST_PRESETS["authors"]
    cfg = apply_overrides(base, {"lrs": "1e-3,5e-4", "seeds": "7", "epochs": "3", "stop_at": "none", "distinct": "false",
                                 "betas": "0.9,0.95", "max_steps": "1e3", "group": "A3"})
    assert cfg.lrs == (1e-3, 5e-4) and cfg.seeds == (7,) and cfg.epochs == 3 and cfg.stop_at is None
    assert cfg.distinct is False and cfg.betas == (0.9, 0.95) and cfg.max_steps == 1000 and cfg.group == "A3"
    assert base.lrs == (5e-4,) and base.group == "S2", "the preset itself must not change"
    with pytest.raises(ValueError, match="unknown setting 'learning_rate'"):
        apply_overrides(base, {"learning_rate": "1e-3"})
    with pytest.raises(ValueError, match="integer"):
        apply_overrides(base, {"epochs": "2.5"})
    with pytest.raises(ValueError, match="boolean"):
        apply_overrides(base, {"distinct": "maybe"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignments(["lrs"])
    assert parse_assignments(["lrs=1e-3", " seeds = 1,2 "]) == {"lrs": "1e-3", "seeds": "1,2"}


def test_model_and_position_overrides_reach_the_selected_encoding():
    base = ST_PRESETS["authors"]
    cfg = apply_overrides(base, {"model.hidden_size": "64", "model.new_key": "abc", "position.bias": "false", "position.theta": "1e4"})
    assert cfg.model["hidden_size"] == 64 and cfg.model["new_key"] == "abc" and cfg.model["num_hidden_layers"] == 1
    assert cfg.position["selective_rope"]["bias"] is False and cfg.position["selective_rope"]["theta"] == 1e4
    assert cfg.position["rope"] == {"theta": 500000.0}
    rope = apply_overrides(base, {"position_type": "rope", "position.theta": "10000"})
    assert rope.position["rope"]["theta"] == 10000 and rope.position["selective_rope"]["bias"] is True
    assert base.model["hidden_size"] == 384 and base.position["selective_rope"]["bias"] is True


def test_parse_lengths():
    assert parse_lengths("2-6") == [2, 3, 4, 5, 6]
    assert parse_lengths("2-10:4,64,3") == [2, 3, 6, 10, 64]
    assert parse_lengths([5, 1]) == [1, 5] and parse_lengths(7) == [7]
    for bad in ("", "a-b", "0-3"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_rng_streams_are_deterministic_and_distinct():
    a = rng_for(3, "x", 5).integers(0, 1 << 30, 8)
    assert np.array_equal(a, rng_for(3, "x", 5).integers(0, 1 << 30, 8))
    for other in (rng_for(4, "x", 5), rng_for(3, "y", 5), rng_for(3, "x", 6)):
        assert not np.array_equal(a, other.integers(0, 1 << 30, 8))


def test_cache_round_trip(tmp_path, monkeypatch):
    calls = []

    def build():
        calls.append(1)
        return {"a": np.arange(12, dtype=np.int16).reshape(3, 4)}

    first = cached_arrays("unit", {"n": 3}, build, tmp_path, min_elements=1)
    second = cached_arrays("unit", {"n": 3}, build, tmp_path, min_elements=1)
    assert len(calls) == 1 and np.array_equal(first["a"], second["a"]) and second["a"].dtype == np.int16
    cached_arrays("unit", {"n": 4}, build, tmp_path, min_elements=1)
    assert len(calls) == 2, "different parameters must not hit the same file"
    assert len(list((tmp_path / "unit").glob("*.npz"))) == 2
    cached_arrays("small", {"n": 3}, build, tmp_path)  # below the size threshold: not written
    assert not (tmp_path / "small").exists()
    monkeypatch.setenv("SROPE_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SROPE_CACHE")
    assert default_cache_dir().parts[-2:] == (".cache", "srope")


def test_macro_accuracy_matches_a_hand_computation():
    # targets 0,0,1,2 ; preds 0,1,1,3 ; class 3 is only predicted (wrongly), class 4 never occurs.
    preds = torch.tensor([0, 1, 1, 3, 7])
    targets = torch.tensor([0, 0, 1, 2, IGNORE])
    # per-class recall: c0 1/2, c1 1/1, c2 0/1, c3 0/0 -> 0 but counted (it was predicted); c4..: left out
    whole = ClassCounts(8)
    whole.update(preds, targets)
    assert whole.macro() == pytest.approx((0.5 + 1.0 + 0.0 + 0.0) / 4)
    counts = ClassCounts(8)
    counts.update(preds[:2], targets[:2])  # batches accumulate like one pass
    counts.update(preds[2:], targets[2:])
    assert counts.macro() == pytest.approx(0.375) and counts.micro() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no target"):
        ClassCounts(4).macro()
    with pytest.raises(ValueError, match="class ids"):
        ClassCounts(2).update(torch.tensor([5]), torch.tensor([1]))


def test_macro_accuracy_on_random_data_against_a_loop():
    g = torch.Generator().manual_seed(0)
    preds = torch.randint(0, 6, (400,), generator=g)
    targets = torch.randint(0, 5, (400,), generator=g)
    targets[torch.rand(400, generator=g) < 0.3] = IGNORE
    keep = targets != IGNORE
    p, t = preds[keep].tolist(), targets[keep].tolist()
    recalls = []
    for c in range(6):
        support = sum(1 for x in t if x == c)
        predicted = sum(1 for x in p if x == c)
        if support == 0 and predicted == 0:
            continue
        recalls.append(sum(1 for x, y in zip(p, t) if x == y == c) / support if support else 0.0)
    counts = ClassCounts(6)
    counts.update(preds, targets)
    assert counts.macro() == pytest.approx(sum(recalls) / len(recalls))


def test_cuda_graph_is_checked_and_on_needs_cuda(tmp_path):
    from srope.lab.tasks.common import check_train_config

    with pytest.raises(ValueError, match="cuda_graph must be"):
        check_train_config(apply_overrides(ST_PRESETS["authors"], {"cuda_graph": "yes"}))
    if not torch.cuda.is_available():
        from srope.lab.tasks import run_synthetic
        from tests.lab.tasks.standin import gru_factory

        with pytest.raises(ValueError, match="cuda_graph='on' needs a CUDA device"):
            run_synthetic("state_tracking", gru_factory, out=tmp_path / "run", overrides={"train_size": 16, "eval_size": 8, "train_len": 4, "eval_len": 6, "cuda_graph": "on",
                          "model.hidden_size": 8}, cache_dir=None, progress=False, plot=False)  # fmt: skip
        assert not (tmp_path / "run").exists()  # refused before anything is written


def _stream(shuffle: bool, equal_counts: bool, batch_size: int = 4):
    rng = np.random.default_rng(5)
    inputs = rng.integers(0, 9000, size=(11, 6))
    targets = np.full((11, 6), IGNORE)
    for row in range(11):  # two targets a row, or one to three
        count = 2 if equal_counts else 1 + row % 3
        targets[row, rng.choice(6, size=count, replace=False)] = rng.integers(0, 9000, size=count)
    return ArrayStream(inputs, targets, batch_size, shuffle=shuffle)


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
@pytest.mark.parametrize("equal_counts", [True, False], ids=["equal-targets", "varying-targets"])
@pytest.mark.parametrize("start", [0, 2])
@pytest.mark.parametrize("narrow", [False, True], ids=["as-is", "narrowed"])
def test_device_epoch_gives_the_host_batches(shuffle, equal_counts, start, narrow, monkeypatch):
    """The batches gathered from the resident arrays equal the host's, the last short one and a
    resumed epoch's rest included; so do the scored positions, formed on the device where every
    row has as many targets and found on the host otherwise; the RNG advances alike. Narrowed:
    the arrays and positions held as a GPU holds them (int16 here, IGNORE included)."""
    import functools

    from srope.lab.tasks import common
    from srope.lab.tasks.training import scored_positions

    if narrow:
        monkeypatch.setattr(common, "_resident_array", functools.partial(common._resident_array, narrow=True))
    stream = _stream(shuffle, equal_counts)
    host_rng, device_rng = np.random.default_rng(7), np.random.default_rng(7)
    host = list(stream.epoch(0, host_rng, start=start))
    device = list(stream.device_epoch(0, device_rng, torch.device("cpu"), start=start, scored=True))
    assert len(host) == len(device) == 3 - start
    for (x_np, y_np), (x, y, scored) in zip(host, device):
        assert x.dtype == y.dtype == scored.dtype == torch.int64
        assert torch.equal(x, torch.as_tensor(x_np)) and torch.equal(y, torch.as_tensor(y_np))
        assert torch.equal(scored, scored_positions(y_np, torch.device("cpu")))
    assert host_rng.bit_generator.state == device_rng.bit_generator.state
    assert (stream._on[1][2] is None) == (not equal_counts)
    assert stream._on[1][0].dtype == (torch.int16 if narrow else torch.int64)
    assert all(len(batch) == 2 for batch in stream.device_epoch(0, np.random.default_rng(7), torch.device("cpu")))


def test_resident_arrays_take_the_narrowest_integer_type_that_holds_them():
    from srope.lab.tasks.common import _resident_array

    cpu = torch.device("cpu")
    for values, kind in (([-100, 8191], torch.int16), ([-40000, 3], torch.int32), ([0, 2**40], torch.int64)):
        array = np.array(values, dtype=np.int64)
        narrowed = _resident_array(array, cpu, narrow=True)
        assert narrowed.dtype == kind and narrowed.tolist() == values
    assert _resident_array(np.array([0, 255], dtype=np.uint8), cpu, narrow=True).dtype == torch.uint8  # never widened
    shared = np.arange(4)
    assert _resident_array(shared, cpu).data_ptr() == shared.ctypes.data  # the CPU keeps the array itself


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batches_reach_the_gpu_without_waiting_for_it():
    """Once the arrays are resident, an epoch's batches (order upload included) make no host sync
    and equal the host's, scored positions included; a sampled task's host batch is uploaded
    while the device is still busy (a pageable copy would wait for it)."""
    import time

    from srope.lab.tasks.common import to_device
    from srope.lab.tasks.training import scored_positions

    cuda = torch.device("cuda")
    stream = _stream(True, True)
    list(stream.device_epoch(0, np.random.default_rng(1), cuda, scored=True))  # the one upload of the arrays
    host = list(stream.epoch(1, np.random.default_rng(2)))
    torch.cuda.set_sync_debug_mode("error")
    try:
        device = list(stream.device_epoch(1, np.random.default_rng(2), cuda, scored=True))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for (x_np, y_np), (x, y, scored) in zip(host, device, strict=True):
        assert torch.equal(x.cpu(), torch.as_tensor(x_np)) and torch.equal(y.cpu(), torch.as_tensor(y_np))
        assert torch.equal(scored.cpu(), scored_positions(y_np, torch.device("cpu")))
    sampled = np.arange(4096 * 64).reshape(64, 4096)
    to_device(sampled, cuda)  # the pinned block cached
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of a busy stream
    began = time.perf_counter()
    uploaded = to_device(sampled, cuda)
    returned = time.perf_counter() - began
    torch.cuda.synchronize()
    assert returned < 0.2, f"to_device waited {returned:.2f} s for the busy device"
    assert torch.equal(uploaded.cpu(), torch.as_tensor(sampled))
