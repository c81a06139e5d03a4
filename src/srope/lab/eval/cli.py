"""``srope eval`` and ``srope lm-eval``: argument parsing only; the work is in
:mod:`srope.lab.eval.perplexity` and :mod:`srope.lab.eval.harness`."""

from __future__ import annotations

import argparse


def add_eval_commands(commands: argparse._SubParsersAction) -> None:
    """Register ``eval`` and ``lm-eval`` on the ``srope`` command's subparsers."""
    ev = commands.add_parser(
        "eval",
        help="held-out perplexity, perplexity by position, and beyond the training length",
        description="Score a held-out split of a corpus with a trained model at several context lengths (the same targets "
        "for each); write FILE.json and FILE.png (loss by position, one line per context length). By default the split is test "
        "(training measures val and learning rates are chosen on it) and the lengths are 1x, 2x and 4x the training length, "
        "those the split has a row of (L + 1 tokens) for.",
    )
    ev.add_argument("--model", required=True, help="model folder (RUN/model) or run folder of `srope train`")
    ev.add_argument("--data", default=None, help="shakespeare | a text/JSONL/parquet file or folder | hf:NAME[:CONFIG] | a token store (default: the run's)")
    ev.add_argument("--cache", default=None, help="data cache folder (default: the run's, else $SROPE_CACHE or ~/.cache/srope)")
    ev.add_argument("--tokenizer", default=None, help="tokenizer to prepare --data with (default: the run's for the run's data, else the one saved with the model; must equal the model's; not with a token store, which has its own)")
    ev.add_argument("--val-fraction", type=float, default=None, help="held-out fraction of the documents when --data is split here, half val and half test (default: the run's for the run's data, else 0.01)")
    ev.add_argument("--split", default=None, choices=["test", "val"], help="split to score (default: test; val, with a warning, when the store's test split is empty)")
    ev.add_argument("--seq-len", type=int, nargs="+", default=None, metavar="L", help="context lengths (default: 1x 2x 4x the training length, those that fit the split)")
    ev.add_argument("--batch-size", type=int, default=8, help="rows per forward (default: 8)")
    ev.add_argument("--max-rows", type=int, default=None, help="rows of the longest context to score (default: the whole split)")
    ev.add_argument("--packing", default=None, choices=["concat", "documents"], help="row packing (default: the run's, else concat)")
    ev.add_argument("--bucket-size", type=int, default=None, help="positions per curve bucket (default: longest context / 64)")
    ev.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    ev.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="autocast dtype; auto = bfloat16 on CUDA, float32 on the CPU")
    ev.add_argument("--out", default=None, help="result FILE.json; the plot goes to FILE.png (default: out/eval/RUN.json, RUN the run folder's name)")
    ev.set_defaults(func=run_eval_command)

    lm = commands.add_parser(
        "lm-eval",
        help="lm-evaluation-harness 0.4.x on an srope model (--model hf with our model registered)",
        description="Runs lm-eval's own command line in this process after registering srope's models. Arguments of lm-eval "
        "not listed here go after `--`, e.g. `srope lm-eval --model RUN/model --tasks piqa -- --write_out`.",
    )
    lm.add_argument("--model", required=True, help="model folder (RUN/model) or run folder of `srope train`")
    lm.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks (the paper's: wikitext,lambada_openai,piqa,hellaswag,winogrande,arc_easy,arc_challenge)")
    lm.add_argument("--limit", type=float, default=None, help="examples per task (a count, or a fraction < 1)")
    lm.add_argument("--batch-size", default="1", help="an integer or auto[:N] (default: 1)")
    lm.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    lm.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="autocast dtype; weights stay float32 (default: bfloat16 on CUDA)")
    lm.add_argument("--max-length", type=int, default=None, help="lm-eval's max_length (default: the run's training context)")
    lm.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's, 0 for the paper's)")
    lm.add_argument("--output-path", default=None, help="folder for lm-eval's results (and samples) JSON")
    lm.add_argument("--log-samples", action="store_true", help="also write every sample's inputs and outputs")
    lm.add_argument("--include-path", default=None, help="folder of extra task YAML files (e.g. local tasks)")
    lm.add_argument("--gen-kwargs", default=None, help="generation arguments, lm-eval syntax (e.g. until=['\\n\\n'])")
    lm.add_argument("--seed", default=None, help="lm-eval's seeds (one integer or four comma-separated)")
    lm.add_argument("--model-args", default=None, help="extra or overriding HFLM arguments, key=value,key=value")
    lm.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="after `--`: passed to lm-eval as they are")
    lm.set_defaults(func=run_lm_eval_command)


def run_eval_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from srope.lab.eval.model_dir import resolve_model_dir
    from srope.lab.eval.perplexity import default_out, format_table, run_eval

    out = Path(args.out) if args.out is not None else default_out(resolve_model_dir(args.model))
    result = run_eval(
        args.model, args.data, out=out, cache=args.cache, tokenizer=args.tokenizer, val_fraction=args.val_fraction,
        seq_lens=args.seq_len, batch_size=args.batch_size, max_rows=args.max_rows, packing=args.packing,
        bucket_size=args.bucket_size, split=args.split, device=args.device, dtype=args.dtype, show_progress=True, log=print,
    )  # fmt: skip
    print(format_table(result))
    print(f"wrote {out} (results) and {out.with_suffix('.png')} (loss by position)")
    return 0


def run_lm_eval_command(args: argparse.Namespace) -> int:
    from srope.lab.eval.harness import lm_eval_argv, parse_model_args, run_lm_eval

    extra = list(args.lm_eval_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 and float(args.limit).is_integer() else args.limit
    argv = lm_eval_argv(
        args.model, args.tasks, limit=limit, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
        max_length=args.max_length, output_path=args.output_path, num_fewshot=args.num_fewshot,
        include_path=args.include_path, log_samples=args.log_samples, gen_kwargs=args.gen_kwargs, seed=args.seed,
        extra_model_args=parse_model_args(args.model_args), extra=extra,
    )  # fmt: skip
    run_lm_eval(argv)
    return 0
