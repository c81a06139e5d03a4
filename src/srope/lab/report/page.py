"""What every experiment page shares: the :class:`Page` record, its opening lines and the runs without a counterpart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srope.lab.report import paper
from srope.lab.report.cells import _footnotes, _label_cell, _short, _table, fmt, provenance_cell, seeds_cell
from srope.lab.report.rows import Row, _by_group
from srope.lab.report.verdicts import Verdict, validity_text

LM_PAGE = "srope.lab.report.page_lm"


def pages() -> list[tuple[str, Any]]:
    """Each page's name and module, in the paper's order (pages the paper has no experiment for
    last): the synthetic tasks' (the task registry names them; a task without one gets a
    :class:`ScoresPage`) and the LM page. A module's ``report_page(rows)`` builds the page; its
    ``RULE`` states the verdict rule, and a task whose verdicts check the test's validity sets
    ``MIN_STEPS_SHARE`` and ``VALIDITY``."""
    from srope.lab.tasks.registry import tasks
    from srope.registry import load

    modules = [(name, entry.report_module() or ScoresPage(name)) for name, entry in tasks.items()]
    order = list(dict.fromkeys(key.split("/")[0] for key in paper.EXPERIMENTS))
    # found by name as the tasks' pages are: the LM page builds on this module
    return sorted([*modules, ("lm", load(LM_PAGE))], key=lambda item: order.index(item[0]) if item[0] in order else len(order))


def rules() -> dict[str, str]:
    """Every page's verdict rule, by page name."""
    return {name: module.RULE for name, module in pages() if getattr(module, "RULE", None)}


def validity() -> str:
    """When a test is valid, over every task whose verdicts ask it (one sentence for all, so
    that a reader of one page sees how much the others ask)."""
    checked = [(name, module) for name, module in pages() if hasattr(module, "MIN_STEPS_SHARE")]
    return validity_text({name: module.MIN_STEPS_SHARE for name, module in checked}, [module.VALIDITY for _, module in checked if getattr(module, "VALIDITY", "")])


def _opening(name: str, title: str, exp: paper.Experiment, rows: list[Row], rule: str, *, valid: bool = False) -> tuple[list[Row], list[str]]:
    """The rows of experiment ``name`` and the first lines of its page: title, header, rule
    and (``valid``: its verdicts check it) when a test is valid."""
    head = [f"# {title} ({exp.source})", "", _header(exp), "", f"Rule: {rule}", ""]
    return [r for r in rows if r.experiment == name], head + ([f"Validity: {validity()}", ""] if valid else [])


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


class ScoresPage:
    """The page of a registered task that brings none: each variant's score, no verdict."""

    def __init__(self, name: str):
        self.name = name

    def report_page(self, rows: list[Row]) -> Page:
        return Page(self.name, self.name, f"# {self.name}\n\n{_no_counterpart(rows) or 'No results.'}".rstrip() + "\n", [], rows)
