"""Whether repeats of one srope synth sweep came out bitwise equal.

    python experiments/compare_repeats.py out/repeat/1/results.json out/repeat/2/results.json

For each run (setting, learning rate, weight decay, seed) it prints every repeat's steps,
weights' sha256 and training loss per evaluation, then whether the weights are equal and the
largest difference of the losses (a run in one repeat only is listed, not compared). Prints
"all repeats bitwise equal" or "repeats differ" at the end; the exit status is 0 either way (a
difference is a finding, not a failure) and 2 for unreadable input or nothing to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    try:
        results = json.loads(path.read_text())
        results["runs"]  # noqa: B018 - a results.json of srope synth has its runs
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a srope synth results.json ({type(error).__name__}: {error})") from None
    return results


def run_key(run: dict) -> tuple:
    return run["setting"], run["lr"], run["weight_decay"], run["seed"]


def losses(run: dict) -> list:
    return [entry.get("train_loss") for entry in run.get("history", [])]


def compare(results: list[dict]) -> tuple[list[str], bool]:
    """The report's lines and whether every run is bitwise equal in every repeat."""
    if len(results) < 2:
        raise ValueError(f"need at least two repeats to compare, got {len(results)}")
    keyed = [{run_key(run): run for run in r["runs"]} for r in results]
    keys = list(dict.fromkeys(key for runs in keyed for key in runs))
    lines, equal, compared = [], True, 0
    for key in keys:
        setting, lr, wd, seed = key
        lines.append(f"{setting} lr={lr:g} wd={wd:g} seed={seed}")
        runs = [runs.get(key) for runs in keyed]
        for i, run in enumerate(runs, 1):
            if run is None:
                lines.append(f"  repeat {i}: not in this repeat")
            else:
                shown = ", ".join("-" if x is None else f"{x:.6f}" for x in losses(run))
                lines.append(f"  repeat {i}: {run['steps']} steps, weights {run['weights_sha256'][:16]}, train loss {shown}")
        present = [run for run in runs if run is not None]
        if len(present) < 2:
            lines.append("  in one repeat only: nothing to compare")
            continue
        compared += 1
        same = len({run["weights_sha256"] for run in present}) == 1 and len({run["steps"] for run in present}) == 1
        pairs = [(a, b) for run in present[1:] for a, b in zip(losses(present[0]), losses(run)) if a is not None and b is not None]
        gap = max((abs(a - b) for a, b in pairs), default=0.0)
        lines.append(f"  weights {'equal' if same else 'differ'}; largest training-loss difference {gap:.3g}")
        equal &= same
    if not compared:
        raise ValueError("no run is in two repeats: nothing to compare")
    lines.append(f"all repeats bitwise equal ({compared} run(s) compared)" if equal else f"repeats differ ({compared} run(s) compared)")
    return lines, equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json of each repeat")
    args = parser.parse_args(argv)
    try:
        lines, _ = compare([load(path) for path in args.results])
    except ValueError as error:
        print(f"compare_repeats: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
