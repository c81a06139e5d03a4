"""Training the three models, in this process or in worker processes, with a progress bar each."""

from __future__ import annotations

import contextlib
import os
import queue
import time
import traceback
from typing import Any, Callable

import numpy as np
import torch

from srope.lab.demo.config import LABELS, POSITIONS, DemoConfig
from srope.lab.demo.evaluation import predict, score
from srope.lab.demo.model import parity_angles
from srope.lab.demo.training import train_model
from srope.lab.tasks import autotune


def train_one(kind: str, config: DemoConfig, seed: int, device: str, data: dict[str, Any],
              report: Callable[[str, int, float], None] | None = None) -> dict[str, Any]:
    """Train the ``kind`` model (:func:`train_model`), then score it on ``data`` (from :func:`eval_sets`)."""
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    tuning = autotune.scoped(config.autotune) if device == "cuda" else contextlib.nullcontext()
    with tuning:
        model, losses = train_model(kind, config, seed, device, report)
        train_seconds, train_cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        bf16 = config.bf16_autocast and device == "cuda"
        scores = {name: score(predict(model, data[name][0], config.eval_batch_size, torch.device(device), bf16), data[name][1])
                  for name in ("train", "eval")}
    window = max(1, min(50, len(losses) // 10))
    return {
        "parity_angles": parity_angles(model, config.eval_len) if kind == "selective_rope" else None,
        "seq_acc": {name: scores[name]["seq_acc"] for name in ("train", "eval")},
        "token_acc": {name: scores[name]["token_acc"] for name in ("train", "eval")},
        "curve": {"length": list(range(1, config.eval_len + 1)), "seq_acc": scores["eval"]["curve"]},
        "final_loss": float(losses[-window:].mean()),
        "loss": [float(v) for v in losses],
        "finite": bool(np.isfinite(losses).all()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "position_parameters": sum(p.numel() for name, p in model.named_parameters() if ".position." in name),
        "train_seconds": round(train_seconds, 3),
        "train_cpu_seconds": round(train_cpu, 3),
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(_cpu_seconds() - cpu_start, 3),
    }


def _cpu_seconds() -> float:
    """CPU time of this process (user + system, all threads)."""
    times = os.times()
    return times.user + times.system


def _worker(kind: str, config: DemoConfig, seed: int, device: str, threads: int, data: dict, messages) -> None:
    """Process entry point: train one model with ``threads`` threads, post progress and the result."""
    try:
        torch.set_num_threads(threads)

        def report(name: str, step: int, loss: float | None) -> None:
            messages.put(("step", name, step, loss))

        messages.put(("done", kind, train_one(kind, config, seed, device, data, report)))
    except BaseException:  # report everything, the parent raises it
        messages.put(("error", kind, traceback.format_exc()))


def _train_all(config: DemoConfig, seed: int, device: str, data: dict, workers: int, threads: int, bars: dict) -> dict[str, dict]:
    """Train the three models, ``workers`` at a time; update each one's progress bar in ``bars``."""
    done: dict[str, int] = {}

    def report(kind: str, step: int, loss: float | None) -> None:
        bar = bars[kind]
        if loss is not None:
            bar.set_postfix_str(f"training loss {loss:.3f}", refresh=False)
        bar.update(step - done.get(kind, 0))
        done[kind] = step

    if workers == 1:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return {kind: train_one(kind, config, seed, device, data, report) for kind in POSITIONS}
        finally:
            torch.set_num_threads(old)

    ctx = _process_context()
    messages = ctx.Queue()
    pending, runs, procs = list(POSITIONS), {}, {}
    while pending or procs:
        while pending and len(procs) < workers:
            kind = pending.pop(0)
            procs[kind] = ctx.Process(target=_worker, args=(kind, config, seed, device, threads, data, messages), daemon=True)
            try:
                procs[kind].start()
            except (BrokenPipeError, ConnectionError, EOFError) as error:
                _stop(procs)
                raise RuntimeError(f"could not start the demo worker for {kind} ({error}); {_WORKER_HINT}") from error
        try:
            message = messages.get(timeout=1.0)
        except queue.Empty:
            dead = [kind for kind, proc in procs.items() if not proc.is_alive() and kind not in runs]
            if dead:
                _stop(procs)
                raise RuntimeError(f"demo worker(s) for {dead} exited without a result (killed, or failed to start: {_WORKER_HINT})")
            continue
        if message[0] == "step":
            report(*message[1:])
        elif message[0] == "done":
            runs[message[1]] = message[2]
            procs.pop(message[1]).join()
        else:
            _stop(procs)
            raise RuntimeError(f"demo worker for {message[1]} failed:\n{message[2]}")
    return runs


_WORKER_HINT = ("worker processes import the main script again, so a script that calls run_demo with workers > 1 must keep "
                "its top-level code under `if __name__ == \"__main__\":` (or pass workers=1)")


def _stop(procs: dict) -> None:
    for proc in procs.values():
        if proc.is_alive():
            proc.terminate()


def _process_context():
    """Worker processes from a fork server that has imported this module once (importing
    torch and transformers takes seconds of CPU per process, which three spawned workers would
    spend at the same time on the cores that train); plain ``spawn`` where there is no fork
    server (Windows). Not ``fork``: forking after torch's thread pools have started is unsafe."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")


def _progress(config: DemoConfig, seed: int, enabled: bool) -> dict:
    """One progress bar per model, each counting that model's ``config.steps`` optimiser steps
    (700 in the CPU preset) and showing its latest training loss."""
    import sys

    from tqdm.auto import tqdm

    if enabled:
        print(f"parity, {config.name} preset, seed {seed}: {len(POSITIONS)} models of {config.steps} steps each", file=sys.stderr)
    width = max(len(label) for label in LABELS.values())
    return {kind: tqdm(total=config.steps, desc=f"{LABELS[kind]:<{width}}", unit="step", position=index, leave=True,
                       disable=not enabled, dynamic_ncols=True)
            for index, kind in enumerate(POSITIONS)}
