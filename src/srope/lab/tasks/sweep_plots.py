"""The plots ``srope synth`` writes into its result folder: every run's training loss
(``loss.png``) and the results (``results.png``: per-length curves, accuracy against model
dimension, or MAD's per-task scores). Comparing folders is ``srope report``'s."""

from __future__ import annotations

from pathlib import Path

from srope.lab import plotting
from srope.lab.report.paper import MAD_SHORT
from srope.lab.tasks.mad import MAD_TASKS


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
