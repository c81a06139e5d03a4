"""The state-tracking page (Fig. 7): sequence accuracy at the training and evaluation lengths, every run, and the verdicts."""

from __future__ import annotations

from srope.lab.report import paper
from srope.lab.report.cells import (_every_run, _footnotes, _label_cell, _percent, _table, budget_cell, differences, fmt, holds_up_to,
                                    paper_cell, provenance_cell, seeds_cell)
from srope.lab.report.collect_synth import SweepRecords, _count
from srope.lab.report.folders import pct, seeds_spread, status
from srope.lab.report.page import Page, _header, _no_counterpart, validity
from srope.lab.report.plots import _claim, _curves, _grid, _title
from srope.lab.report.records import Run
from srope.lab.report.rows import Row, _by_group, _folders
from srope.lab.report.verdicts import Verdict, _by_paper_row, _caveats, _inconclusive, invalid_test

LEARNS, FAILS, EXTRAPOLATES = 0.99, 0.9, 0.9  # the protocol's stopping threshold; "does not learn" below 0.9
# The protocols (48,900-195,400 steps) are asked at a tenth, with the schedule planned over the
# steps run (max_steps).
MIN_STEPS_SHARE = 0.1
RULE = (
    f"\"Learns\": mean sequence accuracy at the training length >= {LEARNS} (the protocol's stopping threshold); \"does not learn\": below {FAILS}; "
    f"\"extrapolates\": >= {EXTRAPOLATES} at the evaluation length. GLA S2 is reproduced when Selective RoPE learns and extrapolates and NoPE and RoPE "
    "do not learn; Transformer S2 when Selective RoPE learns and NoPE and RoPE do not; DeltaNet A3 when Selective RoPE learns. A panel the text "
    "makes no claim about is not comparable."
)


def _state_runs_table(group: list[Row], eval_len) -> str:
    """Each run's accuracies and how long a prefix it tracks on most sequences (a run far from
    learning its task still shows how far it got)."""
    def prefix(run: Run) -> str:
        curve = run.curves.get("seq_acc_by_length")
        return " / ".join(str(holds_up_to(curve, t) or "–") for t in (0.9, 0.5))
    return _every_run(group, [
        (f"seq acc @ train len {group[0].train_len}, %", lambda run: _percent(run, "seq_acc_at_train_len")),
        (f"seq acc @ {eval_len}, %", lambda run: _percent(run, "seq_acc")),
        (f"token acc @ {eval_len}, %", lambda run: _percent(run, "token_acc")),
        ("longest prefix right on ≥ 90% / ≥ 50% of sequences", prefix),
        (f"evaluation reported (the last one's seq acc @ {group[0].train_len} / @ {eval_len}, % where it differs)", _reported_cell),
    ])


def _reported_cell(run: Run) -> str:
    """Which evaluation a run's numbers come from: with ``select=best`` it may be long before the
    end, and the model the run ended with may have lost what the best one had."""
    cells = []
    for r in run.reported:
        if r["step"] is None:
            cells.append(f"{r['select']} (step not recorded)")
        elif r["step"] == r["steps"]:
            cells.append(f"{r['select']}: the last, step {r['step']:,}")
        else:
            last = " / ".join(f"{100 * v:.1f}" if isinstance(v := r["final"].get(k), (int, float)) else "–" for k in ("seq_acc_at_train_len", "seq_acc"))
            cells.append(f"{r['select']}: step {r['step']:,}; the last (step {r['steps']:,}): {last}")
    return "; ".join(cells) or "–"


def _lost_by_the_end(row: Row, metric: str) -> list[str]:
    """Runs whose reported evaluation learned (``metric`` >= LEARNS) and whose last did not."""
    return [f"seed {run.seed}: {100 * r['final'][metric]:.1f}% at its last evaluation (step {r['steps']:,}), {100 * run.metrics[metric]:.1f}% at step {r['step']:,}"
            for run in row.runs for r in run.reported
            if r["step"] is not None and r["step"] != r["steps"] and run.metrics.get(metric, 0) >= LEARNS
            and isinstance(r["final"].get(metric), (int, float)) and r["final"][metric] < LEARNS]


def report_page(rows: list[Row]) -> Page:
    parts = ["# State tracking (v3 Fig. 7 (v1 Fig. 8))", "", f"Rule: {RULE}", "", f"Validity: {validity()}", ""]
    verdicts = []
    mine = [r for r in rows if r.experiment in {e.key for e in paper.STATE_TRACKING}]
    for exp in paper.STATE_TRACKING:
        panel = [r for r in mine if r.experiment == exp.key]
        parts += [f"## {exp.title}", "", _header(exp), ""]
        if not panel:
            parts += ["No results for this panel.", ""]
            verdicts.append((exp.title, "", Verdict("not comparable", "not run")))
            continue
        for group in _by_group(panel).values():
            title = group[0].title
            eval_len = group[0].fields.get("eval len")
            body = []
            for row in group:
                # both counts: seeds that split into learners and non-learners make a mean that says neither
                at_train = row.values("seq_acc_at_train_len")
                counts = f"{sum(v >= LEARNS for v in at_train)} / {sum(v >= FAILS for v in at_train)} of {len(row.runs)}"
                body.append([_label_cell(row), fmt(row.stat("seq_acc_at_train_len")), fmt(row.stat("score")), counts, seeds_cell(row),
                             paper_cell(exp, row.paper_row, "seq_acc"), differences(row.fields, exp.protocol), budget_cell(row, exp.protocol), provenance_cell(row)])
            verdict = state_tracking_verdict(exp, group)
            verdicts.append((exp.title, title, verdict))
            parts += [f"### {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "",
                      _table(["variant", f"seq acc @ train len {group[0].train_len}, %", f"seq acc @ {eval_len}, %", f"seeds >= {LEARNS} / >= {FAILS} @ {group[0].train_len}", "seeds",
                              "paper (Fig. 7)", "protocol differences", "budget", "provenance"], body), "",
                      "Every run:", "", _state_runs_table(group, eval_len), ""]
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r not in mine])]
    return Page("state_tracking", "State tracking (S2 parity, A3)", "\n".join(parts).rstrip() + "\n", verdicts, rows, source="v3 Fig. 7")


def state_tracking_verdict(exp: paper.Experiment, group: list[Row]) -> Verdict:
    if not exp.values:
        return Verdict("not comparable", "the paper's text states no result for this panel")
    best = _by_paper_row(group, "seq_acc_at_train_len")
    needed = [v.row for v in exp.values]
    missing = [n for n in needed if n not in best]
    if missing:
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    sel = best["Selective RoPE"]
    train, extra = sel.stat("seq_acc_at_train_len"), sel.stat("score")
    if train is None:
        return Verdict("not comparable", "no accuracy at the training length was recorded")
    lost = _lost_by_the_end(sel, "seq_acc_at_train_len")
    checks = [(f"Selective RoPE ({sel.label}) learns: {fmt(train)}% at the training length"
               + (f" at its best evaluation, and then loses it ({'; '.join(lost)})" if lost else ""), train[0] >= LEARNS)]
    if exp.key == "state_tracking/gla-S2":
        checks.append((f"extrapolates: {fmt(extra)}% at the evaluation length", extra is not None and extra[0] >= EXTRAPOLATES))
    for name in ("NoPE", "RoPE"):
        if name in best:
            s = best[name].stat("seq_acc_at_train_len")
            checks.append((f"{name} does not learn: {fmt(s)}%", s is not None and s[0] < FAILS))
    ok = all(passed for _, passed in checks)
    said = "; ".join(f"{text} ({'yes' if passed else 'no'})" for text, passed in checks)
    why = invalid_test(best.values(), MIN_STEPS_SHARE)
    if why:
        return _inconclusive(why, said + _caveats(best.values()))
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(best.values()))


def report_plot(rows: list[Row]):
    panels = [(exp, group) for exp in paper.STATE_TRACKING for group in _by_group([r for r in rows if r.experiment == exp.key]).values()]
    if not panels:
        return None
    _, fig, axes = _grid(len(panels))
    for ax, (exp, group) in zip(axes, panels):
        _curves(ax, group, "seq_acc_by_length")
        ax.set(xlabel="sequence length", ylabel="sequence accuracy", title=_title(f"{exp.title.split(': ', 1)[1]}: {group[0].title}", 70))
        ax.title.set_fontsize(7)
        _claim(ax, exp)
    return fig


# ---------------------------------------------------------------------------------------
# One row per result folder (srope report --by-folder, and srope synth's closing table)

FOLDER_TITLE = "State tracking (sequence accuracy, %)"
FOLDER_NOTE = ("The paper shows state tracking only as a figure (Fig. 7: S2 with 1-layer GLA/Transformer, A3 with 2-layer DeltaNet) "
               "without numbers.")


def folder_table(results_list: list[dict]) -> str:
    rows = []
    for res in results_list:
        cfg = res["config"]
        for name, entry in res.get("summary", {}).items():
            train_acc, _ = seeds_spread(entry, "seq_acc_at_train_len")
            eval_acc, eval_std = seeds_spread(entry, "score")
            last = entry.get("final_scalars", {})
            rows.append([res["label"] + status(res), name, pct(train_acc), pct(eval_acc, eval_std), pct(entry["scalars"].get("token_acc")),
                         f"{pct(last.get('seq_acc_at_train_len'))} / {pct(last.get('score'))}",
                         f"{entry['lr']:g}", str(len(entry["seeds"])), str(cfg["train_len"]), str(cfg["eval_len"])])
    header = ["model", "group", "seq acc @ train len", "seq acc @ eval len", "token acc", "last eval: @ train len / @ eval len", "lr", "seeds",
              "train len", "eval len"]
    return _table(header, rows)


# ---------------------------------------------------------------------------------------
# How a sweep's records become report runs (srope.lab.report.collect_synth)

PRESET_EVAL_SIZE = 500_000  # the presets' evaluation set (srope.lab.tasks.state_tracking)


class Records(SweepRecords):
    def experiment(self, cfg: dict) -> str:
        """The paper's panel (host and group), or ``state_tracking/other/...``."""
        mixer = cfg.get("mixer", "gla")
        host = {"gla": "gla", "attention": "attention"}.get(mixer)
        if mixer == "gated_deltanet" and cfg.get("model", {}).get("use_forget_gate") is False:
            host = "deltanet"
        key = f"state_tracking/{host}-{cfg.get('group')}"
        return key if key in paper.EXPERIMENTS else f"state_tracking/other/{mixer}-{cfg.get('group')}"

    def fields(self, cfg: dict, settings: list[str], points: int) -> dict:
        lrs = cfg.get("lrs") or []
        return {**super().fields(cfg, settings, points), "train set": cfg.get("train_size"), "epochs": cfg.get("epochs"), "batch": cfg.get("batch_size"),
                "lr": lrs[0] if len(lrs) == 1 else lrs, "train len": cfg.get("train_len"), "eval len": cfg.get("eval_len")}

    def describe(self, cfg: dict) -> str:
        return (f"{super().describe(cfg)}, {cfg.get('group')}, {cfg.get('epochs')} epochs x {_count(cfg.get('train_size'))} sequences, "
                f"length {cfg.get('train_len')} -> {cfg.get('eval_len')}")

    def budget(self, examples: float, cfg: dict, trained: int) -> float:
        return examples * cfg.get("train_len", 1)  # the protocol's unit is tokens

    def notes(self, cfg: dict) -> list[str]:
        size = cfg.get("eval_size")
        return [] if size in (None, PRESET_EVAL_SIZE) else [f"eval set {size:,} sequences, not {PRESET_EVAL_SIZE:,}"]
