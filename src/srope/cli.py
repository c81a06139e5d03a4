"""The ``srope`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _demo(args: argparse.Namespace) -> int:
    from srope.demo import run_demo, run_demo_seeds

    if args.seeds is not None:
        run_demo_seeds(out=args.out, device=args.device, seeds=args.seeds, workers=args.workers)
    else:
        run_demo(out=args.out, device=args.device, seed=args.seed, workers=args.workers)
    return 0


def _seed_list(text: str) -> list[int]:
    """``"0-4"`` or ``"0,3,7-9"`` as a list of distinct seeds (argparse type)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if dash else int(lo)
            if last < first:
                raise ValueError
            seeds.extend(range(first, last + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0-4 or 0,3,7-9 (non-negative, ranges ascending), got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, got {text!r}")
    return seeds


def _info(args: argparse.Namespace) -> int:
    import platform

    import torch

    import srope
    from srope.ops import BACKENDS

    print(f"srope {srope.__version__} | python {platform.python_version()} | torch {torch.__version__}")
    print(f"cuda available: {torch.cuda.is_available()}" + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""))
    print(f"rotary backends: {', '.join(BACKENDS)}")
    return 0


def _models(args: argparse.Namespace) -> int:
    import torch

    from srope.models import PRESETS, SRopeForCausalLM, preset_config

    print(f"{'preset':<18} {'nope':>10} {'rope':>10} {'srope':>10}  context  batch     lr  description")
    for name, preset in PRESETS.items():
        counts = []
        for position in ("nope", "rope", "selective_rope"):
            with torch.device("meta"):
                model = SRopeForCausalLM(preset_config(name, position=position))
            counts.append(sum(p.numel() for p in model.parameters()))
        t = preset.training
        print(
            f"{name:<18} " + " ".join(f"{c / 1e6:>9.1f}M" for c in counts)
            + f"  {t.context_length:>7} {t.global_batch_size:>6} {t.learning_rate:>6.0e}  {preset.description}"
        )
    return 0


def _train(args: argparse.Namespace) -> int:
    from srope.train.trainer import TrainConfig, apply_overrides, train

    config = TrainConfig(preset=args.preset, position=args.position, data=args.data, max_steps=args.max_steps, cache=args.cache)
    config = apply_overrides(config, args.set or [])
    metrics = train(config, args.out, resume=args.resume, stop_after=args.stop_after)
    if metrics and os.environ.get("RANK", "0") == "0":
        print(json.dumps(metrics))
    return 0


def _theory(args: argparse.Namespace) -> int:
    import pathlib

    from srope.theory import COMMANDS

    COMMANDS[args.name](pathlib.Path(args.out), seed=args.seed)
    return 0


def srope_model_factory(request):
    """The synthetic runner's model: an ``SRopeForCausalLM`` of the requested mixer and position."""
    from srope.models import SRopeConfig, SRopeForCausalLM

    config = SRopeConfig(vocab_size=request.vocab_size, mixer=request.mixer, position=request.position, bos_token_id=None, eos_token_id=None, **request.model)
    return SRopeForCausalLM(config)


def _synth(args: argparse.Namespace) -> int:
    from srope.tasks.cli import run_synth_command

    return run_synth_command(args, srope_model_factory)


def _bench(args: argparse.Namespace) -> int:
    import pathlib
    import runpy

    script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / f"bench_{args.level}.py"
    if not script.exists():
        raise SystemExit(f"srope bench needs a source checkout: {script} is missing (benchmarks/ is not part of the installed package)")
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="srope", description="Selective Rotary Position Embedding: library, experiments and benchmarks.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser("demo", help="show Selective RoPE working, on the CPU by default")
    demo.add_argument("--out", default="out/demo", help="folder for results.json (default: out/demo)")
    demo.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default: cpu)")
    seed = demo.add_mutually_exclusive_group()
    seed.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    seed.add_argument("--seeds", type=_seed_list, default=None,
                      help="run once per seed, e.g. 0-4, into OUT/seed<N>, plus OUT/summary.json and OUT/seeds.png")
    demo.add_argument("--workers", type=int, choices=[1, 2, 3], default=None,
                      help="models trained at once, one process each (default: 3 on a CPU with 2+ cores, else 1)")
    demo.set_defaults(func=_demo)

    models = commands.add_parser("models", help="the model presets with their parameter counts per position encoding")
    models.set_defaults(func=_models)

    train = commands.add_parser("train", help="pre-train a language model (also under torchrun --nproc-per-node K -m srope train)")
    train.add_argument("--preset", required=True, help="model preset (see `srope models`)")
    train.add_argument("--position", default="selective_rope", help="nope | rope | selective_rope (options via --set position.KEY=VALUE)")
    train.add_argument("--data", default="shakespeare", help="shakespeare | a text/JSONL/parquet file or folder | hf:NAME[:CONFIG] | a prepared token store")
    train.add_argument("--cache", default=None, help="data cache folder (default: $SROPE_CACHE or ~/.cache/srope)")
    train.add_argument("--max-steps", type=int, required=True, help="optimiser steps of the whole run (fixes the schedule)")
    train.add_argument("--out", required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard, model/")
    train.add_argument("--stop-after", type=int, default=None, help="end the process after this step, as a kill would")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a TrainConfig field, model.FIELD or position.OPTION (repeatable)")
    train.set_defaults(func=_train)

    theory = commands.add_parser("theory", help="the paper's theory, checked: RFF view of softmax, Theorem 1 / temperature spectra, spectral leakage")
    theory.add_argument("name", choices=["rff", "temperature", "leakage"], help="which study to run")
    theory.add_argument("--out", default="results/theory", help="folder for <name>.json and <name>.png (default: results/theory)")
    theory.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    theory.set_defaults(func=_theory)

    from srope.tasks.cli import add_synth_arguments

    synth = commands.add_parser("synth", help="the paper's synthetic tasks: mqar, mad, copying, state_tracking (or 'report DIR...')")
    add_synth_arguments(synth)
    synth.set_defaults(func=_synth)

    bench = commands.add_parser("bench", help="GPU benchmarks: op (the rotation), layer (host x PE), model (tokens/s, decode)")
    bench.add_argument("level", choices=["op", "layer", "model"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to benchmarks/bench_LEVEL.py (e.g. --out FILE, --dry-run)")
    bench.set_defaults(func=_bench)

    info = commands.add_parser("info", help="versions and available backends")
    info.set_defaults(func=_info)

    from srope.train.data import add_data_commands

    add_data_commands(commands)
    from srope.eval.cli import add_eval_commands
    from srope.train.sweep import add_sweep_command

    add_sweep_command(commands)
    add_eval_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
