"""One PNG per experiment: ours drawn with the paper's values where the paper has numbers
(MAD, LM), and the paper's claim written on the panel where it has only a figure."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from srope.lab import plotting
from srope.lab.report import paper
from srope.lab.report.page import Page
from srope.lab.report.page_mqar import PAPER_MQAR, _mqar_points
from srope.lab.report.rows import Row, _by_group

COLORS = {"NoPE": "tab:gray", "RoPE": "tab:blue", "Selective RoPE": "tab:red"}
OTHER_COLORS = ("tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")  # none of COLORS


def _pyplot():
    return plotting.pyplot("srope report's plots")


def _grid(n: int, width: float = 5.2, height: float = 3.8):
    plt = _pyplot()
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[n:]:
        ax.axis("off")
    return plt, fig, flat[:n]


def _title(text: str, width: int = 60, lines: int = 3) -> str:
    wrapped = textwrap.wrap(text, width)
    if len(wrapped) > lines:  # say that the rest (often the overrides that tell panels apart) is cut
        wrapped = [*wrapped[: lines - 1], textwrap.shorten(wrapped[lines - 1] + " " + " ".join(wrapped[lines:]), width, placeholder=" …")]
    return "\n".join(wrapped)


def _claim(ax, exp: paper.Experiment) -> None:
    text = "paper: no numbers (" + exp.source.split(" (")[0] + ")"
    claims = [f"{v.row}: {v.claim}" for v in exp.values if v.claim]
    ax.text(0.02, 0.02, _title("; ".join([text, *claims]), 70), transform=ax.transAxes, fontsize=6, va="bottom", color="dimgray")


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _colors(rows: list[Row]) -> list[str]:
    """One colour per row: the encoding's own for the first plain row of each encoding, a
    palette colour for the others (a second variant of an encoding must not look like the first)."""
    out, others = [], iter(OTHER_COLORS * (1 + len(rows) // len(OTHER_COLORS)))
    for row in rows:
        own = COLORS.get(row.paper_row or "") if "(" not in row.label else None
        out.append(own if own is not None and own not in out else next(others))
    return out


def _earlier(row: Row) -> str:
    """Says when a curve is not of the model a run ended with (``select=best``)."""
    earlier = [(r["step"], r["steps"]) for run in row.runs for r in run.reported if r["step"] is not None and r["step"] != r["steps"]]
    if not earlier:
        return ""
    if len(row.runs) == 1 and len(earlier) == 1:
        return f"; at step {earlier[0][0]:,} of {earlier[0][1]:,}"
    return f"; {len(earlier)} of {len(row.runs)} at an evaluation before their last"


def _curves(ax, group: list[Row], name: str) -> None:
    """Each row's mean over seeds, bold, with every seed's own curve thin beside it: seeds that
    split into learners and non-learners make a mean that no run has, and a band hides which."""
    for row, color in zip(group, _colors(group)):
        curves = [r.curves[name] for r in row.runs if name in r.curves and r.curves[name][0]]
        if not curves:
            continue
        x = list(curves[0][0])
        ys = [list(c[1]) for c in curves if list(c[0]) == x]
        mean = [sum(v) / len(v) for v in zip(*ys)]
        label = f"{row.label} (mean of {_seeds(len(ys))}, thin: each{_earlier(row)})" if len(ys) > 1 else f"{row.label} (1 seed{_earlier(row)})"
        ax.plot(x, mean, label=label, color=color, linewidth=1.4)
        if len(ys) > 1:
            for y in ys:
                ax.plot(x, y, color=color, linewidth=0.6, alpha=0.45)
    if group[0].train_len:
        ax.axvline(group[0].train_len, color="gray", linestyle="--", linewidth=1)
    ax.set_ylim(-0.02, 1.02)
    if ax.get_legend_handles_labels()[0]:  # a panel whose rows have no curve of this name has no legend
        ax.legend(fontsize=6, loc="best")  # accuracy curves start at 1 on the left and often end at 0 on the right


def plot_page(page: Page, path: Path) -> Path | None:
    """The page's PNG at ``path``; None when it has nothing to draw."""
    makers = {"copying": _copying, "mqar": _mqar, "state_tracking": _state_tracking, "mad": _mad, "lm": _lm}
    rows = [r for r in page.rows if r.experiment in paper.EXPERIMENTS]
    if not rows:
        return None
    fig = makers[page.name](rows)
    if fig is None:
        return None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _copying(rows: list[Row]):
    """String and character accuracy per group, on a log length axis: what matters happens
    just past the training lengths, which a linear axis to 512 squeezes into a few pixels."""
    groups = list(_by_group(rows).values())
    plt, fig, axes = _grid(2 * len(groups))
    for i, group in enumerate(groups):
        for ax, (name, label) in zip(axes[2 * i : 2 * i + 2], (("str_acc_by_length", "string"), ("char_acc_by_length", "character"))):
            _curves(ax, group, name)
            ax.set_xscale("log", base=2)
            ax.set(xlabel="string length", ylabel=f"{label} accuracy", title=_title(group[0].title))
        _claim(axes[2 * i], paper.COPYING)
    return fig


def _mqar(rows: list[Row]):
    """Per protocol: accuracy against width at the paper's setting (where run), and the test
    accuracy after each epoch of every run, which shows whether a run ever left chance."""
    panels = []
    for group in _by_group(rows).values():
        if any(PAPER_MQAR in _mqar_points(r) for r in group):
            panels.append((_mqar_widths, group))
        if any(r.histories for row in group for r in row.runs):
            panels.append((_mqar_training, group))
    if not panels:
        return None
    plt, fig, axes = _grid(len(panels))
    for ax, (draw, group) in zip(axes, panels):
        draw(ax, group)
    return fig


def _mqar_widths(ax, group: list[Row]) -> None:
    for row, color in zip(group, _colors(group)):
        points = _mqar_points(row).get(PAPER_MQAR, {})
        widths = sorted(points)
        ax.errorbar(widths, [points[w][0] for w in widths], yerr=[points[w][1] or 0.0 for w in widths], marker="o", capsize=3,
                    label=f"{row.label} ({_seeds(len(row.runs))})", color=color)
    ax.set(xscale="log", xlabel="model dimension", ylabel="accuracy", ylim=(-0.02, 1.02), title=_title(f"seq 512, 64 KV pairs: {group[0].title}"))
    ax.legend(fontsize=6)
    _claim(ax, paper.MQAR)


def _mqar_training(ax, group: list[Row]) -> None:
    styles = ("-", "--", ":", "-.")
    settings = sorted({s for row in group for r in row.runs for s in r.histories}, key=lambda s: (len(s), s))
    for row, color in zip(group, _colors(group)):
        for run in row.runs:
            first = run is row.runs[0]  # one legend entry per row and setting
            for setting, (steps, scores) in sorted(run.histories.items()):
                ax.plot(steps, scores, color=color, linestyle=styles[settings.index(setting) % len(styles)], linewidth=1.2,
                        label=f"{row.label} {setting} ({_seeds(len(row.runs))})" if first else None)
    vocab = group[0].runs[0].config.get("vocab")
    if vocab:  # a guess among the values, each of which is one of vocab/2 tokens
        ax.axhline(2 / vocab, color="black", linewidth=0.8, linestyle=":", label="chance")
    ax.set(xlabel="training step", ylabel="query accuracy (test, after each epoch)", ylim=(-0.02, 1.02), title=_title(f"training: {group[0].title}", 50, lines=4))
    ax.legend(fontsize=6)


def _state_tracking(rows: list[Row]):
    panels = [(exp, group) for exp in paper.STATE_TRACKING for group in _by_group([r for r in rows if r.experiment == exp.key]).values()]
    if not panels:
        return None
    plt, fig, axes = _grid(len(panels))
    for ax, (exp, group) in zip(axes, panels):
        _curves(ax, group, "seq_acc_by_length")
        ax.set(xlabel="sequence length", ylabel="sequence accuracy", title=_title(f"{exp.title.split(': ', 1)[1]}: {group[0].title}", 70))
        ax.title.set_fontsize(7)
        _claim(ax, exp)
    return fig


def _mad(rows: list[Row]):
    groups = list(_by_group(rows).values())
    plt, fig, axes = _grid(len(groups), width=9.0, height=4.0)
    columns = [*paper.MAD_TASK_ORDER, "average"]
    for ax, group in zip(axes, groups):
        width = 0.8 / max(1, len(group))
        for i, (row, color) in enumerate(zip(group, _colors(group))):
            xs = [j + (i - (len(group) - 1) / 2) * width for j in range(len(columns))]
            ours = [100 * (row.mean(c) if row.mean(c) is not None else float("nan")) for c in columns]
            ax.bar(xs, ours, width=width, label=f"{row.label} (ours)", color=color, alpha=0.8)
            if row.paper_row:
                theirs = [paper.MAD.value(row.paper_row, c).value for c in columns]
                ax.scatter(xs, theirs, marker="_", s=120, color="black", zorder=3, label="paper (Table 1)" if i == 0 else None)
        ax.set_xticks(range(len(columns)), [paper.MAD_SHORT[c] for c in columns], rotation=15, fontsize=7)
        ax.set(ylabel="accuracy, %", ylim=(0, 105), title=_title(group[0].title, 100))
        ax.legend(fontsize=6, ncol=2)
    return fig


def _lm(rows: list[Row]):
    groups = [g for g in _by_group(rows).values() if any(r.stat("val_ppl") for r in g)]
    if not groups:
        return None
    plt, fig, axes = _grid(len(groups) + 1, width=6.0)
    for ax, group in zip(axes, groups):
        shown = [r for r in group if r.stat("val_ppl")]
        stats = [r.stat("val_ppl") for r in shown]
        ax.bar(range(len(shown)), [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats], capsize=3, color=_colors(shown))
        ax.set_xticks(range(len(shown)), [textwrap.fill(r.label, 16) for r in shown], fontsize=6)
        low = min(s[0] for s in stats)
        ax.set(ylabel="held-out perplexity (ours)", ylim=(0.9 * low, 1.05 * max(s[0] for s in stats)), title=_title(group[0].title))
    ax = axes[-1]
    exp = paper.LM_TABLE2
    names = exp.rows()
    values = [exp.value(n, "avg_ppl").value for n in names]
    ax.bar(range(len(names)), values, color=[COLORS.get(n, "tab:red") for n in names])
    ax.set_xticks(range(len(names)), [textwrap.fill(n, 14) for n in names], fontsize=6)
    ax.set(ylabel="Avg-PPL (Wikitext, LAMBADA)", ylim=(0.95 * min(values), 1.02 * max(values)), title="paper: v3 Table 2, GLA 370M, 10B FineWeb tokens")
    return fig
