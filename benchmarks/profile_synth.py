"""Where a synthetic task's training step spends its time, to plan GPU calls and to see what
would make the paper's protocols cheaper.

For each configuration, the model ``srope synth`` builds for it, one batch of the task's real
shape drawn by the task itself, and the runner's step (the preset's initialisation and precision, cross-entropy
over the vocabulary, AdamW): the batch's host time, the step's wall time (median of
``--steps``, synchronised), with the head at the scored positions only (``--set
head_at_targets=on``), on CUDA also as a CUDA graph (``--set cuda_graph=on``) with and
without it, the eager step's GPU kernel time and its top kernels. ``--backend`` runs each
configuration under each :mod:`srope.backend` setting named (default ``auto``, srope's and
fla's kernels, and ``torch``, PyTorch everywhere), side by side in one process.

    python benchmarks/profile_synth.py --out out/bench/profile_synth.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench_op import kernel_time
from common import environment, write_json
from srope import backend
from srope.lab import provenance
from srope.lab.cli import srope_model_factory
from srope.lab.graphed import graphed_optimizer_step
from srope.lab.step import optimizer_step
from srope.lab.tasks import numerics
from srope.lab.tasks.common import rng_for
from srope.lab.tasks.runner import get_task, model_request, resolve_preset, scored_positions, task_loss
from srope.lab.train.optim import adamw

CONFIGS = {  # name: (task, preset, overrides), as experiments/gpu.sh runs them
    "copying-nope": ("copying", "authors", {"position_type": "nope"}),
    "copying-srope": ("copying", "authors", {"position_type": "selective_rope"}),
    "st-attention-s2-srope": ("state_tracking", "paper", {"mixer": "attention", "model.num_hidden_layers": 1, "position_type": "selective_rope"}),
    "st-deltanet-a3-srope": ("state_tracking", "paper_a3", {"position_type": "selective_rope"}),
    "st-gla-s2-authors-srope": ("state_tracking", "authors", {"position_type": "selective_rope"}),
    "mqar-512x64-d64-srope": ("mqar", "zoology", {"configs": "512x64", "d_models": "64", "position_type": "selective_rope"}),
    "mqar-512x64-d512-srope": ("mqar", "zoology", {"configs": "512x64", "d_models": "512", "position_type": "selective_rope"}),
    "mqar-release-512x64-d64-nope": ("mqar", "release", {"configs": "512x64", "d_models": "64", "position_type": "nope"}),
    "mqar-release-512x64-d64-srope": ("mqar", "release", {"configs": "512x64", "d_models": "64", "position_type": "selective_rope"}),
    "mqar-release-512x64-d128-srope": ("mqar", "release", {"configs": "512x64", "d_models": "128", "position_type": "selective_rope"}),
    "copying-release-gate-bias": ("copying", "release", {"position.gate": "standard", "position.bias": "true"}),
    "st-gla-s2-release-srope": ("state_tracking", "release", {"position_type": "selective_rope"}),
    "mad-recall-srope": ("mad", "paper", {"only": "in-context-recall/baseline", "position_type": "selective_rope"}),
    "mad-copying-srope": ("mad", "paper", {"only": "selective-copying/baseline", "position_type": "selective_rope"}),
}
SMALL_TRAIN_SET = {"state_tracking": "train_size", "mqar": "train_examples"}  # one batch is drawn: no need for the whole set


def median_ms(step, steps: int, device: torch.device, warmup: int = 2) -> float:
    """Median wall milliseconds of ``step`` over ``steps`` calls after ``warmup`` (compile, autotune)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return round(float(np.median(times)), 2)


def build_step(task: str, preset: str, overrides: dict, device: torch.device, batch: int | None):
    """The model, optimiser, loss and one real batch of a configuration, as the runner builds
    them; also the batch's host milliseconds."""
    if batch:
        overrides = {**overrides, "batch_size": batch}
    if task in SMALL_TRAIN_SET:
        overrides = {**overrides, SMALL_TRAIN_SET[task]: 8192}
    cfg = resolve_preset(task, preset, overrides)
    module = get_task(task)
    setting = module.settings(cfg)[0]
    prepared = module.prepare(cfg, setting, None)
    rng = rng_for(0, "profile", task)
    start = time.perf_counter()
    x_np, y_np = next(iter(prepared.train.epoch(0, rng)))
    host_ms = (time.perf_counter() - start) * 1e3
    torch.manual_seed(0)
    model = srope_model_factory(model_request(task, cfg, setting))
    numerics.initialise(model, cfg.init)
    model = numerics.store(model, cfg.precision).to(device)
    optimizer = adamw(model.parameters(), lr=1e-4)  # as the runner
    x, y = torch.as_tensor(x_np, device=device), torch.as_tensor(y_np, device=device)
    loss = task_loss(model, setting.vocab_size, device, cfg.precision)
    return model, optimizer, loss, x, y, scored_positions(y_np, device), host_ms


def step_profile(task: str, preset: str, overrides: dict, device: torch.device, steps: int, batch: int | None) -> dict:
    model, optimizer, loss, x, y, scored, host_ms = build_step(task, preset, overrides, device, batch)
    eager = optimizer_step(model, optimizer, loss)

    def step():
        eager(0, 1e-4, x, y)

    out = {"batch": list(x.shape), "parameters": sum(p.numel() for p in model.parameters()), "host_batch_ms": round(host_ms, 2),
           "step_ms": median_ms(step, steps, device)}
    out["tokens_per_s"] = round(x.numel() / out["step_ms"] * 1e3)
    if hasattr(model, "lm_head"):  # --set head_at_targets=on
        out["scored_positions"] = int(scored.numel())
        out["head_at_targets_step_ms"] = median_ms(lambda: eager(0, 1e-4, x, y, scored), steps, device)
    if device.type == "cuda":  # the runner's step with --set cuda_graph=on, with and without head_at_targets
        graphed = graphed_optimizer_step(model, optimizer, loss, strict=True)
        out["graph_step_ms"] = median_ms(lambda: graphed(0, 1e-4, x, y), steps, device, warmup=3)  # two eager, then the capture
        if hasattr(model, "lm_head"):
            at_targets = graphed_optimizer_step(model, optimizer, loss, strict=True)
            out["graph_head_at_targets_step_ms"] = median_ms(lambda: at_targets(0, 1e-4, x, y, scored), steps, device, warmup=3)
        timing = kernel_time(step, repeats=3)
        out["kernel_ms"] = round(timing["kernel_ms"], 2)
        top: dict[str, float] = {}
        for name, ms in timing["kernels"].items():
            top[name[:80]] = round(top.get(name[:80], 0.0) + ms, 3)
        out["kernels"] = dict(sorted(top.items(), key=lambda kv: -kv[1])[:25])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="configurations (default: all)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=None, help="a smaller batch than the protocol's (for a CPU smoke run)")
    parser.add_argument("--backend", nargs="+", choices=backend.BACKENDS, default=["auto", "torch"],
                        help="srope.backend settings, each a run of every configuration")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    results, source = {}, provenance.commit()
    for name in args.only or CONFIGS:
        for setting in args.backend:
            key = f"{name}/{setting}"
            with backend.use(setting):
                results[key] = step_profile(*CONFIGS[name], device, args.steps, args.batch)
            print(key, {k: v for k, v in results[key].items() if k != "kernels"}, flush=True)
            # after every configuration: a call's time limit that cuts the run keeps what it measured
            write_json(args.out, {"provenance": provenance.record(source=source), "environment": environment(), "configs": results})


if __name__ == "__main__":
    main()
