"""The ``srope`` command.

Building the parser imports nothing but the standard library, so ``srope --help`` answers
at once; each command imports what it needs when it runs. A user error (a bad value, a
missing file, an unknown name, an unreadable checkpoint, a missing optional package) ends
the command with one line on stderr and exit code 2; ``--debug`` (or ``SROPE_DEBUG=1``)
shows the traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from srope import __version__
from srope.lab.cli_args import OUT, _fraction, _positive_int, _seed_list
from srope.registry import model_presets, positions

DEBUG_ENV = "SROPE_DEBUG"


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input is wrong", not "srope is wrong"."""
    errors: list[type[BaseException]] = [ValueError, OSError, ImportError, FloatingPointError]
    if "safetensors" in sys.modules:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    return tuple(errors)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, FileNotFoundError) and error.filename and str(error.filename) not in text:
        text += f": {error.filename}"
    return text


# --------------------------------------------------------------------------- handlers


def _demo(args: argparse.Namespace) -> int:
    from srope.lab.demo import run_demo, run_demo_seeds

    if args.seeds is not None:
        run_demo_seeds(out=args.out, device=args.device, seeds=args.seeds, workers=args.workers)
    else:
        run_demo(out=args.out, device=args.device, seed=args.seed, workers=args.workers)
    return 0


def _info(args: argparse.Namespace) -> int:
    import platform

    import torch

    import srope
    from srope import backend

    print(f"srope {srope.__version__} | python {platform.python_version()} | torch {torch.__version__}")
    print(f"cuda available: {torch.cuda.is_available()}" + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""))
    print(f"srope.backend: {backend.get()} (settings: {', '.join(backend.BACKENDS)})")
    return 0


def _models(args: argparse.Namespace) -> int:
    import torch

    from srope.models import PRESETS, SRopeForCausalLM, preset_config

    widths = {position: max(10, len(entry.label)) for position, entry in positions.items()}
    print(f"{'preset':<18} " + " ".join(f"{positions[p].label:>{w}}" for p, w in widths.items()) + "  context  batch     lr  description")
    for name, preset in PRESETS.items():
        counts = []
        for position in widths:
            with torch.device("meta"):
                model = SRopeForCausalLM(preset_config(name, position=position))
            counts.append(sum(p.numel() for p in model.parameters()))
        t = preset.training
        print(
            f"{name:<18} " + " ".join(f"{c / 1e6:>{w - 1}.1f}M" for c, w in zip(counts, widths.values()))
            + f"  {t.context_length:>7} {t.global_batch_size:>6} {t.learning_rate:>6.0e}  {preset.description}"
        )
    return 0


def _run_name(*parts) -> str:
    return "-".join(str(p).replace("/", "-") for p in parts if p)


def _position_type(position) -> str:
    """The type name of a run's position setting (a name or ``{"type": ..., options}``)."""
    return position if isinstance(position, str) else dict(position).get("type")


def _train(args: argparse.Namespace) -> int:
    from srope.lab.train.trainer import train

    config = _run_config(args)
    out = args.out or os.path.join(OUT, "train", _run_name(config.preset, _position_type(config.position)))
    metrics = train(config, out, resume=args.resume, stop_after=args.stop_after, verbose=True)
    if metrics and os.environ.get("RANK", "0") == "0":
        print(json.dumps(metrics))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from srope.lab.train.sweep import PAPER_LRS, format_table, parse_lrs, sweep_lr

    if any(pair.split("=", 1)[0] == "lr" for pair in args.set or []):
        raise ValueError("sweep-lr sets lr itself: pass the grid with --lrs, not --set lr=...")
    grid = _config_values(args)[1]  # a sweep.json given as --config: its grid, unless --lrs
    lrs = parse_lrs(args.lrs) if args.lrs is not None else list(PAPER_LRS) if grid is None else grid
    config = _run_config(args)
    summary = sweep_lr(config, args.out or os.path.join(OUT, "sweep", _run_name(config.preset, _position_type(config.position))), lrs)
    if os.environ.get("RANK", "0") == "0":
        print(format_table(summary))
    return 0 if summary["chosen"] else 1


def _prepare(args: argparse.Namespace) -> int:
    from srope.lab.train.prepare import run_prepare_command

    return run_prepare_command(args)


def _theory(args: argparse.Namespace) -> int:
    import pathlib

    from srope.lab.theory import COMMANDS

    COMMANDS[args.name](pathlib.Path(args.out), seed=args.seed)
    print(f"wrote {pathlib.Path(args.out) / (args.name + '.json')} and {pathlib.Path(args.out) / (args.name + '.png')}")
    return 0


def srope_model_factory(request):
    """The synthetic runner's model: an ``SRopeForCausalLM`` of the requested mixer and position,
    or Zoology's language model (``architecture="zoology"``, :mod:`srope.lab.tasks.zoology_model`)."""
    if request.architecture == "zoology":
        from srope.lab.tasks.zoology_model import ZoologyConfig, ZoologyLM

        return ZoologyLM(ZoologyConfig.from_dict({"vocab_size": request.vocab_size, **request.model}), position=request.position)
    from srope.models import SRopeConfig, SRopeForCausalLM

    config = SRopeConfig(vocab_size=request.vocab_size, mixer=request.mixer, position=request.position, bos_token_id=None, eos_token_id=None, **request.model)
    return SRopeForCausalLM(config)


def _synth(args: argparse.Namespace) -> int:
    from srope.lab.tasks.cli import run_synth_command

    if args.out is None and args.task != "report" and not (args.dry_run or args.list_recipes):
        first = args.recipe.replace(":", "-") if args.recipe else args.task  # the recipe's run, then what the options change
        args.out = os.path.join(OUT, "synth", _run_name(first, args.preset, args.mixer, args.position))
    return run_synth_command(args, srope_model_factory)


def _bench(args: argparse.Namespace) -> int:
    """``python benchmarks/bench_LEVEL.py ARGS`` in a process of its own (its folder first on its
    sys.path, as for any script), importing this srope: its source folder leads PYTHONPATH."""
    import pathlib
    import subprocess

    src = pathlib.Path(__file__).resolve().parents[2]  # src/ of a checkout (site-packages when installed)
    script = src.parent / "benchmarks" / f"bench_{args.level}.py"
    if not script.exists():
        raise FileNotFoundError(f"srope bench needs a source checkout: {script} is missing (benchmarks/ is not part of the installed package)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(script), *args.args], env=env, check=False).returncode


# --------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """A usage error is one line too (the usage itself is what --help is for)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _add_run_arguments(parser: argparse.ArgumentParser, *, what: str, sets: str = "(repeatable)", files: str = "a run's train_config.json") -> None:
    """What srope train and srope sweep-lr both take to describe a run, --config FILE (``files``:
    what it may be besides a file of TrainConfig fields) giving the preset and the steps or not."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help=f"start from these settings: {files}, or a JSON/TOML file of TrainConfig fields "
                             "(precedence: preset defaults < FILE < options < --set)")
    parser.add_argument("--preset", default=None, choices=model_presets, metavar="NAME",
                        help=f"model preset: {', '.join(model_presets)} (see `srope models`); required unless --config gives it")
    parser.add_argument("--position", default=None, choices=positions,
                        help=f"{' | '.join(positions)} (default: selective_rope; options via --set position.KEY=VALUE)")
    parser.add_argument("--data", default=None, help="shakespeare (default) | a text/JSONL/parquet file or folder | hf:NAME[:CONFIG] | a prepared token store")
    parser.add_argument("--cache", default=None, help="data cache folder (default: $SROPE_CACHE or ~/.cache/srope)")
    parser.add_argument("--tokenizer", default=None, help="mistral-v1 (the paper's; default) or a local Hugging Face tokenizer folder (not with a token store, which has its own)")
    parser.add_argument("--val-fraction", type=_fraction, default=None, help="held-out fraction of the documents of a local or hf source, half the validation split (lr choice, evals while training), half the test split (srope eval) (default 0.01; the same as --set val_fraction=...)")
    parser.add_argument("--max-steps", type=_positive_int, default=None, help=what + "; required unless --config gives it")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help=f"override a TrainConfig field, model.FIELD or position.OPTION {sets}")


def _config_values(args: argparse.Namespace) -> tuple[dict, list | None]:
    """The settings of --config FILE ({} without one) and the learning rates it gives (None): srope
    sweep-lr also takes its own record, a sweep.json, for its base settings and its grid."""
    from srope.lab.config import read_config_file

    values = {} if args.config is None else read_config_file(args.config)
    if args.command == "sweep-lr" and isinstance(values.get("base_config"), dict) and "runs" in values:
        return values["base_config"], values.get("lrs")
    return values, None


def _run_config(args: argparse.Namespace):
    """The TrainConfig the run arguments describe: preset defaults < --config FILE < options <
    --set, checked. A setting given both as an option and with --set must agree (the run folder
    is named from the result); the file's settings are there to be overridden."""
    import dataclasses

    from srope.lab.config import apply_overrides
    from srope.lab.overrides import parse_assignments
    from srope.lab.train.train_config import TrainConfig

    options = {"preset": args.preset, "position": args.position, "data": args.data, "cache": args.cache, "tokenizer": args.tokenizer,
               "val_fraction": args.val_fraction, "max_steps": args.max_steps}  # fmt: skip
    given = {key: value for key, value in options.items() if value is not None}
    file = args.config
    values = _config_values(args)[0]
    config = TrainConfig() if file is None else TrainConfig.from_file(values, file)
    sets = parse_assignments(args.set)
    for key in ("preset", "max_steps"):  # what a run cannot default
        if key not in given and key not in sets and key not in values:
            where = f": --config {file} does not give {key}" if file else " (or a --config FILE that gives it)"
            raise ValueError(f"--{key.replace('_', '-')} is required{where}")
    config = apply_overrides(dataclasses.replace(config, **given), args.set or [])
    for key, value in given.items():
        final = _position_type(config.position) if key == "position" else getattr(config, key)
        if key in sets and final != value:
            raise ValueError(
                f"--{key.replace('_', '-')} {value!r} and --set {key}={sets[key]} disagree: give the setting once"
                + (" (--set position.KEY=VALUE sets options of the --position encoding)" if key == "position" else "")
            )
    return config


def _add_train(commands) -> None:
    train = commands.add_parser(
        "train",
        help="pre-train a language model (also under torchrun --nproc-per-node K -m srope train)",
        description="Train a model preset on a corpus. A plain .txt file is split into documents at blank lines "
        "(long paragraphs in chunks); a held-out fraction of the documents (--val-fraction) is split between the validation and test splits.",
    )
    _add_run_arguments(train, what="optimiser steps of the whole run (fixes the schedule)")
    train.add_argument("--out", default=None, help=f"run folder: checkpoints, metrics.jsonl, tensorboard, model/ (default: {OUT}/train/PRESET-POSITION)")
    train.add_argument("--stop-after", type=_positive_int, default=None, help="stop after this step with a checkpoint (continue with --resume)")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    train.set_defaults(func=_train)


def _add_sweep(commands) -> None:
    sweep = commands.add_parser(
        "sweep-lr",
        help="the paper's learning-rate grid for one configuration, selected by held-out perplexity",
        description="One `srope train` run per learning rate into OUT/lr_<value>/, then OUT/sweep.json and OUT/sweep.png. "
        "Run it again with the same arguments to resume: finished and diverged runs are skipped.",
    )
    _add_run_arguments(sweep, what="optimiser steps of every run", sets="(repeatable; not lr)",
                       files="a sweep's sweep.json (its base settings and grid) or a run's train_config.json (its lr is the grid's)")
    sweep.add_argument("--out", default=None, help=f"sweep folder (default: {OUT}/sweep/PRESET-POSITION)")
    sweep.add_argument("--lrs", default=None, help="comma-separated peak learning rates (default: the paper's grid 5e-4,1e-3,2e-3,4e-3,8e-3,1.6e-2)")
    sweep.set_defaults(func=_sweep)


def _add_data(commands) -> None:
    data = commands.add_parser("data", help="prepare language-model corpora (tokenised, cached, copyable)")
    actions = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prepare = actions.add_parser(
        "prepare",
        help="download/tokenise a corpus into the cache and print its token store",
        description="Tokenise a corpus into <cache>/tokens/...; copy the cache folder to a machine without network and "
        "pass --cache (or SROPE_CACHE) there.",
    )
    prepare.add_argument("source", help="shakespeare | a .txt/.jsonl/.json/.parquet file or folder | hf:NAME[:CONFIG]")
    prepare.add_argument("--cache", default=None, help="cache folder (default: $SROPE_CACHE or ~/.cache/srope)")
    prepare.add_argument("--tokenizer", default=None, help="mistral-v1 (default) or a local HF tokenizer folder")
    prepare.add_argument("--split", default=None, help="dataset split to read (hf sources only; default: train)")
    prepare.add_argument("--text-field", default=None, help="column holding the text (.jsonl/.json/.parquet files and hf sources; default: text)")
    prepare.add_argument("--revision", default=None, help="dataset revision (hf sources only)")
    prepare.add_argument("--val-fraction", type=_fraction, default=None, help="held-out fraction of documents, half validation, half test (default 0.01; not for shakespeare, whose splits are fixed plays)")
    prepare.add_argument("--max-train-tokens", type=_positive_int, default=None, help="stop after this many training tokens")
    prepare.add_argument("--max-val-tokens", type=_positive_int, default=None, help="cap the held-out split")
    prepare.add_argument("--no-bos", action="store_true", help="do not start documents with the bos token")
    prepare.add_argument("--no-eos", action="store_true", help="do not end documents with the eos token")
    prepare.set_defaults(func=_prepare)


def build_parser() -> argparse.ArgumentParser:
    from srope.lab.convert import add_convert_command
    from srope.lab.eval.cli import add_eval_commands
    from srope.lab.report.cli import add_report_arguments
    from srope.lab.tasks.cli import add_synth_arguments

    parser = _Parser(prog="srope", description="Selective Rotary Position Embedding: library, experiments and benchmarks.")
    parser.add_argument("--debug", action="store_true", default=False, help=f"show the full traceback of an error (or set {DEBUG_ENV}=1)")
    parser.add_argument("--version", action="version", version=f"srope {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser("demo", help="show Selective RoPE working, on the CPU by default")
    demo.add_argument("--out", default=f"{OUT}/demo", help=f"folder for results.json (default: {OUT}/demo)")
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

    _add_data(commands)
    _add_train(commands)
    _add_sweep(commands)
    add_eval_commands(commands)
    add_report_arguments(commands)
    add_convert_command(commands)

    synth = commands.add_parser("synth", help="the paper's synthetic tasks: mqar, mad, copying, state_tracking, or a recipe (or 'report DIR...')")
    add_synth_arguments(synth)
    synth.set_defaults(func=_synth)

    theory = commands.add_parser("theory", help="the paper's theory, checked: RFF view of softmax, Theorem 1 / temperature spectra, spectral leakage")
    theory.add_argument("name", choices=["rff", "temperature", "leakage"], help="which study to run")
    theory.add_argument("--out", default=f"{OUT}/theory", help=f"folder for <name>.json and <name>.png (default: {OUT}/theory)")
    theory.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    theory.set_defaults(func=_theory)

    bench = commands.add_parser("bench", help="GPU benchmarks: op (the rotation), layer (host x PE), model (tokens/s, decode)")
    bench.add_argument("level", choices=["op", "layer", "model"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to benchmarks/bench_LEVEL.py (e.g. --out FILE, --dry-run)")
    bench.set_defaults(func=_bench)

    info = commands.add_parser("info", help="versions and available backends")
    info.set_defaults(func=_info)

    for sub in _subparsers(parser):
        # SUPPRESS: a subcommand's --debug must not reset the one given before it.
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from _subparsers(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return args.func(args)
    except BrokenPipeError:  # `srope ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as stop:  # srope train's planned stops say where their checkpoint is
        print(f"srope {args.command}: {stop or 'interrupted'}", file=sys.stderr)
        return 128 + int(getattr(stop, "signum", 2))
    except _user_errors() as error:
        if debug:
            raise
        print(f"srope {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
