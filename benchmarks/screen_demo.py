"""Screen `srope demo` recipes over seeds, many runs at once (how the CPU preset was chosen).

Each variant is the CPU preset with some fields replaced (``model`` and ``selective_rope``
entries are merged into the preset's dicts). Every (variant, seed) pair trains the Selective
RoPE model only (NoPE and RoPE stay at 0 in every run seen so far; the full demo checks them)
and is scored on ``--eval-size`` fresh sequences at 128 and 512. Runs go ``--threads`` threads
each, as many at once as the cores allow, so a 16-core host screens eight runs at a time.

    python benchmarks/screen_demo.py --variants variants.json --seeds 0-4 --out screen.json

A whole demo (all three encodings, plot and results.json) of one variant, on any device:

    python benchmarks/screen_demo.py --full '{"selective_rope": {"projection_gain": 8}}' --preset cuda --device cuda --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import time

from srope.cli import _seed_list


def variant_config(overrides: dict, eval_size: int | None = None, preset: str = "cpu"):
    """The ``preset`` with ``overrides`` (``eval_size`` too, unless None), checked."""
    from srope import demo

    base = demo.PRESETS[preset]
    fields = dict(overrides)
    for name in ("model", "selective_rope"):
        if name in fields:
            fields[name] = {**getattr(base, name), **fields[name]}
    if "curriculum" in fields:
        fields["curriculum"] = tuple(tuple(stage) for stage in fields["curriculum"])
    for name in ("betas", "phase_noise_by_stage", "lr_by_stage"):
        if fields.get(name) is not None:
            fields[name] = tuple(fields[name])
    if eval_size is not None:
        fields["eval_size"] = eval_size
    config = dataclasses.replace(base, **fields)
    config.check()
    return config


def run_one(job: tuple[str, dict, int, int, int, str]) -> dict:
    name, overrides, seed, eval_size, threads, kind = job
    import torch

    from srope import demo

    torch.set_num_threads(threads)
    config = variant_config(overrides, eval_size)
    start = time.perf_counter()
    try:
        data = demo.eval_sets(config, seed)
        run = demo.train_one(kind, config, seed, "cpu", data)
    except Exception as error:  # one broken variant must not void the screen
        return {"variant": name, "seed": seed, "kind": kind, "error": repr(error)}
    return {"variant": name, "seed": seed, "kind": kind, "seq_acc": run["seq_acc"], "final_loss": run["final_loss"],
            "parity_angles": run.get("parity_angles"),
            "loss_at": {str(s): run["loss"][s - 1] for s in (50, 150, 250, 350, 450) if s <= len(run["loss"])},
            "seconds": round(time.perf_counter() - start, 1)}


def run_full(overrides: str, preset: str, device: str, seed: int, out: str) -> None:
    import dataclasses as dc

    from srope import demo

    config = variant_config(json.loads(overrides), preset=preset)
    config = dc.replace(config, name=f"{preset} + {overrides}")
    demo.run_demo(out=out, device=device, seed=seed, config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", help="JSON file: {name: {field: value, ...}, ...}")
    parser.add_argument("--full", help="JSON overrides: run one whole demo of that variant instead of a screen")
    parser.add_argument("--preset", default="cpu", help="with --full: the preset the overrides apply to")
    parser.add_argument("--device", default="cpu", help="with --full: where to run")
    parser.add_argument("--seed", type=int, default=0, help="with --full: the seed")
    parser.add_argument("--seeds", type=_seed_list, default="0-4", help="e.g. 0-4 or 0,3,7-9")
    parser.add_argument("--eval-size", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kinds", default="selective_rope", help="comma-separated position encodings")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.full is not None:
        run_full(args.full, args.preset, args.device, args.seed, args.out)
        return
    if args.variants is None:
        parser.error("give --variants (a screen) or --full (one whole demo)")
    with open(args.variants) as f:
        variants = json.load(f)
    # seed-major, so that a screen cut short has compared its variants on the same seeds
    jobs = [(name, overrides, seed, args.eval_size, args.threads, kind)
            for seed in args.seeds for name, overrides in variants.items() for kind in args.kinds.split(",")]
    for name, overrides in variants.items():
        variant_config(overrides, args.eval_size)  # fail before starting anything
    procs = max(1, (os.cpu_count() or 1) // args.threads)
    results = []
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(procs, maxtasksperchild=1) as pool:
        for result in pool.imap_unordered(run_one, jobs):
            results.append(result)
            acc = result.get("seq_acc", {})
            angles = result.get("parity_angles") or {}
            drift = f" drift@eval {angles['drift_at_eval_len']:+.2f} rad" if angles else ""
            print(f"[{time.perf_counter() - start:6.0f} s] {result['variant']:<24} seed {result['seed']} {result['kind']:<15}"
                  f" @train {acc.get('train', float('nan')):.3f} @eval {acc.get('eval', float('nan')):.3f}{drift}"
                  f" {result.get('seconds', 0):.0f} s {result.get('error', '')}", flush=True)
            with open(args.out, "w") as f:
                json.dump({"variants": variants, "results": results, "cores": os.cpu_count(), "threads": args.threads}, f, indent=1)
    by_variant: dict[str, list[dict]] = {}
    for result in results:
        by_variant.setdefault(result["variant"], []).append(result)
    for name, rows in by_variant.items():
        rows = [r for r in rows if "seq_acc" in r and r["kind"] == "selective_rope"]
        good = sum(r["seq_acc"]["train"] >= 0.99 and r["seq_acc"]["eval"] >= 0.9 for r in rows)
        print(f"{name:<24} meets targets {good}/{len(rows)}: "
              + " ".join(f"s{r['seed']} {r['seq_acc']['train']:.2f}/{r['seq_acc']['eval']:.2f}" for r in sorted(rows, key=lambda r: r["seed"])))


if __name__ == "__main__":
    main()
