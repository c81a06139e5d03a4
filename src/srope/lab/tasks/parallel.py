"""Stop requests, and ``--jobs N``: a sweep's runs in N worker processes on one device.

A sweep (:func:`srope.lab.tasks.runner.run_synthetic`) is a list of independent runs (setting x
learning rate x weight decay x seed). ``jobs=N`` hands them to N worker processes, each
training one run at a time, so that many small models share one GPU (or the cores of a
CPU). The design keeps a concurrent sweep equal to the sequential one, bitwise:

- A worker runs exactly what the sequential sweep runs: :func:`srope.lab.tasks.runner.run_one`
  with the same config, the same seeds (every RNG a run uses is seeded from its own seed
  and names, never from the order of the runs) and the same checkpoint folder per run.
  On the CPU a worker runs torch on one thread (or the preset's ``threads``), as the
  ``cpu`` presets do sequentially: the thread count can change the last bits of a sum.
- The parent alone writes ``results.json``: it merges each finished run's record in grid
  order. Workers write only their run's checkpoints and weights.
- Stops: the workers ignore SIGINT and SIGTERM; the parent takes them (``srope train``'s
  ``StopSignals``) and sets a shared event, and every worker checkpoints after its step in
  progress and returns. ``--stop-after-steps`` is a counter shared by the workers, so it
  stops the sweep after about that many steps (each worker finishes its step). A worker
  whose parent is gone stops the same way. A second signal kills the workers; their runs
  continue from the last periodic checkpoint.
- Processes are spawned, not forked: CUDA cannot be used in a forked child, and a fork
  copies torch's thread pools.

Processes rather than threads or one batched model: the GIL serialises the Python side of
small models' steps, and a batched model would change the numbers. Each worker holds its
own CUDA context and prepares its own data (the on-disk cache is shared). A script that
calls ``run_synthetic(..., jobs=N)`` needs the ``if __name__ == "__main__":`` guard, since
a spawned worker imports the main module.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any


class LocalControl:
    """Stop requests of a sweep run in this process: a signal (``signals.signum``, from
    ``StopSignals``) or ``budget`` optimiser steps taken."""

    def __init__(self, signals, budget: int | None):
        self.signals, self.budget, self.steps = signals, budget, 0

    def step_done(self) -> bool:
        """Count a step; True when the run should checkpoint and stop."""
        self.steps += 1
        return self.requested()

    def requested(self) -> bool:
        return self.signals.signum is not None or (self.budget is not None and self.steps >= self.budget)


class SharedControl:
    """Stop requests of a worker: the parent's event, the shared step budget, or the parent gone."""

    def __init__(self, event, counter, budget: int | None, parent: int):
        self.event, self.counter, self.budget, self.parent = event, counter, budget, parent

    def step_done(self) -> bool:
        with self.counter.get_lock():
            self.counter.value += 1
        return self.requested()

    def requested(self) -> bool:
        return self.event.is_set() or (self.budget is not None and self.counter.value >= self.budget) or os.getppid() != self.parent


_WORKER: dict[str, Any] = {}


def _init_worker(event, counter, budget: int | None, parent: int, threads: int) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent relays them through the event
        signal.signal(signum, signal.SIG_IGN)
    if threads:
        import torch

        torch.set_num_threads(threads)
    from srope.lab.tasks import autotune

    autotune.apply()  # the parent's mode, inherited through the environment
    _WORKER.update(control=SharedControl(event, counter, budget, parent), prepared={})


def _work(run_one, spec, model_factory, device: str) -> dict | None:
    import torch

    control = _WORKER["control"]
    if control.requested():
        return None
    return run_one(spec, model_factory, torch.device(device), control, _WORKER["prepared"], progress=False)


def check_picklable(model_factory, jobs: int) -> None:
    try:
        pickle.dumps(model_factory)
    except Exception as error:  # pickle raises several types for functions it cannot name
        raise TypeError(
            f"jobs={jobs} trains in worker processes, so the model factory must be picklable (a module-level function), "
            f"got {model_factory!r} ({type(error).__name__})"
        ) from None


def run_pool(run_one: Callable, specs: list, model_factory, device, *, jobs: int, threads: int, stop_after_steps: int | None,
             on_done: Callable[[Any, dict], None], say: Callable[[str], None]) -> int | None:
    """Run ``specs`` (:class:`srope.lab.tasks.runner.RunSpec`) in ``jobs`` spawned workers, each
    by ``run_one`` (:func:`srope.lab.tasks.runner.run_one`, passed in by reference);
    ``on_done(spec, record)`` in this process as each run finishes. Returns the number of
    the signal that stopped the sweep, or None (all done, or the step budget spent). A
    worker's error stops the others (with checkpoints) and is raised here."""
    from srope.lab.train.stops import StopSignals

    check_picklable(model_factory, jobs)
    context = multiprocessing.get_context("spawn")
    event, counter = context.Event(), context.Value("q", 0)
    errors: list[BaseException] = []
    with StopSignals(say) as signals:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=context, initializer=_init_worker,
                                   initargs=(event, counter, stop_after_steps, os.getpid(), threads))
        try:
            futures = {pool.submit(_work, run_one, spec, model_factory, str(device)): spec for spec in specs}
            waiting = set(futures)
            while waiting:
                finished, waiting = wait(waiting, timeout=0.1, return_when=FIRST_COMPLETED)
                if signals.signum is not None:
                    event.set()
                for future in sorted(finished, key=lambda f: futures[f].index):
                    if future.cancelled():
                        continue
                    if future.exception() is not None:
                        errors.append(future.exception())
                        event.set()
                    elif future.result() is not None:
                        on_done(futures[future], future.result())
                if event.is_set():
                    for future in waiting:
                        future.cancel()  # those not started yet
        except BaseException:
            event.set()
            _kill(pool)
            raise
        pool.shutdown(wait=True)
    if errors:
        raise errors[0]
    return signals.signum


def _kill(pool: ProcessPoolExecutor) -> None:
    """End the workers now (a second signal, or an error here); their runs keep their last checkpoint."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
