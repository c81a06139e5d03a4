"""How much Triton autotunes in a synthetic run: ``full`` (Triton's default) or ``first``.

fla's chunk kernels autotune over dozens of configurations the first time they meet a new
head size, which takes minutes on an H200 for every model width of a sweep (MQAR's four
widths, MAD's tasks). The synthetic models are small enough that a step is bound by the
host, not by the kernel configuration, and any configuration computes the same result up to
float rounding, so ``first`` takes the first candidate of every autotuned kernel that runs.
The mode is read from ``SROPE_AUTOTUNE`` (which spawned workers inherit) and recorded in
every call's provenance.
"""

from __future__ import annotations

import contextlib
import math
import os

ENV = "SROPE_AUTOTUNE"
MODES = ("full", "first")
# Each autotuner that tuned in ``first`` mode, with the keys its in-memory cache held before: the
# choices made since are dropped when full tuning comes back, or they would stand for the rest of
# the process (a benchmark after a ``first`` check, a user's session after ``srope.run_demo``).
_TUNED_IN_FIRST: dict[int, tuple[object, set]] = {}


def mode() -> str:
    """The mode asked for in the environment (``full`` when unset)."""
    value = os.environ.get(ENV, "full")
    if value not in MODES:
        raise ValueError(f"{ENV} must be one of {MODES}, got {value!r}")
    return value


def apply(value: str | None = None) -> str:
    """Set the mode for this process and the workers it spawns (``value`` or the
    environment's); ``first`` patches Triton's autotuner (once). Returns the mode."""
    value = mode() if value is None else value
    if value not in MODES:
        raise ValueError(f"autotune must be one of {MODES}, got {value!r}")
    os.environ[ENV] = value
    if value == "first":
        first_config_only()
    else:
        every_config()
    return value


@contextlib.contextmanager
def scoped(value: str):
    """:func:`apply` ``value`` inside the block only: the process's mode (environment and
    Triton's autotuner) is restored after it, so a library call (``srope.run_demo``) does not
    leave Triton patched in the caller's session."""
    if value not in MODES:
        raise ValueError(f"autotune must be one of {MODES}, got {value!r}")
    before_env = os.environ.get(ENV)
    from_triton = _patched()
    apply(value)
    try:
        yield value
    finally:
        first_config_only() if from_triton else every_config()
        if before_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before_env


def _patched() -> bool:
    """Whether Triton's autotuner is in ``first`` mode now."""
    try:
        from triton.runtime import autotuner
    except ImportError:
        return False
    return getattr(autotuner.Autotuner, "_srope_first", None) is not None


def first_config_only() -> None:
    """Triton's autotuners take the first candidate (of those their own pruning leaves) that
    compiles and fits the GPU, run once, instead of timing them all: candidates after it are
    not run. Choices are not written to Triton's autotune cache, which keeps full tunings only."""
    try:
        from triton.runtime import autotuner
    except ImportError:  # no Triton, nothing autotunes
        return
    tuner = autotuner.Autotuner
    if getattr(tuner, "_srope_first", None) is not None:
        return
    prune, bench = tuner.prune_configs, tuner._bench

    def prune_and_restart(self, *args, **kwargs):
        self._srope_found = False  # a tuning round begins: its candidates are timed in order
        _TUNED_IN_FIRST.setdefault(id(self), (self, set(getattr(self, "cache", {}))))
        return prune(self, *args, **kwargs)

    def first_that_runs(self, *args, **kwargs):
        if getattr(self, "_srope_found", False):
            return [math.inf] * 3  # never chosen over the one found (Triton's timing for a candidate that fails)
        # Run the candidate once instead of timing it: nothing is compared, and a timed loop runs
        # it as many times as fit in its window, a number that depends on the GPU's load.
        before = self.__dict__.pop("do_bench", None)  # a cached_property: the instance's copy
        self.__dict__["do_bench"] = run_once
        try:
            timing = bench(self, *args, **kwargs)  # inf for a candidate out of resources or that fails to compile
        finally:
            self.__dict__.pop("do_bench", None)
            if before is not None:
                self.__dict__["do_bench"] = before
        self._srope_found = all(math.isfinite(t) for t in timing)
        return timing

    def no_disk_cache(self, tuning_key, configs, bench_fn):
        bench_fn()
        return False

    tuner._srope_first = (prune, bench, tuner.check_disk_cache)
    tuner.prune_configs, tuner._bench, tuner.check_disk_cache = prune_and_restart, first_that_runs, no_disk_cache


def run_once(kernel_call, quantiles) -> list[float]:
    """Stands in for Triton's ``do_bench`` in ``first`` mode: one call, a zero timing per quantile."""
    kernel_call()
    return [0.0] * len(quantiles)


def every_config() -> None:
    """Undo :func:`first_config_only`, forgetting the choices it made (the next call of such a
    kernel at such a key tunes fully)."""
    try:
        from triton.runtime import autotuner
    except ImportError:
        return
    tuner = autotuner.Autotuner
    if getattr(tuner, "_srope_first", None) is not None:
        tuner.prune_configs, tuner._bench, tuner.check_disk_cache = tuner._srope_first
        tuner._srope_first = None
    for instance, before in _TUNED_IN_FIRST.values():
        cache = getattr(instance, "cache", {})
        for key in set(cache) - before:
            del cache[key]
    _TUNED_IN_FIRST.clear()
