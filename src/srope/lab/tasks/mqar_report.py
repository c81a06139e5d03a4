"""The MQAR page (Fig. 6): accuracy at sequence 512 / 64 KV pairs per model width, and its verdict."""

from __future__ import annotations

import statistics

from srope.lab.report import paper
from srope.lab.report.cells import _footnotes, _label_cell, _table, budget_cell, differences, fmt, paper_cell, provenance_cell, seeds_cell
from srope.lab.report.collect_synth import SweepRecords, _count, model_size
from srope.lab.report.folders import pct, status
from srope.lab.report.page import Page, _no_counterpart, _opening
from srope.lab.report.plots import _claim, _colors, _grid, _seeds, _title
from srope.lab.report.rows import Row, _by_group, _folders
from srope.lab.report.verdicts import Verdict, _beats, _caveats, _inconclusive, invalid_test
from srope.lab.tasks.release import zoology_batch_size

LEARNS = 0.5  # query accuracy some arm needs at 512 x 64 for a valid test
MIN_STEPS_SHARE = 1.0  # the released protocol is cheap enough to run in full
RULE = (
    "Reproduced when, at sequence 512 with 64 KV pairs (the paper's only panel), Selective RoPE's accuracy averaged over the model widths that all "
    "three encodings ran beats NoPE's and RoPE's (Fig. 6's claim: the greatest improvement over NoPE); not comparable without that setting or an encoding."
)
VALIDITY = f"for MQAR some arm reaches {LEARNS:.0%} at sequence 512 / 64 KV pairs"


def _mqar_points(row: Row) -> dict[str, dict[int, tuple]]:
    """``{"T512-kv64": {64: stat, ...}}`` from the per-setting metrics."""
    import re

    out: dict[str, dict[int, tuple]] = {}
    for name in {k for r in row.runs for k in r.metrics}:
        match = re.fullmatch(r"(T\d+-kv\d+)-d(\d+)", name)
        if match:
            out.setdefault(match.group(1), {})[int(match.group(2))] = row.stat(name)
    return out


PAPER_MQAR = "T512-kv64"


def report_page(rows: list[Row]) -> Page:
    exp = paper.MQAR
    mine, parts = _opening("mqar", "MQAR", exp, rows, RULE, valid=True)
    verdicts = []
    for group in _by_group(mine).values():
        title = group[0].title
        points = {id(r): _mqar_points(r) for r in group}
        widths = sorted({w for r in group for w in points[id(r)].get(PAPER_MQAR, {})})
        body = []
        for row in group:
            at = points[id(row)].get(PAPER_MQAR, {})
            common = [at[w] for w in widths if at.get(w)]
            mean = (statistics.fmean(s[0] for s in common), None, 1) if common and len(common) == len(widths) else None
            body.append([_label_cell(row), *[fmt(at.get(w)) for w in widths], fmt(mean), seeds_cell(row), paper_cell(exp, row.paper_row, "accuracy"),
                         differences(row.fields, exp.protocol), budget_cell(row, exp.protocol), provenance_cell(row)])
        verdict = mqar_verdict(group, points)
        verdicts.append(("", title, verdict))
        parts += [f"## {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", ""]
        if widths:
            parts += ["Accuracy on query positions at sequence 512 / 64 KV pairs, %, best learning rate per width:", "",
                      _table(["variant", *[f"d={w}" for w in widths], "mean over widths", "seeds", "paper (Fig. 6)", "protocol differences", "budget (per width)", "provenance"], body), ""]
        others = sorted({c for r in group for c in points[id(r)] if c != PAPER_MQAR})
        for config in others:
            ws = sorted({w for r in group for w in points[id(r)].get(config, {})})
            parts += [f"Other setting {config} (not in the paper's figure), %:", "",
                      _table(["variant", *[f"d={w}" for w in ws], "seeds", "provenance"],
                             [[_label_cell(r), *[fmt(points[id(r)].get(config, {}).get(w)) for w in ws], seeds_cell(r), provenance_cell(r)] for r in group]), ""]
    if not mine:
        parts.append("No MQAR results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment != "mqar"])]
    return Page("mqar", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows, source=paper.MQAR.source)


def mqar_verdict(group: list[Row], points: dict) -> Verdict:
    by_name: dict[str, Row] = {}
    for row in group:
        if row.paper_row and PAPER_MQAR in points[id(row)]:
            by_name.setdefault(row.paper_row, row)
    missing = [n for n in ("NoPE", "RoPE", "Selective RoPE") if n not in by_name]
    if not any(PAPER_MQAR in points[id(r)] for r in group):
        return Verdict("not comparable", "sequence 512 / 64 KV pairs (the paper's only panel) was not run")
    if missing:
        return Verdict("not comparable", f"{', '.join(missing)} not run at sequence 512 / 64 KV pairs")
    widths = set.intersection(*[set(points[id(by_name[n])][PAPER_MQAR]) for n in by_name])
    if not widths:
        return Verdict("not comparable", "no model width that all three encodings ran")

    def average(name: str) -> tuple:
        stats = [points[id(by_name[name])][PAPER_MQAR][w] for w in widths]
        sds = [s[1] for s in stats if s[1] is not None]
        return statistics.fmean(s[0] for s in stats), (max(sds) if sds else None), min(s[2] for s in stats)

    sel, nope, rope = average("Selective RoPE"), average("NoPE"), average("RoPE")
    said = (f"mean accuracy over widths {', '.join(str(w) for w in sorted(widths))}: Selective RoPE {fmt(sel)}%, NoPE {fmt(nope)}%, RoPE {fmt(rope)}%"
            + ("; RoPE beats NoPE as the paper says" if _beats(rope, nope) else "; RoPE does not beat NoPE (the paper: positional information helps)"))
    learned = max((s[0] for r in by_name.values() for s in points[id(r)][PAPER_MQAR].values() if s), default=0.0)
    why = invalid_test(by_name.values(), MIN_STEPS_SHARE) or (
        f"no encoding learns sequence 512 / 64 KV pairs at any width run (best {100 * learned:.1f}%; a valid test needs one at {LEARNS:.0%}), "
        "so the base model cannot tell the encodings apart" if learned < LEARNS else None)
    if why:
        return _inconclusive(why, said + _caveats(by_name.values()))
    ok = _beats(sel, nope) and _beats(sel, rope)
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(by_name.values()))


def report_plot(rows: list[Row]):
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
    _, fig, axes = _grid(len(panels))
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


# ---------------------------------------------------------------------------------------
# One row per result folder (srope report --by-folder, and srope synth's closing table)

FOLDER_TITLE = "MQAR (accuracy on query positions, %, best lr)"
FOLDER_NOTE = "The paper shows MQAR only as a figure (Fig. 6, seq 512 / 64 KV pairs, accuracy vs model dimension) without numbers."


def folder_table(results_list: list[dict]) -> str:
    dims = sorted({entry["x"] for res in results_list for entry in res.get("summary", {}).values() if entry["x"] is not None})
    rows = []
    for res in results_list:
        groups: dict[str, dict[float, float]] = {}
        for entry in res.get("summary", {}).values():
            groups.setdefault(entry["group"], {})[entry["x"]] = entry["score_mean"]
        for group, by_dim in sorted(groups.items(), key=lambda kv: int(kv[0].split("-")[0][1:])):
            rows.append([res["label"] + status(res), group, *[pct(by_dim.get(d)) for d in dims]])
    return _table(["model", "seq × KV", *[f"d={int(d)}" for d in dims]], rows)


# ---------------------------------------------------------------------------------------
# How a sweep's records become report runs (srope.lab.report.collect_synth)


class Records(SweepRecords):
    """One score per setting (a model width at a sequence length and KV-pair count)."""

    def fields(self, cfg: dict, settings: list[str], points: int) -> dict:
        return {"layers": cfg.get("model", {}).get("num_hidden_layers"), "vocab": cfg.get("vocab"), "train set": cfg.get("train_examples"),
                "epochs": cfg.get("epochs"), "batch": cfg.get("batch_size") or zoology_batch_size(512), "lr points": points}

    def describe(self, cfg: dict) -> str:
        return f"{cfg.get('mixer', 'gla')} {model_size(cfg, width=False)}, {cfg.get('epochs')} epochs x {_count(cfg.get('train_examples'))} examples"

    def batch(self, cfg: dict, setting: dict) -> int | None:
        return cfg.get("batch_size") or zoology_batch_size(int(setting.get("params", {}).get("seq_len", setting.get("max_len", 0))))

    def metrics(self, records: dict[str, dict]) -> tuple[dict, dict]:
        return {setting: record["score"] for setting, record in records.items()}, {}

    def budget(self, examples: float, cfg: dict, trained: int) -> float:
        return examples / trained  # the paper's budget is per trained model, i.e. per width
