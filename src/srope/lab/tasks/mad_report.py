"""The MAD page (Table 1): the protocol score per task beside the paper's, and its verdict."""

from __future__ import annotations

import math
import statistics

from srope.lab.report import paper
from srope.lab.report.cells import _footnotes, _label_cell, _table, budget_cell, differences, fmt, provenance_cell, seeds_cell
from srope.lab.report.collect_synth import SweepRecords
from srope.lab.report.folders import pct, status
from srope.lab.report.page import Page, _no_counterpart, _opening
from srope.lab.report.plots import _colors, _grid, _title
from srope.lab.report.rows import Row, _by_group, _folders
from srope.lab.report.verdicts import Verdict, _beats, _caveats

RULE = (
    "Numbers are comparable only over all 66 settings (the paper averages them). Ordering: reproduced when every Selective RoPE variant's average "
    "beats NoPE's and the best Selective RoPE variant is not beaten by RoPE (v3's text: improves over NoPE, matches or improves upon RoPE); "
    "with fewer settings the ordering is checked on the settings every variant ran and the verdict is \"not comparable\" with that ordering stated."
)


def report_page(rows: list[Row]) -> Page:
    exp = paper.MAD
    mine, parts = _opening("mad", "MAD", exp, rows, RULE)
    columns = [*paper.MAD_TASK_ORDER, "average"]
    parts += ["Cells: ours (mean ± sd over seeds of the protocol score, %) and the paper's Table 1 value in brackets.", ""]
    verdicts = []
    for group in _by_group(mine).values():
        title = group[0].title
        body = []
        for row in group:
            cells = []
            for column in columns:
                theirs = exp.value(row.paper_row, column) if row.paper_row else None
                count = row.mean(f"n:{column}")
                cells.append(fmt(row.stat(column)) + (f" [{count:.0f}]" if count and column != "average" else "") + (f" ({theirs.value:g})" if theirs else ""))
            settings = sum(int(row.mean(f"n:{t}") or 0) for t in paper.MAD_TASK_ORDER)
            body.append([_label_cell(row), row.paper_row or "–", *cells, f"{settings}/{paper.MAD_SETTINGS}", seeds_cell(row),
                         differences(row.fields, exp.protocol), budget_cell(row, exp.protocol), provenance_cell(row)])
        verdict = mad_verdict(group)
        verdicts.append(("", title, verdict))
        parts += [f"## {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "",
                  _table(["variant", "paper row", *[paper.MAD_SHORT[c] + " [settings]" if c != "average" else "Average" for c in columns], "settings", "seeds",
                          "protocol differences", "budget", "provenance"], body), ""]
    if not mine:
        parts.append("No MAD results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment != "mad"])]
    return Page("mad", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows, source=paper.MAD.source)


def mad_verdict(group: list[Row]) -> Verdict:
    named = [r for r in group if r.paper_row]
    kinds = {r.paper_row for r in named}
    sels = [r for r in named if r.paper_row not in ("NoPE", "RoPE")]
    if "NoPE" not in kinds or "RoPE" not in kinds or not sels:
        missing = [n for n, ok in (("NoPE", "NoPE" in kinds), ("RoPE", "RoPE" in kinds), ("Selective RoPE", bool(sels))) if not ok]
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    common = set.intersection(*[{k[2:] for r in row.runs for k in r.metrics if k.startswith("s:")} for row in named])
    if not common:
        return Verdict("not comparable", "no MAD setting that every variant ran")
    def average(row: Row) -> tuple:
        per_seed = [mad_scores({s: r.metrics[f"s:{s}"] for s in common if f"s:{s}" in r.metrics})["average"] for r in row.runs]
        return statistics.fmean(per_seed), (statistics.stdev(per_seed) if len(per_seed) > 1 else None), len(per_seed)

    avg = {id(r): average(r) for r in named}
    nope = next(avg[id(r)] for r in named if r.paper_row == "NoPE")
    rope = next(avg[id(r)] for r in named if r.paper_row == "RoPE")
    best_sel = max(sels, key=lambda r: avg[id(r)][0])
    above_nope = all(_beats(avg[id(r)], nope) for r in sels)
    not_below_rope = not _beats(rope, avg[id(best_sel)])
    said = (f"average over the {len(common)} settings all variants ran: NoPE {fmt(nope)}, RoPE {fmt(rope)}, "
            + ", ".join(f"{r.paper_row} {fmt(avg[id(r)])}" for r in sels)
            + f"; every Selective RoPE variant beats NoPE: {'yes' if above_nope else 'no'}; the best ({best_sel.paper_row}) is not beaten by RoPE: "
            + ("yes" if not_below_rope else "no"))
    ordering = above_nope and not_below_rope
    if len(common) < paper.MAD_SETTINGS:
        return Verdict("not comparable", f"{len(common)}/{paper.MAD_SETTINGS} settings (the paper averages all 66); the paper's ordering "
                       f"{'holds' if ordering else 'does not hold'} on them: {said}" + _caveats(named))
    return Verdict("reproduced" if ordering else "not reproduced", said + _caveats(named))


def report_plot(rows: list[Row]):
    groups = list(_by_group(rows).values())
    _, fig, axes = _grid(len(groups), width=9.0, height=4.0)
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


# ---------------------------------------------------------------------------------------
# One row per result folder (srope report --by-folder, and srope synth's closing table)

FOLDER_TITLE = "MAD (score, %: best over the optimiser grid per setting, mean per task)"
FOLDER_NOTE = "Paper rows: Table 1 (GLA, 66 settings x 6 optimiser points). Our MAD accuracy is torchmetrics' macro average, as MAD's."
PAPER_MAD_TABLE1 = paper.mad_table1()


def paper_mad_row(results: dict) -> str | None:
    """The Table-1 row that matches a MAD run (GLA only), from its position options."""
    from srope.lab.report.collect_synth import paper_variant

    kind = results.get("position_type")
    if results.get("mixer") != "gla" or kind not in ("nope", "rope", "selective_rope"):
        return None
    return paper_variant(kind, results.get("config", {}).get("position", {}).get(kind) or {}, with_options=True)


def folder_table(results_list: list[dict]) -> str:
    """Ours per folder, each followed by the paper's Table-1 row of the same variant."""
    rows = []
    for res in results_list:
        agg = res.get("aggregate") or {}
        per_task = agg.get("per_task", {})
        note = "" if agg.get("complete") else f" ({sum(agg.get('settings_per_task', {}).values())}/{paper.MAD_SETTINGS} settings)"
        rows.append([res["label"] + status(res) + note, *[pct(per_task.get(t)) for t in paper.MAD_TASK_ORDER], pct(agg.get("average"))])
        row = paper_mad_row(res)
        if row is not None:
            values = PAPER_MAD_TABLE1[row]
            rows.append([f"paper: GLA {row}", *[f"{values[t]:.1f}" for t in paper.MAD_TASK_ORDER], f"{values['average']:.1f}"])
    return _table(["model", *[paper.MAD_SHORT[t] for t in paper.MAD_TASK_ORDER], "Average"], rows)


# ---------------------------------------------------------------------------------------
# How a sweep's records become report runs (srope.lab.report.collect_synth)


class Records(SweepRecords):
    """One score per setting, then the protocol score from them (:func:`mad_scores`)."""

    paper_row_options = True  # Table 1 has a row per phase gate and bias

    def fields(self, cfg: dict, settings: list[str], points: int) -> dict:
        return {**super().fields(cfg, settings, points), "batch": cfg.get("batch_size"), "epochs": cfg.get("epochs"), "optimiser points": points,
                "settings": len(settings)}

    def describe(self, cfg: dict) -> str:
        return f"{super().describe(cfg)}, up to {cfg.get('epochs')} epochs, batch {cfg.get('batch_size')}"

    def metrics(self, records: dict[str, dict]) -> tuple[dict, dict]:
        scores = {setting: record["score"] for setting, record in records.items()}
        return {**mad_scores(scores), **{f"s:{name}": score for name, score in scores.items()}}, {}


def mad_scores(per_setting: dict[str, float]) -> dict[str, float]:
    """MAD's protocol score from per-setting results: the mean per task over its settings,
    the mean of those, and how many settings each task has (``n:<task>``)."""
    by_task: dict[str, list[float]] = {}
    for name, score in per_setting.items():
        by_task.setdefault(name.split("/")[0], []).append(float(score))
    out: dict[str, float] = {task: sum(v) / len(v) for task, v in by_task.items()}
    out["average"] = sum(out.values()) / len(out) if out else math.nan
    out.update({f"n:{task}": float(len(v)) for task, v in by_task.items()})
    return out
