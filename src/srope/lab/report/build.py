"""The whole ``srope report``: every experiment's page from the collected runs, and the index with the verdicts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from srope.lab.report import paper
from srope.lab.report.page import Page, pages, rules
from srope.lab.report.records import OUR_RECIPE, Collected
from srope.lab.report.rows import Row, _by_group, _rows, _titles
from srope.lab.report.verdicts import MARGIN, Verdict


def family(experiment: str) -> str:
    return experiment.split("/")[0]


def page_builders() -> list[tuple[str, Callable[[list[Row]], Page]]]:
    """Each page's builder in the paper's order (:func:`srope.lab.report.page.pages`)."""
    return [(name, module.report_page) for name, module in pages()]


def build_pages(collected: Collected, *, by_folder: bool = False) -> list[Page]:
    """Every page; ``by_folder``: each task's page also has a table with one row per result folder."""
    rows = _rows(collected.runs)
    for experiment in {r.experiment for r in rows}:
        groups = _by_group([r for r in rows if r.experiment == experiment])
        titles = _titles(groups.values())
        for key, group in groups.items():
            for row in group:
                row.title = titles[key]
    pages = []
    for name, builder in page_builders():
        pages.append(builder([r for r in rows if family(r.experiment) == name]))
    if by_folder:
        from srope.lab.report.folders import add_to_pages

        add_to_pages(pages, collected.read)
    return pages


def _short_panel(panel: str) -> str:
    return panel.split(": ", 1)[1] if ": " in panel else panel


def _verdict_counts(verdicts: list[tuple[str, str, Verdict]]) -> str:
    by_panel: dict[str, list[str]] = {}
    for panel, group, verdict in verdicts:
        by_panel.setdefault(_short_panel(panel) + (f" ({OUR_RECIPE})" if OUR_RECIPE in group else ""), []).append(verdict.status)
    parts = []
    for panel, statuses in by_panel.items():
        counts = ", ".join(status + (f" x{statuses.count(status)}" if len(statuses) > 1 else "") for status in dict.fromkeys(statuses))
        parts.append(f"{panel}: {counts}" if panel else counts)
    return "; ".join(parts)


def index_markdown(pages: list[Page], collected: Collected, dirs: list[Path]) -> str:
    from srope.lab import provenance

    head, dirty = provenance.commit()
    newest = provenance.last_change()
    # the reader judges from what changed whether a stale result is still worth reading
    change = f"{newest[:7]} (\"{provenance.subject(newest)}\")" if newest else "unknown"
    lines = [
        "# srope report: the paper's numbers beside ours",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M %Z')} at commit {head[:7] if head else 'unknown'}{' (uncommitted changes)' if dirty else ''} "
        f"from {', '.join(f'`{d}`' for d in dirs)}. The model/op code last changed in {change}; "
        "results from older commits are marked stale (†), results without a commit unknown (‡).",
        "",
        "The paper's values come from one checked-in table, `srope.lab.report.paper` (v3 unless marked; every entry names its figure or table).",
        "",
        "| experiment | paper | verdicts | rows (seeds) | stale† | unknown‡ |",
        "|---|---|---|---|---|---|",
    ]
    for page in pages:
        paper_rows = [r for r in page.rows if r.experiment in paper.EXPERIMENTS]
        verdicts = _verdict_counts(page.verdicts) or "no results"
        seeds = sum(len(r.runs) for r in paper_rows)
        lines.append(f"| [{page.title}]({page.name}.md) | {page.source or '–'} | {verdicts} | {len(paper_rows)} ({seeds}) | "
                     f"{sum(r.stale for r in paper_rows)} | {sum(r.unknown for r in paper_rows)} |")
    lines += ["", "## Verdicts"]
    for page in pages:
        lines += ["", f"### {page.title}", ""]
        for panel, group, verdict in page.verdicts:
            where = " / ".join(x for x in (_short_panel(panel), group) if x)
            lines.append(f"- {where}: {verdict.line()}")
        if not page.verdicts:
            lines.append("- no results")
    lines += ["", "## Rules", "", *(f"- {name}: {rule}" for name, rule in rules().items()), "",
              f"An ordering \"A beats B\" needs a difference larger than the larger seed sd and than {MARGIN} (synthetic accuracies) or 0 (LM).", "",
              "## Files", "", f"Read {len(collected.read)} result files. Skipped {len(collected.skipped)} JSON files that are no srope result:"]
    skipped_dirs: dict[Path, int] = {}
    for path in collected.skipped:
        skipped_dirs[path.parent] = skipped_dirs.get(path.parent, 0) + 1
    here = Path.cwd()
    lines += [f"- `{folder.relative_to(here) if folder.is_relative_to(here) else folder}`: {count}" for folder, count in sorted(skipped_dirs.items())] or ["- none"]
    return "\n".join(lines) + "\n"
