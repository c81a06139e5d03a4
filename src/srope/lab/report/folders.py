"""Tables of ``srope synth`` result folders, one row per folder and setting: what ``srope synth``
prints when its sweep ends, and what ``srope report --by-folder`` adds to each task's page.

Where the experiment pages pool folders into one row per variant (best optimiser point, mean
over seeds), these show each folder as it is: its best learning rate, seed count and lengths,
and for MAD the paper's Table-1 row under ours. A task's page module (the task registry's
``report``) brings its table (``folder_table(results_list)``, ``FOLDER_TITLE``, ``FOLDER_NOTE``);
a task without one gets each setting's score. Every row names the commit that produced it and
marks results that are stale or have no provenance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from srope.lab.report.cells import STALE_NOTE, UNKNOWN_NOTE, _table
from srope.lab.report.records import marks, read_provenance
from srope.lab.tasks.registry import tasks

RESULTS_FILE = "results.json"


def load_results(path: Path | str) -> dict:
    """A result folder's ``results.json``; an unfinished sweep is summarised from its runs so far."""
    from srope.lab.tasks.summary import summarize

    path = Path(path)
    file = path / RESULTS_FILE if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"no {RESULTS_FILE} in {path}")
    try:
        results = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not a srope synth result ({error}); give a result folder or its {RESULTS_FILE}") from None
    if not isinstance(results, dict) or "task" not in results:
        raise ValueError(f"{file}: not a srope synth result (no 'task'); give a result folder or its {RESULTS_FILE}")
    if "summary" not in results and results.get("runs"):
        results["summary"] = summarize(results["runs"])
        module = tasks[results["task"]].load() if results["task"] in tasks else None
        if hasattr(module, "aggregate"):  # MAD's mean per task
            results["aggregate"] = module.aggregate(results["summary"])
    return results


def pct(value: float | None, spread: float | None = None) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    text = f"{100 * value:.1f}"
    return text + (f" ± {100 * spread:.1f}" if spread else "")


def status(results: dict) -> str:
    """`` (incomplete)`` for a sweep still running, and the provenance marker: the commit,
    ``†`` when the model code changed after it, ``‡`` when the result records no commit."""
    return ("" if results.get("complete") else " (incomplete)") + f" [{marks(read_provenance(results))}]"


def seeds_spread(entry: dict, key: str) -> tuple[float | None, float | None]:
    """Mean over seeds of a scalar (for ``score`` the std too)."""
    if key == "score":
        return entry["score_mean"], entry["score_std"] or None
    return entry["scalars"].get(key), None


def scores_table(results_list: list[dict]) -> str:
    """A registered task without a table of its own: each setting's score."""
    rows = [[res["label"] + status(res), name, pct(*seeds_spread(entry, "score")), f"{entry['lr']:g}", str(len(entry["seeds"]))]
            for res in results_list for name, entry in res.get("summary", {}).items()]
    return _table(["model", "setting", "score", "lr", "seeds"], rows)


def task_tables(task: str, results_list: list[dict]) -> list[str]:
    """The paragraphs of one task's table: title and table, the page's note on the paper's
    numbers, the provenance footnotes and what the runs cost."""
    module = tasks[task].report_module() if task in tasks else None
    title = getattr(module, "FOLDER_TITLE", task)
    parts = [f"### {title}\n\n{getattr(module, 'folder_table', scores_table)(results_list)}"]
    if getattr(module, "FOLDER_NOTE", None):
        parts.append(module.FOLDER_NOTE)
    shown = marks([p for r in results_list for p in read_provenance(r)])
    parts += [note for note, mark in ((STALE_NOTE, "†"), (UNKNOWN_NOTE, "‡")) if mark in shown]
    seconds = sum(r.get("seconds", 0.0) for r in results_list)
    devices = sorted({r.get("device_name") or r.get("device", "?") for r in results_list})
    parts.append(f"Runs: {sum(len(r['runs']) for r in results_list)}, {seconds:.0f} s in total, on {', '.join(devices)}.")
    return parts


def by_task(results: Iterable[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for res in results:
        grouped.setdefault(res["task"], []).append(res)
    return grouped


def folder_tables(dirs: Iterable[Path | str]) -> str:
    """Markdown: one table per task over the result folders ``dirs``."""
    loaded = [load_results(d) for d in dirs]
    if not loaded:
        raise ValueError("give at least one result folder")
    return "\n\n".join(part for task, results_list in by_task(loaded).items() for part in task_tables(task, results_list)) + "\n"


def add_to_pages(pages: list, files: Iterable[Path]) -> None:
    """Append to each task's page (``srope report --by-folder``) its table of the ``srope synth``
    result folders among ``files``."""
    loaded = [load_results(path) for path in files if path.name == RESULTS_FILE]
    grouped = by_task(res for res in loaded if res["task"] in tasks)
    for page in pages:
        if page.name in grouped:
            page.markdown += "\n## Result folders, one row each\n\n" + "\n\n".join(task_tables(page.name, grouped[page.name])) + "\n"
