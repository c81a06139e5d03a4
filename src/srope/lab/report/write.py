"""Writing the report: the result folders read, one markdown page and plot per experiment,
and the index (:func:`write_report`, what ``srope report`` runs)."""

from __future__ import annotations

from pathlib import Path

from srope.lab.report.build import build_pages, index_markdown
from srope.lab.report.collect import MAX_DEPTH, collect


def write_report(dirs: list[Path | str], out: Path | str = "out/report", *, plots: bool = True, by_folder: bool = False) -> dict:
    """Read the results under ``dirs`` and write ``out/index.md``, one ``<experiment>.md``
    per experiment and its PNG; return what was written and every verdict. ``by_folder``: each
    task's page also tabulates its ``srope synth`` folders one by one."""
    if not dirs:
        raise ValueError("srope report needs at least one result folder")
    collected = collect(list(dirs))
    if not collected.read:
        raise ValueError(
            f"no results under {', '.join(map(str, dirs))}: expected the JSON files of srope synth, train, sweep-lr, eval, demo or "
            f"lm-eval (searched {MAX_DEPTH} folders deep, hidden folders skipped)"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pages = build_pages(collected, by_folder=by_folder)
    written = []
    for page in pages:
        if plots and page.rows:
            from srope.lab.report.plots import plot_page

            png = plot_page(page, out / f"{page.name}.png")
            if png is not None:
                page.plot = png.name
                page.markdown = page.markdown.replace("\n", f"\n\n![{page.title}]({png.name})\n", 1)
        (out / f"{page.name}.md").write_text(page.markdown)
        written.append(out / f"{page.name}.md")
    index = index_markdown(pages, collected, [Path(d) for d in dirs])
    (out / "index.md").write_text(index)
    return {"index": out / "index.md", "pages": written, "plots": [out / p.plot for p in pages if p.plot],
            "verdicts": {p.name: [(panel, group, v.status, v.why) for panel, group, v in p.verdicts] for p in pages}}
