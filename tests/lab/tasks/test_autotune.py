"""`srope synth --autotune first`: Triton's autotuners take the first candidate that runs,
write nothing to the autotune cache, the mode goes back to full on request, and workers and
provenance carry it (tests/lab/tasks/test_resume.py)."""

from __future__ import annotations

import math

import pytest

triton = pytest.importorskip("triton")

from triton.runtime import autotuner  # noqa: E402

from srope.lab.tasks import autotune  # noqa: E402


@triton.jit
def _kernel(x, BLOCK: triton.language.constexpr):
    pass


@triton.jit
def _keyed(N, BLOCK: triton.language.constexpr):
    pass


def test_first_takes_the_first_candidate_that_runs(monkeypatch):
    monkeypatch.delenv(autotune.ENV, raising=False)
    timed = []

    def fake_bench(self, *args, config, **kwargs):  # 16 is out of resources on this "GPU"
        timed.append(config.kwargs["BLOCK"])
        return [math.inf] * 3 if config.kwargs["BLOCK"] == 16 else [float(config.kwargs["BLOCK"])] * 3

    monkeypatch.setattr(autotuner.Autotuner, "_bench", fake_bench)
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 64, 32)], key=[])(_kernel)

    def tuning_round():
        timed.clear()
        timings = {c: tuned._bench(config=c) for c in tuned.prune_configs({})}
        return min(timings, key=timings.get).kwargs["BLOCK"]

    assert autotune.apply() == "full" and tuning_round() == 32 and timed == [16, 64, 32]
    assert autotune.apply("first") == "first" and autotune.mode() == "first"  # the mode spawned workers read
    autotune.apply("first")  # twice: still one layer over Triton's own
    assert tuning_round() == 64 and timed == [16, 64]  # 16 fails, 64 runs, 32 is never timed
    assert tuning_round() == 64 and timed == [16, 64]  # every round starts again
    calls = []
    assert tuned.check_disk_cache(("key",), tuned.configs, lambda: calls.append(1)) is False and calls == [1]
    assert autotune.apply("full") == "full" and tuning_round() == 32 and timed == [16, 64, 32]


def test_bad_modes_are_refused(monkeypatch):
    monkeypatch.setenv(autotune.ENV, "fast")
    with pytest.raises(ValueError, match="SROPE_AUTOTUNE must be one of"):
        autotune.apply()
    with pytest.raises(ValueError, match="autotune must be one of"):
        autotune.apply("all")


def test_scoped_first_is_undone_after_its_block(monkeypatch):
    """``srope demo`` on CUDA tunes with ``first`` inside its training only: the caller's
    process gets Triton's autotuner and its environment back as they were, also after an error."""
    monkeypatch.delenv(autotune.ENV, raising=False)
    autotune.apply("full")
    full_bench = autotuner.Autotuner._bench
    with autotune.scoped("first"):
        assert autotune.mode() == "first" and autotuner.Autotuner._bench is not full_bench
    assert autotuner.Autotuner._bench is full_bench and autotune.mode() == "full"
    autotune.apply("first")
    with pytest.raises(RuntimeError, match="inside"):
        with autotune.scoped("full"):
            assert autotuner.Autotuner._bench is full_bench
            raise RuntimeError("inside")
    assert autotune.mode() == "first" and autotuner.Autotuner._bench is not full_bench
    autotune.apply("full")
    with pytest.raises(ValueError, match="autotune must be one of"):
        with autotune.scoped("fast"):
            pass


def test_first_runs_the_candidate_once_instead_of_timing_it(monkeypatch):
    """A timed loop would run it as often as fits its window (a number that depends on the GPU's
    load); the first candidate only has to run. Full mode keeps Triton's own timing."""
    monkeypatch.delenv(autotune.ENV, raising=False)
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 64, 32)], key=[])(_kernel)
    runs = []

    class Launcher:  # stands in for the compiled kernel: 16 is out of resources on this "GPU"
        def run(self, *args, BLOCK, **kwargs):
            if BLOCK == 16:
                raise triton.runtime.errors.OutOfResources(1 << 20, 1 << 16, "shared memory")
            runs.append(BLOCK)

    monkeypatch.setattr(tuned, "fn", Launcher())
    tuned.nargs = {}
    timed_by_triton = []
    tuned.__dict__["do_bench"] = lambda call, quantiles: timed_by_triton.append(1) or [1.0, 1.0, 1.0]
    try:
        autotune.apply("first")
        tuned.prune_configs({})  # a tuning round begins
        timings = [tuned._bench(config=c) for c in tuned.configs]
        assert timings == [[math.inf] * 3, [0.0] * 3, [math.inf] * 3] and runs == [64] and not timed_by_triton
        assert tuned.do_bench is not autotune.run_once  # the tuner's own benchmarker is back afterwards
        autotune.apply("full")
        assert tuned._bench(config=tuned.configs[1]) == [1.0, 1.0, 1.0] and timed_by_triton == [1] and runs == [64]
    finally:
        autotune.apply("full")


def test_full_tuning_comes_back_for_keys_tuned_in_first_mode(monkeypatch):
    """A key tuned in ``first`` mode is tuned again once full mode is back (the in-memory choice is
    dropped), while keys tuned fully before stay: a benchmark after a ``first`` check, or a user's
    session after ``srope.run_demo``, gets Triton's own choice."""
    monkeypatch.delenv(autotune.ENV, raising=False)
    timed = []

    def fake_bench(self, *args, config, **kwargs):
        timed.append(config.kwargs["BLOCK"])
        return [float(config.kwargs["BLOCK"])] * 3

    monkeypatch.setattr(autotuner.Autotuner, "_bench", fake_bench)
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (64, 16, 32)], key=["N"])(_keyed)

    class Launcher:
        def run(self, *args, **kwargs):
            pass

    monkeypatch.setattr(tuned, "fn", Launcher())

    def call(n):
        timed.clear()
        tuned.run(n)
        return tuned.cache[(n,)].kwargs["BLOCK"], list(timed)

    autotune.apply("full")
    assert call(1) == (16, [64, 16, 32])  # fully tuned before
    with autotune.scoped("first"):
        assert call(2) == (64, [64])  # the first candidate that runs
        assert call(1) == (16, [])  # a full choice is kept
    assert call(2) == (16, [64, 16, 32]) and call(1) == (16, [])  # tuned again; the earlier full choice stays
