"""What every experiment page shares: the :class:`Page` record, its opening lines and the runs without a counterpart."""

from __future__ import annotations

from dataclasses import dataclass

from srope.lab.report import paper
from srope.lab.report.cells import _footnotes, _label_cell, _short, _table, fmt, provenance_cell, seeds_cell
from srope.lab.report.rows import Row, _by_group
from srope.lab.report.verdicts import MIN_STEPS_SHARE, RULES, VALIDITY, Verdict


def _opening(name: str, title: str, exp: paper.Experiment, rows: list[Row]) -> tuple[list[Row], list[str]]:
    """The rows of experiment ``name`` and the first lines of its page: title, header, rule."""
    validity = [f"Validity: {VALIDITY}", ""] if name in MIN_STEPS_SHARE else []
    return [r for r in rows if r.experiment == name], [f"# {title} ({exp.source})", "", _header(exp), "", f"Rule: {RULES[name]}", "", *validity]


def _header(exp: paper.Experiment) -> str:
    p = exp.protocol
    lines = [
        f"Paper: **{exp.source}**. {'Numbers: ' + exp.unit + '.' if exp.numbers else 'No numbers: ' + exp.note + '.'}",
        "",
        f"- Protocol ({p.source}): {p.model}; {p.training}; {p.lengths}; seeds {p.seeds}.",
        f"- Budget per trained model: {_short(p.budget)} {p.budget_unit} ({p.budget_source}). The budget column is ours as a share of it.",
        *(f"- Claim: {claim}" for claim in exp.claims),
        *([f"- Note: {exp.note}."] if exp.numbers and exp.note else []),
    ]
    return "\n".join(lines)


@dataclass
class Page:
    name: str
    title: str
    markdown: str
    verdicts: list[tuple[str, str, Verdict]]  # (panel, group, verdict)
    rows: list[Row]
    plot: str | None = None
    source: str = ""  # where the paper has it, for the index


def _no_counterpart(rows: list[Row]) -> str:
    if not rows:
        return ""
    lines = ["## Runs without a counterpart in the paper", ""]
    for group in _by_group(rows).values():
        metric = next((m for m in ("score", "average", "val_ppl") if any(r.stat(m) for r in group)), "score")
        scale, digits = (1.0, 2) if metric == "val_ppl" else (100.0, 1)
        lines += [f"{group[0].experiment.replace('/other/', ': ')}, {group[0].title}", "", _table(["variant", metric, "seeds", "provenance"], [
            [_label_cell(r), fmt(r.stat(metric), scale, digits), seeds_cell(r), provenance_cell(r)] for r in group]), ""]
    lines.append(_footnotes(rows))
    return "\n".join(lines)
