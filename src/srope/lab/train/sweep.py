"""``srope sweep-lr``: the paper's learning-rate grid for one configuration, chosen by held-out perplexity.

Each learning rate is one :func:`srope.lab.train.trainer.train` run into ``OUT/lr_<value>/``
(``<value>`` is ``f"{lr:g}"``: ``lr_0.0005``, ``lr_0.001``, ...), with the same seed, data
order and initial weights; only the peak learning rate differs. The runs are selected by the
validation perplexity the trainer measures at the end of the run (``eval_rows`` rows of the
held-out split; the paper used 4M held-out tokens: set ``--set eval_rows=...``), the lowest
wins (ties: the smaller learning rate).

A run whose loss or gradient norm becomes non-finite (the trainer's NaN guard raises
``FloatingPointError``) is recorded as ``diverged`` in ``OUT/lr_<value>/diverged.json`` and
the sweep goes on; so is a run whose final validation perplexity is not finite.

Resuming: calling the sweep again with the same arguments skips finished and diverged runs,
continues a run that has checkpoints but no final model (``train(..., resume=True)``), and
starts the missing ones. A run folder made with other settings is an error, not reused.

Writes ``OUT/sweep.json`` (the base configuration, every run, the chosen learning rate) after
every run (``chosen_at_grid_edge`` flags a winner at the smallest or largest learning rate:
the optimum may then lie outside the grid) and ``OUT/sweep.png`` (validation perplexity against the learning rate, log x).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from srope.lab.train.checkpoint import latest_checkpoint
from srope.lab.train.resume import resolve_recorded_paths
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import train

PAPER_LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # Table 5 of the paper
# Settings that do not change what a run computes: a run may be resumed with other values.
_NOT_COMPARED = {"device", "compile", "tensorboard", "log_every", "checkpoint_every", "eval_every"}


def run_dir_name(lr: float) -> str:
    return f"lr_{lr:g}"


def parse_lrs(text: str) -> list[float]:
    """``"5e-4,1e-3"`` into ``[0.0005, 0.001]``; each must be a positive finite number, no repeats."""
    try:
        lrs = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ValueError(f"--lrs takes comma-separated numbers, e.g. 5e-4,1e-3; got {text!r}") from err
    return check_lrs(lrs)


def check_lrs(lrs) -> list[float]:
    if isinstance(lrs, (str, bytes)) or not hasattr(lrs, "__iter__"):
        raise TypeError(f"lrs must be a sequence of numbers, got {type(lrs).__name__}")
    lrs = list(lrs)
    if not lrs:
        raise ValueError("lrs must hold at least one learning rate")
    for lr in lrs:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"every learning rate must be a positive finite number, got {lr!r}")
    names = [run_dir_name(lr) for lr in lrs]
    if len(set(names)) != len(names):
        raise ValueError(f"learning rates must be distinct (as run folders {names})")
    return [float(lr) for lr in lrs]


def _check_same_settings(folder: Path, config: TrainConfig) -> None:
    file = folder / "train_config.json"
    if not file.is_file():
        return
    wanted = config.to_dict()
    saved = resolve_recorded_paths(json.loads(file.read_text()), wanted)
    differ = sorted(k for k in set(saved) | set(wanted) if k not in _NOT_COMPARED and saved.get(k) != wanted.get(k))
    if differ:
        details = ", ".join(f"{k}: {saved.get(k)!r} there, {wanted.get(k)!r} now" for k in differ)
        raise ValueError(f"{folder} holds a run with other settings ({details}); use another --out or the same settings")


def _final_metrics(folder: Path, max_steps: int) -> dict | None:
    """The last ``metrics.jsonl`` record of a finished run (``model/`` written, ``val_loss`` at ``max_steps``)."""
    metrics = folder / "metrics.jsonl"
    if not (folder / "model" / "config.json").is_file() or not metrics.is_file():
        return None
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    last = json.loads(lines[-1]) if lines else {}
    return last if last.get("step") == max_steps and "val_loss" in last else None


def _record(lr: float, folder: Path, status: str, metrics: dict | None = None, error: str | None = None) -> dict:
    record = {"lr": lr, "dir": folder.name, "status": status, "val_loss": None, "val_ppl": None, "final_loss": None, "error": error}
    if metrics:
        record |= {"val_loss": metrics.get("val_loss"), "val_ppl": metrics.get("val_ppl"), "final_loss": metrics.get("loss")}
    return record


def run_one(config: TrainConfig, folder: Path) -> dict:
    """Train (or resume, or skip) one learning rate; never raises for divergence.

    The record's ``source`` says where its numbers come from: ``trained`` (this call, from
    scratch), ``resumed`` (this call, from the run's latest checkpoint) or ``earlier`` (a
    finished or diverged run found on disk, not run again).
    """
    diverged = folder / "diverged.json"
    _check_same_settings(folder, config)
    if diverged.is_file():
        return json.loads(diverged.read_text()) | {"source": "earlier"}
    metrics = _final_metrics(folder, config.max_steps)
    source = "earlier"
    if metrics is None:
        source = "resumed" if latest_checkpoint(folder) is not None else "trained"
        started = (folder / "train_config.json").is_file()  # a run cut off before its first checkpoint starts again
        try:
            metrics = train(config, folder, resume=source == "resumed" or started)
        except FloatingPointError as err:
            return _diverged(_record(config.lr, folder, "diverged", error=str(err)), diverged, source)
    ppl = metrics.get("val_ppl")
    if ppl is None or not math.isfinite(ppl):
        return _diverged(_record(config.lr, folder, "diverged", metrics, error=f"non-finite validation perplexity {ppl}"), diverged, source)
    return _record(config.lr, folder, "ok", metrics) | {"source": source}


def _diverged(record: dict, marker: Path, source: str) -> dict:
    marker.write_text(json.dumps(record, indent=2))
    return record | {"source": source}


def choose(runs: list[dict]) -> dict | None:
    """The finished run with the lowest validation perplexity (ties: the smaller lr), or None."""
    finished = [r for r in runs if r["status"] == "ok"]
    return min(finished, key=lambda r: (r["val_loss"], r["lr"])) if finished else None


def sweep_lr(config: TrainConfig, out: str | os.PathLike, lrs=PAPER_LRS, *, plot: bool = True) -> dict:
    """Run ``config`` once per learning rate into ``out/lr_<value>/``; return (and write) the summary."""
    lrs = check_lrs(lrs)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    base = config.resolved()
    if plot:
        from srope.lab import plotting

        plotting.require(SWEEP_PLOT)  # before the runs, not after
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"base_config": {k: v for k, v in base.to_dict().items() if k != "lr"}, "lrs": lrs, "selection": "lowest final val_ppl", "runs": [], "chosen": None, "chosen_at_grid_edge": False}
    for lr in lrs:
        record = run_one(dataclasses.replace(base, lr=lr), out / run_dir_name(lr))
        summary["runs"].append(record)
        summary["chosen"] = choose(summary["runs"])
        summary["chosen_at_grid_edge"] = summary["chosen"] is not None and summary["chosen"]["lr"] in (min(lrs), max(lrs)) and len(lrs) > 1
        (out / "sweep.json").write_text(json.dumps(summary, indent=2))
    if plot:
        plot_sweep(summary, out / "sweep.png")
    return summary


SWEEP_PLOT = "srope sweep-lr's plot (sweep.png)"


def plot_sweep(summary: dict, path: str | os.PathLike) -> None:
    """Validation perplexity against the learning rate (log x); diverged runs as red crosses on the top edge."""
    from srope.lab import plotting

    figure = plotting.figure(SWEEP_PLOT, figsize=(6, 4))
    axes = figure.add_subplot()
    ok = sorted((r["lr"], r["val_ppl"]) for r in summary["runs"] if r["status"] == "ok")
    if ok:
        axes.plot([lr for lr, _ in ok], [p for _, p in ok], marker="o", label="finished")
    bad = [r["lr"] for r in summary["runs"] if r["status"] != "ok"]
    if bad:
        top = max((p for _, p in ok), default=1.0) * 1.1
        axes.scatter(bad, [top] * len(bad), marker="x", color="red", label="diverged")
    chosen = summary.get("chosen")
    if chosen:
        axes.scatter([chosen["lr"]], [chosen["val_ppl"]], s=120, facecolors="none", edgecolors="green", label=f"chosen lr {chosen['lr']:g}")
    axes.set_xscale("log")
    if ok:
        axes.set_yscale("log")
    axes.set_xlabel("peak learning rate")
    axes.set_ylabel("validation perplexity (end of run)")
    base = summary["base_config"]
    axes.set_title(f"{base['preset']} · {base['position'] if isinstance(base['position'], str) else base['position'].get('type')} · {base['max_steps']} steps", fontsize=9)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=120)


def format_table(summary: dict) -> str:
    chosen = summary.get("chosen") or {}
    lines = [f"{'lr':>10} {'status':>9} {'val_loss':>9} {'val_ppl':>10}"]
    for r in summary["runs"]:
        mark = "  <- chosen" if r["lr"] == chosen.get("lr") else ""
        values = f"{r['val_loss']:>9.4f} {r['val_ppl']:>10.3f}" if r["status"] == "ok" else f"{'-':>9} {'-':>10}"
        lines.append(f"{r['lr']:>10g} {r['status']:>9} {values}{mark}")
    if summary.get("chosen_at_grid_edge"):
        lines.append("note: the chosen learning rate is at the edge of the grid; the best one may lie outside it")
    return "\n".join(lines)
