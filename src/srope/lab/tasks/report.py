"""Plots of one result folder and markdown tables comparing several (``srope synth report``).

The paper gives numbers only for MAD (Table 1, GLA, accuracy in %); MQAR, copying and
state tracking are figures without values, which the tables say. Every row names the commit
that produced it and marks results that are stale or have no provenance. ``srope report``
(:mod:`srope.lab.report`) is the fuller comparison across experiments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from srope.lab import plotting
from srope.lab.report import paper
from srope.lab.report.cells import STALE_NOTE, UNKNOWN_NOTE
from srope.lab.report.records import marks, read_provenance
from srope.lab.tasks.mad import MAD_TASKS

RESULTS_FILE = "results.json"

# Paper Table 1 (identical in v1 and v3): GLA + position encoding on MAD, accuracy in %; the
# one checked-in table of the paper's values is srope.lab.report.paper.
PAPER_MAD_TABLE1 = paper.mad_table1()
NO_PAPER_NUMBERS = {
    "mqar": "The paper shows MQAR only as a figure (Fig. 6, seq 512 / 64 KV pairs, accuracy vs model dimension) without numbers.",
    "copying": "The paper shows copying only as a figure (Fig. 5, accuracy vs length, GLA) without numbers.",
    "state_tracking": "The paper shows state tracking only as a figure (Fig. 7: S2 with 1-layer GLA/Transformer, A3 with 2-layer DeltaNet) without numbers.",
}
MAD_ORDER = ["compression", "fuzzy-in-context-recall", "in-context-recall", "memorization", "noisy-in-context-recall", "selective-copying"]
MAD_SHORT = {"compression": "Compress", "fuzzy-in-context-recall": "Fuzzy Recall", "in-context-recall": "In-Context Recall", "memorization": "Memorize",
             "noisy-in-context-recall": "Noisy Recall", "selective-copying": "Selective Copy"}


def load_results(path: Path | str) -> dict:
    """A result folder's ``results.json``; an unfinished sweep is summarised from its runs so far."""
    from srope.lab.tasks import mad
    from srope.lab.tasks.summary import summarize

    path = Path(path)
    file = path / RESULTS_FILE if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"no {RESULTS_FILE} in {path}")
    try:
        results = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not a srope synth result ({error}); give a result folder or its {RESULTS_FILE}") from None
    if not isinstance(results, dict) or "task" not in results:
        raise ValueError(f"{file}: not a srope synth result (no 'task'); give a result folder or its {RESULTS_FILE}")
    if "summary" not in results and results.get("runs"):
        results["summary"] = summarize(results["runs"])
        if results["task"] == "mad":
            results["aggregate"] = mad.aggregate(results["summary"])
    return results


def paper_mad_row(results: dict) -> str | None:
    """The Table-1 row that matches a MAD run (GLA only), from its position options."""
    if results.get("mixer") != "gla":
        return None
    kind = results.get("position_type")
    if kind == "nope":
        return "NoPE"
    if kind == "rope":
        return "RoPE"
    if kind == "selective_rope":
        opts = results.get("config", {}).get("position", {}).get("selective_rope", {})
        gate, bias = bool(opts.get("gate")), bool(opts.get("bias"))
        return {(False, False): "Selective RoPE", (True, False): "+ phase gate", (False, True): "+ bias", (True, True): "+ phase gate & bias"}[(gate, bias)]
    return None


def _pct(value: float | None, spread: float | None = None) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    text = f"{100 * value:.1f}"
    return text + (f" ± {100 * spread:.1f}" if spread else "")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _status(results: dict) -> str:
    """`` (incomplete)`` for a sweep still running, and the provenance marker: the commit,
    ``†`` when the model code changed after it, ``‡`` when the result records no commit."""
    return ("" if results.get("complete") else " (incomplete)") + f" [{marks(read_provenance(results))}]"


def _seeds_spread(entry: dict, key: str) -> tuple[float | None, float | None]:
    """Mean over seeds of a scalar (for ``score`` the std too)."""
    if key == "score":
        return entry["score_mean"], entry["score_std"] or None
    return entry["scalars"].get(key), None


def _state_tracking(results_list: list[dict]) -> str:
    rows = []
    for res in results_list:
        cfg = res["config"]
        for name, entry in res.get("summary", {}).items():
            train_acc, _ = _seeds_spread(entry, "seq_acc_at_train_len")
            eval_acc, eval_std = _seeds_spread(entry, "score")
            last = entry.get("final_scalars", {})
            rows.append([res["label"] + _status(res), name, _pct(train_acc), _pct(eval_acc, eval_std), _pct(entry["scalars"].get("token_acc")),
                         f"{_pct(last.get('seq_acc_at_train_len'))} / {_pct(last.get('score'))}",
                         f"{entry['lr']:g}", str(len(entry["seeds"])), str(cfg["train_len"]), str(cfg["eval_len"])])
    header = ["model", "group", "seq acc @ train len", "seq acc @ eval len", "token acc", "last eval: @ train len / @ eval len", "lr", "seeds", "train len", "eval len"]
    return _table(header, rows)


def _copying(results_list: list[dict]) -> str:
    rows = []
    for res in results_list:
        for entry in res.get("summary", {}).values():
            curve = entry["curves"].get("str_acc_by_length", {})
            at = dict(zip(curve.get("x", []), curve.get("mean", [])))
            picks = [_pct(at.get(n)) for n in (64, 128, 256, 512)]
            s = entry["scalars"]
            rows.append([res["label"] + _status(res), _pct(s.get("str_acc_train_range")), _pct(s.get("str_acc_extrapolation")),
                         _pct(s.get("char_acc_extrapolation")), *picks, f"{entry['lr']:g}", str(len(entry["seeds"]))])
    header = ["model", "str acc ≤ train len", "str acc > train len", "char acc > train len", "str @64", "str @128", "str @256", "str @512", "lr", "seeds"]
    return _table(header, rows)


def _mqar(results_list: list[dict]) -> str:
    dims = sorted({entry["x"] for res in results_list for entry in res.get("summary", {}).values() if entry["x"] is not None})
    rows = []
    for res in results_list:
        groups: dict[str, dict[float, float]] = {}
        for entry in res.get("summary", {}).values():
            groups.setdefault(entry["group"], {})[entry["x"]] = entry["score_mean"]
        for group, by_dim in sorted(groups.items(), key=lambda kv: int(kv[0].split("-")[0][1:])):
            rows.append([res["label"] + _status(res), group, *[_pct(by_dim.get(d)) for d in dims]])
    return _table(["model", "seq × KV", *[f"d={int(d)}" for d in dims]], rows)


def _scores(results_list: list[dict]) -> str:
    """A registered task without a table of its own: each setting's score."""
    rows = [[res["label"] + _status(res), name, _pct(*_seeds_spread(entry, "score")), f"{entry['lr']:g}", str(len(entry["seeds"]))]
            for res in results_list for name, entry in res.get("summary", {}).items()]
    return _table(["model", "setting", "score", "lr", "seeds"], rows)


def _mad(results_list: list[dict]) -> str:
    rows = []
    for res in results_list:
        agg = res.get("aggregate") or {}
        per_task = agg.get("per_task", {})
        note = "" if agg.get("complete") else f" ({sum(agg.get('settings_per_task', {}).values())}/66 settings)"
        rows.append([res["label"] + _status(res) + note, *[_pct(per_task.get(t)) for t in MAD_ORDER], _pct(agg.get("average"))])
        paper = paper_mad_row(res)
        if paper is not None:
            values = PAPER_MAD_TABLE1[paper]
            rows.append([f"paper: GLA {paper}", *[f"{values[t]:.1f}" for t in MAD_ORDER], f"{values['average']:.1f}"])
    return _table(["model", *[MAD_SHORT[t] for t in MAD_ORDER], "Average"], rows)


def report(dirs: Iterable[Path | str]) -> str:
    """Markdown: one table per task over the result folders ``dirs``, the paper beside ours."""
    loaded = [load_results(d) for d in dirs]
    if not loaded:
        raise ValueError("report needs at least one result folder")
    by_task: dict[str, list[dict]] = {}
    for res in loaded:
        by_task.setdefault(res["task"], []).append(res)
    parts = []
    builders = {"state_tracking": _state_tracking, "copying": _copying, "mqar": _mqar, "mad": _mad}
    titles = {"state_tracking": "State tracking (sequence accuracy, %)", "copying": "Copying (teacher-forced, %)",
              "mqar": "MQAR (accuracy on query positions, %, best lr)", "mad": "MAD (score, %: best over the optimiser grid per setting, mean per task)"}
    for task, results_list in by_task.items():
        parts.append(f"### {titles.get(task, task)}\n\n{builders.get(task, _scores)(results_list)}")
        if task in NO_PAPER_NUMBERS:
            parts.append(NO_PAPER_NUMBERS[task])
        elif task == "mad":
            parts.append("Paper rows: Table 1 (GLA, 66 settings x 6 optimiser points). Our MAD accuracy is torchmetrics' macro average, as MAD's.")
        shown = marks([p for r in results_list for p in read_provenance(r)])
        parts += [note for note, mark in ((STALE_NOTE, "†"), (UNKNOWN_NOTE, "‡")) if mark in shown]
        seconds = sum(r.get("seconds", 0.0) for r in results_list)
        devices = sorted({r.get("device_name") or r.get("device", "?") for r in results_list})
        parts.append(f"Runs: {sum(len(r['runs']) for r in results_list)}, {seconds:.0f} s in total, on {', '.join(devices)}.")
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------
# Plots


def plot_loss_curves(results: dict, path: Path | str) -> Path | None:
    """One PNG of every run's ``loss_curve`` (training loss against step), or None when no
    run recorded one: when each run left its plateau, which one evaluation per epoch hides."""
    runs = [run for run in results.get("runs", []) if run.get("loss_curve")]
    if not runs:
        return None
    plt = plotting.pyplot("srope synth's loss plot (loss.png)")

    fig, ax = plt.subplots(figsize=(7, 4))
    # the default cycle repeats its colours after ten runs, and the legend tells runs apart by colour only
    colors = plt.get_cmap("tab20" if len(runs) > 10 else "tab10").colors
    for index, run in enumerate(runs):
        points = [(step, loss) for step, loss in run["loss_curve"] if loss is not None]  # None: not finite
        label = f"{run['setting']} lr {run['lr']:g} wd {run['weight_decay']:g} seed {run['seed']}"
        ax.plot([step for step, _ in points], [loss for _, loss in points], linewidth=1, label=label,
                color=colors[index % len(colors)])
    every = runs[0]["loss_curve"][0][0]
    ax.set(xlabel="step", ylabel=f"training loss (mean of {every} steps)", title=f"{results['task']}: {results['label']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_results(results: dict, path: Path | str) -> Path:
    """One PNG for a result folder: per-length curves (state tracking, copying), accuracy vs
    model dimension (MQAR) or the per-task scores (MAD)."""
    plt = plotting.pyplot("srope synth's plot (or call run_synthetic(..., plot=False))")

    summary = results.get("summary", {})
    task, label = results["task"], results["label"]
    curve_names = sorted({name for entry in summary.values() for name in entry["curves"]})
    if curve_names:
        fig, axes = plt.subplots(1, len(curve_names), figsize=(5.5 * len(curve_names), 4), squeeze=False)
        for ax, name in zip(axes[0], curve_names):
            for setting, entry in summary.items():
                if name not in entry["curves"]:
                    continue
                c = entry["curves"][name]
                line = ax.plot(c["x"], c["mean"], label=f"{setting} (lr {entry['lr']:g}, {len(entry['seeds'])} seeds)")[0]
                if len(entry["seeds"]) > 1:
                    ax.fill_between(c["x"], c["min"], c["max"], color=line.get_color(), alpha=0.2)
            marker = results["config"].get("train_len", results["config"].get("max_len"))
            if marker:
                ax.axvline(marker, color="gray", linestyle="--", linewidth=1)
            ax.set(xlabel="sequence length", ylabel=name.replace("_by_length", ""), ylim=(-0.02, 1.02), title=f"{task}: {label}")
            ax.legend(fontsize=7)
    elif any(entry["x"] is not None for entry in summary.values()):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        groups: dict[str, list[tuple[float, float]]] = {}
        for entry in summary.values():
            groups.setdefault(entry["group"], []).append((entry["x"], entry["score_mean"]))
        for group, points in sorted(groups.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=group)
        ax.set(xscale="log", xlabel="model dimension", ylabel="accuracy", ylim=(-0.02, 1.02), title=f"{task}: {label}")
        ax.legend(fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        per_task = (results.get("aggregate") or {}).get("per_task") or {e["group"]: e["score_mean"] for e in summary.values()}
        names = [t for t in MAD_TASKS if t in per_task] or sorted(per_task)
        ax.bar(range(len(names)), [per_task[n] for n in names])
        ax.set_xticks(range(len(names)), [MAD_SHORT.get(n, n) for n in names], rotation=20, fontsize=8)
        ax.set(ylabel="score", ylim=(0, 1), title=f"{task}: {label}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
