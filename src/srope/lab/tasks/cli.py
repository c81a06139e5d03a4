"""``srope synth``: the argument parser and its handler, for ``srope.lab.cli`` to mount.

    srope synth TASK [--preset NAME] [--config FILE] [--mixer M] [--position P] [--set KEY=VALUE ...] --out DIR
                     [--jobs N] [--stop-after-steps K] [--resume]
    srope synth TASK ... --dry-run          # print the resolved preset and settings, run nothing
    srope synth --recipe NAME[:ARM] [options as above]
    srope synth --list-recipes

``--jobs N`` trains N of the sweep's runs at once in worker processes; ``--resume``
continues the sweep in ``--out`` exactly where it stopped (SIGINT, SIGTERM,
``--stop-after-steps``, or a kill: then from the last checkpoint). One sweep per ``--out``: a
second ``srope synth`` into a folder in use is refused, naming the pid that holds it.

``--mixer`` and ``--position`` are shorthands for ``--set mixer=...`` and
``--set position_type=...``; ``--set model.KEY=V`` / ``--set position.KEY=V`` reach the model
config and the selected position encoding's options. ``--config FILE`` (a sweep's
``results.json`` or a hand-written JSON/TOML file) comes between the preset and them:
preset < FILE < ``--mixer``/``--position`` < ``--set``.

``--recipe NAME[:ARM]`` is a named, versioned run of the paper (:mod:`srope.lab.recipes`): its
task, preset and ``--set`` pairs, as if given before the command's own options, which go over
them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from srope.lab.tasks.registry import check_task, tasks
from srope.registry import mixers, positions


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    from srope.lab import recipes

    parser.add_argument("task", nargs="?", default=None, help=f"one of: {', '.join(tasks)} (not needed with --recipe)")
    parser.add_argument("dirs", nargs="*", help=argparse.SUPPRESS)  # only to point `srope synth report DIR...` at `srope report`
    parser.add_argument("--preset", default=None, help="task preset: cpu (small, under a minute on 2 cores), paper, and the task's own (mqar: zoology; copying, state_tracking: authors; state_tracking also paper_a3); --dry-run lists them")
    parser.add_argument("--recipe", default=None, metavar="NAME[:ARM]",
                        help=f"a named, versioned run of the paper ({', '.join(recipes.names())}; --list-recipes shows their arms): "
                             "its task, preset and --set pairs, under the options given here")
    parser.add_argument("--list-recipes", action="store_true", help="list the recipes (name, version, description, arms) and exit")
    parser.add_argument("--mixer", default=None, help=f"token mixer ({', '.join(mixers)}); default: the preset's")
    parser.add_argument("--position", default=None, choices=positions, help="position encoding; default: the preset's (selective_rope)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="start from these settings: a sweep's results.json, or a JSON/TOML file of the task's settings (optional task, preset); "
                             "precedence: preset < FILE < --mixer/--position < --set")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a preset entry (repeatable)")
    parser.add_argument("--out", default=None, help="result folder")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--cache-dir", default="default", help="data cache (default: $SROPE_CACHE or ~/.cache/srope)")
    parser.add_argument("--label", default=None, help="row name in reports (default: MIXER/POSITION[+gate][+bias])")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved preset and its settings, then exit")
    from srope.lab.cli_args import _positive_int

    parser.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                        help="train N runs of the sweep at once, each in its own process (on the CPU: one torch thread each); same results as one at a time")
    parser.add_argument("--stop-after-steps", type=_positive_int, default=None, metavar="K",
                        help="stop after about K optimiser steps (over all runs) with checkpoints; continue with --resume")
    parser.add_argument("--resume", action="store_true", help="continue the sweep in --out: finished runs are kept, the others continue from their checkpoints")
    parser.add_argument("--autotune", choices=("full", "first"), default=None,
                        help="full: Triton autotunes every kernel (default, or $SROPE_AUTOTUNE); first: the first candidate only, "
                             "which spares minutes of fla's autotuning per new model width (same results up to rounding)")


def synth_overrides(args: argparse.Namespace) -> dict[str, str]:
    from srope.lab.overrides import parse_assignments

    overrides = {}
    if args.mixer is not None:
        overrides["mixer"] = args.mixer
    if args.position is not None:
        overrides["position_type"] = args.position
    sets = parse_assignments(args.overrides)
    for option, key in (("mixer", "mixer"), ("position", "position_type")):  # the run folder is named from the option
        if key in overrides and key in sets and sets[key] != overrides[key]:
            raise ValueError(f"--{option} {overrides[key]!r} and --set {key}={sets[key]} disagree: give the setting once")
    overrides.update(sets)
    return overrides


def synth_request(args: argparse.Namespace) -> tuple[str, str | None, dict[str, Any]]:
    """The task, preset and overrides that parsed ``srope synth`` arguments ask for: a
    ``--recipe``'s task, preset and settings with the command's ``--preset``, ``--mixer``,
    ``--position`` and ``--set`` over them. Checked before torch loads."""
    overrides = synth_overrides(args)
    if args.recipe is None:
        if args.task is None:
            raise ValueError(f"give a task ({', '.join(tasks)}), --recipe NAME or --list-recipes")
        check_task(args.task, args.preset)
        return args.task, args.preset, overrides
    from srope.lab import recipes

    recipe = recipes.load(args.recipe)
    if args.task not in (None, recipe.task):
        raise ValueError(f"--recipe {args.recipe} is a {recipe.task} run, not {args.task}")
    check_task(recipe.task, args.preset)
    return recipe.task, args.preset or recipe.preset, {**recipe.settings, **overrides}


def resolve_synth_command(argv: list[str]) -> tuple[str, str, Any]:
    """The task, preset name and settings that ``srope synth ARGV`` runs, checked; nothing runs."""
    from srope.lab.tasks.runner import resolve_run

    parser = argparse.ArgumentParser(prog="srope synth")
    add_synth_arguments(parser)
    args = parser.parse_args(argv)
    task, preset, overrides = synth_request(args)
    return (task, *resolve_run(task, preset, overrides, args.config))


def run_synth_command(args: argparse.Namespace, model_factory: Any) -> int:
    """Handle parsed ``srope synth`` arguments; ``model_factory(request) -> nn.Module``."""
    if args.list_recipes:
        from srope.lab import recipes

        print(recipes.listing())
        return 0
    if args.task == "report":
        raise ValueError("`srope synth report` is now `srope report DIR...` (one page per experiment; --by-folder adds a row per result folder)")
    if args.dirs:
        raise ValueError(f"unexpected arguments {args.dirs}")
    task, preset, overrides = synth_request(args)  # a misspelt name is refused before torch loads
    from srope.lab.tasks.runner import get_task, presets_line, report, resolve_preset, run_synthetic

    cfg = resolve_preset(task, preset, overrides, args.config)
    recipe = None
    if args.recipe:
        from srope.lab import recipes

        recipe = recipes.load(args.recipe)
    if args.dry_run:
        settings = get_task(task).settings(cfg)
        if recipe is not None:
            print(f"recipe {recipe.name} (version {recipe.version}): srope synth {' '.join(recipe.flags())}")
        print(presets_line(task))
        print(json.dumps(cfg.to_dict(), indent=1))
        print(f"{len(settings)} settings x {len(cfg.lrs) * len(cfg.weight_decays) * len(cfg.seeds)} runs each:")
        for s in settings:
            print(f"  {s.name}  (vocab {s.vocab_size}, length {s.max_len})")
        return 0
    if not args.out:
        raise ValueError("--out DIR is required")
    cache = None if args.cache_dir in ("", "none") else args.cache_dir
    results = run_synthetic(task, model_factory, out=args.out, overrides=overrides, preset=preset, device=args.device,
                            cache_dir=cache, label=args.label, progress=not args.no_progress, resume=args.resume, jobs=args.jobs,
                            stop_after_steps=args.stop_after_steps, autotune=args.autotune, config=args.config,
                            recipe=recipe.record() if recipe is not None else None)
    print(report([args.out]))
    print(f"wrote {Path(args.out) / 'results.json'} in {results['seconds']:.0f} s")
    if not results["complete"]:
        print(results["stopped"])
    return 0
