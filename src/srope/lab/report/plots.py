"""One PNG per experiment: ours drawn with the paper's values where the paper has numbers
(MAD, LM), and the paper's claim written on the panel where it has only a figure. A synthetic
task's figure is drawn by its page's module (``report_plot``, found through the task registry)
with the helpers here; the LM figure is drawn here."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from srope.lab import plotting
from srope.lab.report import paper
from srope.lab.report.page import Page
from srope.lab.report.rows import Row, _by_group
from srope.lab.tasks.registry import tasks

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
    rows = [r for r in page.rows if r.experiment in paper.EXPERIMENTS]
    draw = _lm if page.name == "lm" else _task_plot(page.name)
    if not rows or draw is None:
        return None
    fig = draw(rows)
    if fig is None:
        return None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _task_plot(name: str):
    """The figure maker of task ``name``'s page (the task registry names its module), or None."""
    module = tasks[name].report_module() if name in tasks else None
    return getattr(module, "report_plot", None)


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
