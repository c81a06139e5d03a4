"""``srope report``: the argument parser and its handler, for ``srope.lab.cli`` to mount.

    srope report DIR [DIR ...] [--out FOLDER] [--no-plots] [--by-folder]

Building the parser imports only argparse; the handler imports the report when it runs.
"""

from __future__ import annotations

import argparse

DEFAULT_OUT = "out/report"


def add_report_arguments(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``report`` command to ``srope``'s subcommands; its handler is ``args.func``."""
    report = commands.add_parser(
        "report",
        help="the paper's numbers beside ours: one markdown table and plot per experiment, with verdicts",
        description="Read result folders (srope synth, srope train / sweep-lr, srope eval, lm-eval, srope demo; searched recursively, "
        "at most 8 folders deep, hidden and system folders skipped; a folder without results is an error) and "
        "write FOLDER/index.md plus one <experiment>.md and .png per experiment: ours (mean ± sd over seeds) beside the paper's value, "
        "protocol differences, budget as a share of the paper's, provenance (stale and unknown marked) and a verdict per protocol. "
        "MQAR's plot also draws every run's test accuracy after each epoch against its steps, with chance.",
    )
    report.add_argument("dirs", nargs="+", metavar="DIR", help="result folders or files")
    report.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    report.add_argument("--no-plots", action="store_true", help="write the markdown only")
    report.add_argument("--by-folder", action="store_true",
                        help="also a table per task with one row per srope synth result folder (its best lr, seeds, lengths; MAD beside Table 1's rows)")
    report.set_defaults(func=run_report_command)
    return report


def run_report_command(args: argparse.Namespace) -> int:
    from srope.lab.report.write import write_report

    written = write_report(args.dirs, args.out, plots=not args.no_plots, by_folder=args.by_folder)
    for page, verdicts in written["verdicts"].items():
        for panel, group, status, _ in verdicts:
            print(f"{page}{' / ' + panel if panel else ''}{' / ' + group if group else ''}: {status}")
    print(f"wrote {written['index']} ({len(written['pages'])} pages, {len(written['plots'])} plots)")
    return 0
