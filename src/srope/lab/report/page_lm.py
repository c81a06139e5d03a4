"""The language-modelling page (Tables 2 and 3): perplexity and zero-shot accuracy beside the paper's, and the verdicts."""

from __future__ import annotations

from srope.lab.report import paper
from srope.lab.report.cells import _footnotes, _label_cell, _short, _table, budget_cell, differences, fmt, paper_cell, provenance_cell, seeds_cell
from srope.lab.report.page import Page, _header, _no_counterpart
from srope.lab.report.rows import Row, _by_group, _folders
from srope.lab.report.verdicts import Verdict, _beats, _caveats

RULE = (
    "Comparable only with lm-eval's six zero-shot accuracies (Table 3's Avg) for NoPE, RoPE and Selective RoPE: reproduced when the encoding with the "
    "paper's best Avg in that block also has our best Avg and beats the others (for the ablation: \"+ phase gate\" > \"+ SiLU\" > \"Baseline\" in Avg, "
    "Table 2's order). Perplexity on another corpus or at another scale is shown, with its ordering, but is not comparable."
)


def report_page(rows: list[Row]) -> Page:
    parts = ["# Language modelling (v3 Tables 2 and 3)", "", f"Rule: {RULE}", ""]
    verdicts = []
    mine = [r for r in rows if r.experiment.startswith("lm/") and r.experiment in paper.EXPERIMENTS]
    for exp in paper.LM_TABLE3:
        block = [r for r in mine if r.experiment == exp.key]
        if not block:
            continue
        parts += [f"## {exp.title} ({exp.source})", "", _header(exp), ""]
        for group in _by_group(block).values():
            title = group[0].title
            verdict = lm_verdict(exp, group, "avg_acc", ("NoPE", "RoPE", "Selective RoPE"), lambda r: r.paper_row)
            verdicts.append((exp.title, title, verdict))
            parts += [f"### {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "", _lm_table(exp, group, lambda r: r.paper_row), ""]
            parts += [_lm_eval_table(exp, group, lambda r: r.paper_row), ""] if any(r.stat("avg_acc") or r.stat("piqa_acc") for r in group) else []
            parts += [_lm_notes(group), ""]
    ablation = [r for r in mine if r.experiment == "lm/gla-370m"]
    if ablation:
        exp = paper.LM_TABLE2
        parts += [f"## {exp.title} ({exp.source})", "", _header(exp), ""]
        for group in _by_group(ablation).values():
            title = group[0].title
            order = ("Selective RoPE: Baseline", "+ SiLU", "+ phase gate")
            verdict = lm_verdict(exp, group, "avg_acc", order, lambda r: r.ablation_row, ordered=True)
            verdicts.append((exp.title, title, verdict))
            parts += [f"### {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "", _lm_table(exp, group, lambda r: r.ablation_row), "",
                      _lm_notes(group), ""]
    if not mine:
        parts.append("No language-model results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment.startswith("lm/") and r not in mine])]
    return Page("lm", "Language modelling", "\n".join(parts).rstrip() + "\n", verdicts, rows, source="v3 Tables 2, 3")


def _lm_table(exp: paper.Experiment, group: list[Row], row_of) -> str:
    longest = next((int(r.mean("eval_longest_len")) for r in group if r.mean("eval_longest_len")), None)
    ppl_cols = ("avg_ppl", "avg_acc") if exp.key == "lm/ablation" else ("wikitext_ppl", "lambada_ppl", "avg_acc")
    body = []
    for row in group:
        name = row_of(row)
        theirs = [paper_cell(exp, name, c) if name else "not in the paper" for c in ppl_cols]
        body.append([_label_cell(row), fmt(row.stat("val_ppl"), 1, 2), fmt(row.stat("eval_ppl"), 1, 2),
                     *([fmt(row.stat("eval_ppl_longest"), 1, 2)] if longest else []), *theirs, seeds_cell(row),
                     differences(row.fields, exp.protocol), budget_cell(row, exp.protocol), provenance_cell(row)])
    split = next((r.fields.get("eval_split") for r in group if r.fields.get("eval_split")), "eval")
    header = ["variant", "ours: val ppl (the split lr is chosen on)", f"ours: {split} ppl @ {group[0].train_len}",
              *([f"ours: {split} ppl @ {longest}"] if longest else []), *[f"paper: {paper.LM_SHORT[c]}" for c in ppl_cols], "seeds",
              "protocol differences", "budget", "provenance"]
    return _table(header, body)


def _lm_eval_table(exp: paper.Experiment, group: list[Row], row_of) -> str:
    body = []
    for row in group:
        name = row_of(row)
        cells = []
        for column in paper.LM_COLUMNS:
            theirs = exp.value(name, column) if name else None
            cells.append(fmt(row.stat(column), 1, 2 if column.endswith("ppl") else 1) + (f" ({theirs.value:g})" if theirs else ""))
        body.append([_label_cell(row), *cells, seeds_cell(row)])
    return "Zero-shot (lm-eval), ours (paper):\n\n" + _table(["variant", *[paper.LM_SHORT[c] for c in paper.LM_COLUMNS], "seeds"], body)


def _lm_notes(group: list[Row]) -> str:
    who: dict[str, list[str]] = {}
    for row in group:
        for note in row.notes:
            who.setdefault(note, []).append(row.label)
    lines = [f"- {', '.join(labels)}: {note}" for note, labels in who.items()]
    metric = "eval_ppl" if all(r.stat("eval_ppl") for r in group) else "val_ppl"
    split = next((r.fields.get("eval_split") for r in group if r.fields.get("eval_split")), "eval") if metric == "eval_ppl" else "val"
    ours = sorted((r for r in group if r.stat(metric)), key=lambda r: r.mean(metric))
    if ours:
        lines.append(f"- Our {split} perplexity ordering (lower first): " + " < ".join(f"{r.label} {r.mean(metric):.2f}" for r in ours)
                     + "; the paper's (Table 2 Avg-PPL): NoPE 20.78 < Selective RoPE (+ phase gate) 21.16 < RoPE 21.42 for GLA 370M.")
    return "\n".join(dict.fromkeys(lines))


def lm_verdict(exp: paper.Experiment, group: list[Row], metric: str, names: tuple[str, ...], row_of, ordered: bool = False) -> Verdict:
    by_name = {}
    for row in group:
        name = row_of(row)
        if name in names and (name not in by_name or (row.mean(metric) or -1) > (by_name[name].mean(metric) or -1)):
            by_name[name] = row
    missing = [n for n in names if n not in by_name]
    if missing:
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    if any(by_name[n].stat(metric) is None for n in names):
        data = {r.fields.get("data") for r in group}
        tokens = {_short(r.fields.get("tokens")) for r in group if r.fields.get("tokens")}
        return Verdict("not comparable", f"no zero-shot accuracies (lm-eval) for every encoding; our perplexity is on held-out {', '.join(map(str, data))} "
                       f"after {', '.join(tokens) or '?'} tokens, the paper's on Wikitext and LAMBADA after {_short(exp.protocol.budget)} FineWeb tokens")
    stats = {n: by_name[n].stat(metric) for n in names}
    said = ", ".join(f"{n} {fmt(stats[n], 1)}" for n in names)
    if ordered:  # names are listed worst to best, as the paper orders them
        ok = all(_beats(stats[b], stats[a], 0.0) for a, b in zip(names, names[1:]))
    else:
        paper_best = max(names, key=lambda n: exp.value(n, metric).value)
        ok = all(_beats(stats[paper_best], stats[n], 0.0) for n in names if n != paper_best)
        said += f"; the paper's best: {paper_best}"
    return Verdict("reproduced" if ok else "not reproduced", f"Avg accuracy {said}" + _caveats(by_name.values()))
