"""The copying page (Fig. 5): string accuracy beyond the training length, every run, and its verdict."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from srope.lab.report import paper
from srope.lab.report.cells import (_every_run, _footnotes, _label_cell, _percent, _table, budget_cell, differences, fmt, holds_up_to,
                                    paper_cell, provenance_cell, seeds_cell)
from srope.lab.report.collect_synth import SweepRecords
from srope.lab.report.folders import pct, status
from srope.lab.report.page import Page, _no_counterpart, _opening
from srope.lab.report.plots import _claim, _curves, _grid, _title
from srope.lab.report.records import Run
from srope.lab.report.rows import Row, _by_group, _folders
from srope.lab.report.verdicts import Verdict, _beats, _by_paper_row, _caveats, _inconclusive, invalid_test

EXTRAPOLATES = 0.5  # string accuracy beyond the training length that counts as extrapolating
FITS = 0.9  # string accuracy at the training lengths every arm needs for a valid test
MIN_STEPS_SHARE = 1.0  # the released protocol is cheap enough to run in full
RULE = (
    f"Reproduced when Selective RoPE's (best variant's) string accuracy on strings longer than the training strings is at least "
    f"{EXTRAPOLATES} and beats NoPE's and RoPE's (Fig. 5's claim: it extrapolates, RoPE does not); not comparable without all three encodings."
)
VALIDITY = f"for copying every arm also copies at least {FITS:.0%} of the strings at the training lengths"


def report_page(rows: list[Row]) -> Page:
    exp = paper.COPYING
    mine, parts = _opening("copying", "Copying", exp, rows, RULE, valid=True)
    verdicts = []
    for group in _by_group(mine).values():
        title = group[0].title
        train_len = group[0].train_len
        body = []
        for row in group:
            curve = _mean_curve(row, "str_acc_by_length")
            longest = f"{100 * curve[1][-1]:.1f} @ {curve[0][-1]}" if curve else "–"
            body.append([_label_cell(row), fmt(row.stat("str_acc_train_range")), fmt(row.stat("str_acc_extrapolation")), fmt(row.stat("char_acc_extrapolation")),
                         longest, seeds_cell(row), paper_cell(exp, row.paper_row, "str_acc_extrapolation"), differences(row.fields, exp.protocol),
                         budget_cell(row, exp.protocol), provenance_cell(row)])
        verdict = copying_verdict(group)
        verdicts.append(("", title, verdict))
        parts += [f"## {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "",
                  _table(["variant", f"str acc ≤ {train_len}, %", f"str acc > {train_len}, %", f"char acc > {train_len}, %", "str acc @ longest, %", "seeds",
                          f"paper ({exp.source.split(' (')[0]})", "protocol differences", "budget", "provenance"], body), "",
                  "Every run:", "", _copying_runs_table(group, train_len), ""]
    if not mine:
        parts.append("No copying results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment != "copying"])]
    return Page("copying", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows, source=paper.COPYING.source)


EXTRAPOLATION_LENGTHS = {"str_acc_by_length": (1.25, 1.5), "char_acc_by_length": (2, 4, 8)}  # multiples of the training length
COPIES = 0.9  # string accuracy that counts as copying a length


def _at_or_after(x: list, length: float) -> int | None:
    """The index of the first evaluated length ≥ ``length`` (None: evaluated only shorter)."""
    return next((i for i, v in enumerate(x) if v >= length), None)


def _copying_runs_table(group: list[Row], train_len: int | None) -> str:
    """Each run's longest length copied and its accuracies at a few multiples of the training length."""
    first = next((r.curves for row in group for r in row.runs if r.curves), {})
    columns: list[tuple[str, Callable[[Run], str]]] = [
        (f"str acc ≤ {train_len}, %", lambda run: _percent(run, "str_acc_train_range")),
        (f"longest length with str acc ≥ {COPIES}", lambda run: str(holds_up_to(run.curves.get("str_acc_by_length"), COPIES) or "–")),
    ]
    for name, multiples in EXTRAPOLATION_LENGTHS.items():
        x = first.get(name, ([], []))[0]
        picked = list(dict.fromkeys(i for m in multiples if train_len and (i := _at_or_after(x, m * train_len)) is not None))
        if picked:
            def at_lengths(run: Run, name=name, picked=picked) -> str:
                y = run.curves.get(name, ([], []))[1]
                return " / ".join(f"{100 * y[i]:.1f}" if i < len(y) else "–" for i in picked)
            columns.append((f"{name.split('_')[0]} acc @ {' / '.join(str(x[i]) for i in picked)}, %", at_lengths))
    columns.append((f"str / char acc > {train_len}, %", lambda run: f"{_percent(run, 'str_acc_extrapolation')} / {_percent(run, 'char_acc_extrapolation')}"))
    return _every_run(group, columns)


def copying_verdict(group: list[Row]) -> Verdict:
    best = _by_paper_row(group, "str_acc_extrapolation")
    missing = [name for name in ("NoPE", "RoPE", "Selective RoPE") if name not in best]
    if missing:
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    sel, nope, rope = (best[n].stat("str_acc_extrapolation") for n in ("Selective RoPE", "NoPE", "RoPE"))
    if None in (sel, nope, rope):
        return Verdict("not comparable", "no accuracy beyond the training length (evaluated only up to it)")
    said = f"string accuracy beyond the training length: Selective RoPE ({best['Selective RoPE'].label}) {fmt(sel)}%, NoPE {fmt(nope)}%, RoPE {fmt(rope)}%"
    unfit = [f"{name} {fmt(best[name].stat('str_acc_train_range'))}%" for name in ("NoPE", "RoPE", "Selective RoPE")
             if (best[name].stat("str_acc_train_range") or (0.0,))[0] < FITS]
    why = invalid_test(best.values(), MIN_STEPS_SHARE) or (
        f"not every arm fits the training lengths (string accuracy there: {', '.join(unfit)}; a valid test needs {FITS:.0%})" if unfit else None)
    if why:
        return _inconclusive(why, said + _caveats(best.values()))
    ok = sel[0] >= EXTRAPOLATES and _beats(sel, nope) and _beats(sel, rope)
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(best.values()))


def _mean_curve(row: Row, name: str) -> tuple[list, list] | None:
    curves = [r.curves[name] for r in row.runs if name in r.curves and r.curves[name][0]]
    if not curves:
        return None
    x = curves[0][0]
    ys = [c[1] for c in curves if list(c[0]) == list(x)]
    return list(x), [statistics.fmean(v) for v in zip(*ys)]


def report_plot(rows: list[Row]):
    """String and character accuracy per group, on a log length axis: what matters happens
    just past the training lengths, which a linear axis to 512 squeezes into a few pixels."""
    groups = list(_by_group(rows).values())
    _, fig, axes = _grid(2 * len(groups))
    for i, group in enumerate(groups):
        for ax, (name, label) in zip(axes[2 * i : 2 * i + 2], (("str_acc_by_length", "string"), ("char_acc_by_length", "character"))):
            _curves(ax, group, name)
            ax.set_xscale("log", base=2)
            ax.set(xlabel="string length", ylabel=f"{label} accuracy", title=_title(group[0].title))
        _claim(axes[2 * i], paper.COPYING)
    return fig


# ---------------------------------------------------------------------------------------
# One row per result folder (srope report --by-folder, and srope synth's closing table)

FOLDER_TITLE = "Copying (teacher-forced, %)"
FOLDER_NOTE = "The paper shows copying only as a figure (Fig. 5, accuracy vs length, GLA) without numbers."


def folder_table(results_list: list[dict]) -> str:
    rows = []
    for res in results_list:
        for entry in res.get("summary", {}).values():
            curve = entry["curves"].get("str_acc_by_length", {})
            at = dict(zip(curve.get("x", []), curve.get("mean", [])))
            picks = [pct(at.get(n)) for n in (64, 128, 256, 512)]
            s = entry["scalars"]
            rows.append([res["label"] + status(res), pct(s.get("str_acc_train_range")), pct(s.get("str_acc_extrapolation")),
                         pct(s.get("char_acc_extrapolation")), *picks, f"{entry['lr']:g}", str(len(entry["seeds"]))])
    header = ["model", "str acc ≤ train len", "str acc > train len", "char acc > train len", "str @64", "str @128", "str @256", "str @512", "lr", "seeds"]
    return _table(header, rows)


# ---------------------------------------------------------------------------------------
# How a sweep's records become report runs (srope.lab.report.collect_synth)


class Records(SweepRecords):
    def fields(self, cfg: dict, settings: list[str], points: int) -> dict:
        steps = cfg.get("steps") if cfg.get("max_steps") is None else min(cfg["steps"], cfg["max_steps"])
        return {**super().fields(cfg, settings, points), "steps": steps, "batch": cfg.get("batch_size"),
                "longest train string": cfg.get("max_len"), "longest eval string": _max_length(cfg.get("eval_lengths"))}

    def describe(self, cfg: dict) -> str:
        return f"{super().describe(cfg)}, {cfg.get('steps')} steps x {cfg.get('batch_size')}, strings {cfg.get('min_len')}-{cfg.get('max_len')}"


def _max_length(spec) -> int | None:
    """The largest length of an ``eval_lengths`` spec such as ``"2-512:30"`` or ``"2,8,16"``."""
    numbers = [int(tok) for tok in str(spec).replace(":", ",").replace("-", ",").split(",") if tok.strip().isdigit()]
    if not numbers:
        return None
    text = str(spec)
    return int(text.split(":")[0].split("-")[-1]) if "-" in text else max(numbers)
