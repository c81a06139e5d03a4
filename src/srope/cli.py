"""The ``srope`` command."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from srope.demo import run_demo

    run_demo(out=args.out, device=args.device, seed=args.seed)
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="srope", description="Selective Rotary Position Embedding: library, experiments and benchmarks.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser("demo", help="show Selective RoPE working, on the CPU by default")
    demo.add_argument("--out", default="out/demo", help="folder for results.json (default: out/demo)")
    demo.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default: cpu)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.set_defaults(func=_demo)

    models = commands.add_parser("models", help="the model presets with their parameter counts per position encoding")
    models.set_defaults(func=_models)

    info = commands.add_parser("info", help="versions and available backends")
    info.set_defaults(func=_info)

    from srope.train.data import add_data_commands

    add_data_commands(commands)
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
