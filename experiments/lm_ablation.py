"""The LM proxy with seeds and the Table 2 ablation, several runs at once on one GPU.

    python experiments/lm_ablation.py --data .data/shakespeare --out out/lm-ablation --jobs 7

Every arm (a position encoding and its options, see ARMS) goes through the same protocol:

1. ``srope sweep-lr`` on the selection seed (0): one run per learning rate of ``--lrs``; the
   trainer scores each on the store's ``val`` split and the sweep keeps the lowest.
2. ``srope train`` at that learning rate for each of ``--seeds`` (1-4).
3. ``srope eval`` of each seed's model on the ``test`` split, which no choice has seen.

``srope report OUT`` then tabulates test perplexity as mean ± sd over the seeds beside the
paper's Table 2. The runs are plain CLI calls, so every folder carries the usual provenance
(``run.json``, ``sweep.json``, eval JSON). Finished steps are skipped when the command is
repeated with the same arguments, and ``--deadline`` stops starting new work after that many
seconds, so a fixed-length GPU call ends with its results written. A run saves one checkpoint,
at its end, and loses it once it is evaluated (``--keep-checkpoints`` keeps them): at
gla-370m each is 1.4 GB, and the whole ablation's would fill a 64 GB disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# name -> srope train arguments. "selective_rope" is the module's default (SiLU and phase gate
# on): Table 2's last row. Decay off: GLA's log decay logsigmoid(.)/normaliser is ~1e-6, so the
# forget gate is about 1 everywhere and the state only accumulates.
DECAY_OFF = ["--set", "model.gate_logit_normalizer=1e6"]
ARMS = {
    "nope": ["--position", "nope"],
    "rope": ["--position", "rope"],
    "selective_rope": ["--position", "selective_rope"],
    "srope_baseline": ["--position", "selective_rope", "--set", "position.conv_activation=none", "--set", "position.gate=none"],
    "srope_silu": ["--position", "selective_rope", "--set", "position.gate=none"],
    "nope_decay_off": ["--position", "nope", *DECAY_OFF],
    "selective_rope_decay_off": ["--position", "selective_rope", *DECAY_OFF],
}


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


class Plan:
    """Runs the arms' chains (sweep -> seeds -> evals) on a pool of ``jobs`` processes."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.pool = ThreadPoolExecutor(max_workers=args.jobs)
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.pending = 0
        self.done = threading.Event()
        self.log: list[dict] = []

    def common(self) -> list[str]:
        a = self.args
        overrides = a.overrides
        if not any(kv.startswith("checkpoint_every=") for kv in overrides):
            overrides = [*overrides, f"checkpoint_every={a.steps}"]
        extra = [item for kv in overrides for item in ("--set", kv)]
        return ["--preset", a.preset, "--data", a.data, "--max-steps", str(a.steps), *extra]

    def drop_checkpoints(self, *runs: Path) -> None:
        if self.args.keep_checkpoints or self.args.dry_run:
            return
        for run in runs:
            shutil.rmtree(run / "checkpoints", ignore_errors=True)

    def submit(self, name: str, command: list[str], then=None, timed: bool = True) -> None:
        """``timed``: not started past the deadline (evaluations, a few seconds each, always are)."""
        with self.lock:
            self.pending += 1
        self.pool.submit(self._run, name, command, then, timed)

    def _run(self, name: str, command: list[str], then, timed: bool) -> None:
        try:
            late = timed and time.monotonic() - self.start > self.args.deadline
            status = "skipped: past the deadline" if late else self._call(name, command)
            self.log.append({"name": name, "command": command, "status": status})
            with self.lock:
                print(f"[{time.monotonic() - self.start:6.0f} s] {name}: {status}", flush=True)
            if status == "ok" and then is not None:
                then()
        finally:
            with self.lock:
                self.pending -= 1
                if self.pending == 0:
                    self.done.set()

    def _call(self, name: str, command: list[str]) -> str:
        if self.args.dry_run:
            with self.lock:
                print(" ".join(command), flush=True)
            return "ok"
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "w") as handle:
            code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "2"})
        return "ok" if code == 0 else f"exit {code} (see logs/{name}.log)"

    def arm(self, arm: str) -> None:
        sweep = self.out / arm / "sweep"
        command = [*SROPE, "sweep-lr", *self.common(), *ARMS[arm], "--lrs", self.args.lrs, "--set", f"seed={self.args.select_seed}",
                   "--out", str(sweep)]
        if sweep_done(sweep, self.args.lrs):
            command = ["true"]  # its runs' model folders may be gone (results packed without weights)
        self.submit(f"{arm}-sweep", command, lambda: self.seeds(arm, sweep))

    def seeds(self, arm: str, sweep: Path) -> None:
        self.drop_checkpoints(*sweep.glob("lr_*"))
        lr = 1e-3 if self.args.dry_run else chosen_lr(sweep)
        for seed in self.args.seeds:
            run = self.out / arm / f"seed{seed}"
            command = [*SROPE, "train", *self.common(), *ARMS[arm], "--set", f"lr={lr:g}", "--set", f"seed={seed}", "--out", str(run)]
            if (run / "model").is_dir():
                command = ["true"]
            self.submit(f"{arm}-seed{seed}", command, lambda run=run, seed=seed: self.evaluate(arm, run, seed))

    def evaluate(self, arm: str, run: Path, seed: int) -> None:
        target = run / "eval-test.json"
        command = [*SROPE, "eval", "--model", str(run), "--split", "test", "--out", str(target)]
        if target.is_file():
            command = ["true"]
        self.submit(f"{arm}-seed{seed}-eval", command, lambda: self.drop_checkpoints(run), timed=False)

    def run(self) -> int:
        for arm in self.args.arms:
            self.arm(arm)
        self.done.wait()
        self.pool.shutdown()
        failed = [entry for entry in self.log if entry["status"] != "ok"]
        summary = {"arguments": vars(self.args), "seconds": round(time.monotonic() - self.start, 1), "steps": self.log}
        if not self.args.dry_run:
            (self.out / "ablation.json").write_text(json.dumps(summary, indent=1))
        print(f"{len(self.log) - len(failed)} of {len(self.log)} steps ok in {summary['seconds']:.0f} s" + (f"; not ok: {[e['name'] for e in failed]}" if failed else ""))
        return 1 if failed else 0


SROPE = [sys.executable, "-m", "srope"]


def sweep_done(sweep: Path, lrs: str) -> bool:
    """Whether ``sweep/sweep.json`` records every learning rate of ``lrs`` and a choice."""
    path = sweep / "sweep.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    recorded = {float(run["lr"]) for run in data.get("runs", [])}
    return bool(data.get("chosen")) and {float(lr) for lr in lrs.split(",")} <= recorded


def chosen_lr(sweep: Path) -> float:
    data = json.loads((sweep / "sweep.json").read_text())
    chosen = data.get("chosen")
    if not chosen:
        raise RuntimeError(f"{sweep}/sweep.json chose no learning rate (every run diverged?)")
    return float(chosen["lr"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="corpus or prepared token store (its val split chooses, its test split reports)")
    parser.add_argument("--out", required=True, help="result folder: OUT/ARM/{sweep,seedN}")
    parser.add_argument("--preset", default="gla-370m")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lrs", default="5e-4,1e-3,2e-3", help="learning rates of the selection sweep (default: the lower half of the paper's grid)")
    parser.add_argument("--select-seed", type=int, default=0)
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-4"), help="seeds reported, e.g. 1-4")
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--set", dest="overrides", action="append", default=["model.num_hidden_layers=4", "seq_len=512", "global_batch_size=32"],
                        metavar="KEY=VALUE", help="srope train override for every run (default: 4 layers, context 512, batch 32)")
    parser.add_argument("--jobs", type=int, default=4, help="processes at once")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="start no new training run after this many seconds (evaluations still run)")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep each finished run's checkpoint (default: delete it once the run is evaluated)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands in order, run nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return Plan(args).run()


if __name__ == "__main__":
    sys.exit(main())
