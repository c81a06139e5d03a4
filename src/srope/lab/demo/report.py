"""What the demo prints and draws: the results table, the across-seeds table and their plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from srope.lab import plotting
from srope.lab.demo.config import LABELS, POSITIONS

PLOT_PURPOSE = "srope demo's plots (parity.png, seeds.png)"


def format_seed_table(summary: dict) -> str:
    """The printed table of :func:`run_demo_seeds`."""
    train, evl = summary["train_len"], summary["eval_len"]
    lines = [f"Parity across seeds ({summary['preset']} preset, {summary['device']}): seq_acc @{train} / @{evl}",
             f"{'seed':>6}  " + "  ".join(f"{LABELS[kind]:>16}" for kind in POSITIONS) + "  meets targets"]
    for seed, entry in summary["per_seed"].items():
        cells = "  ".join(f"{entry['seq_acc'][kind]['train']:>7.3f} / {entry['seq_acc'][kind]['eval']:.3f}" for kind in POSITIONS)
        lines.append(f"{seed:>6}  {cells}  {'yes' if entry['meets_all'] else 'no'}")
    lines.append(f"{summary['meets_all']} of {len(summary['seeds'])} seeds meet every target; Selective RoPE learns parity at "
                 f"{train} on {summary['selective_rope_learns']}; {summary['seconds']:.0f} s in all.")
    return "\n".join(lines)


def plot_seeds(runs: dict[int, dict], path: Path) -> None:
    """Sequence accuracy against length for every seed: Selective RoPE solid, NoPE and RoPE faint."""
    plt = plotting.pyplot(PLOT_PURPOSE)

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"nope": "tab:gray", "rope": "tab:orange", "selective_rope": "tab:blue"}
    for seed, results in runs.items():
        for kind in POSITIONS:
            curve = results["results"][kind]["curve"]
            own = kind == "selective_rope"
            ax.plot(curve["length"], curve["seq_acc"], color=colors[kind], alpha=0.9 if own else 0.35, linewidth=1.5 if own else 1,
                    label=LABELS[kind] if seed == next(iter(runs)) else None)
    first = next(iter(runs.values()))
    ax.axvline(first["train_len"], color="gray", linestyle="--", linewidth=1, label=f"training length {first['train_len']}")
    ax.set(xlabel="sequence length", ylabel="sequence accuracy (fresh sequences)", ylim=(-0.02, 1.02), xlim=(1, first["eval_len"]),
           title=f"Parity, seeds {', '.join(str(s) for s in runs)} ({first['preset']} preset, {first['device']})")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(results: dict) -> str:
    """The printed summary table."""
    train, evl = results["train_len"], results["eval_len"]
    lines = [
        f"Parity (S2 word problem), 1-layer GLA, trained up to length {train}, {results['device']}, seed {results['seed']}, "
        f"{results['seconds']:.0f} s wall, {results['cpu_seconds']:.0f} s CPU",
        f"{'position encoding':<18} {'params':>7} {'seq_acc@' + str(train):>12} {'seq_acc@' + str(evl):>12} {'token_acc@' + str(evl):>14} {'final loss':>10}",
    ]
    for kind in POSITIONS:
        run = results["results"][kind]
        lines.append(
            f"{LABELS[kind]:<18} {run['parameters']:>7} {run['seq_acc']['train']:>12.3f} {run['seq_acc']['eval']:>12.3f} "
            f"{run['token_acc']['eval']:>14.3f} {run['final_loss']:>10.4f}"
        )
    angles = results["results"]["selective_rope"].get("parity_angles")
    if angles:
        lines.append(
            f"Selective RoPE's parity pair ({angles['pair']}): step per '1' π{angles['error_per_one']:+.4f} rad, per '0' "
            f"{angles['error_per_zero']:+.4f} rad; drift over {evl} uniform bits {angles['drift_at_eval_len']:+.2f} rad."
        )
    lines.append("seq_acc: fraction of fresh sequences with every position right.")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Sequence accuracy against length per encoding (training length dashed), and the training loss."""
    plt = plotting.pyplot(PLOT_PURPOSE)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in POSITIONS:
        run = results["results"][kind]
        left.plot(run["curve"]["length"], run["curve"]["seq_acc"], label=LABELS[kind])
        loss = np.asarray(run["loss"])
        window = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
        right.plot(np.arange(window, len(loss) + 1), smooth, label=LABELS[kind])
    left.axvline(results["train_len"], color="gray", linestyle="--", linewidth=1, label=f"training length {results['train_len']}")
    left.set(xlabel="sequence length", ylabel="sequence accuracy (fresh sequences)", ylim=(-0.02, 1.02), xlim=(1, results["eval_len"]),
             title="Parity: accuracy vs length")
    left.legend(loc="center right")
    right.set(xlabel="training step", ylabel="training loss (tagging cross-entropy)", yscale="log", title="Training loss")
    right.legend()
    fig.suptitle(f"1-layer GLA on parity ({results['preset']} preset, seed {results['seed']}, {results['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
