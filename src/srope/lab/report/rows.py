"""Rows of the report: the runs of one variant under one protocol, grouped and titled.

Rows: the runs of one variant under one protocol (:class:`srope.lab.report.collect.Run`, one per
seed) make a row: the mean ± sd over seeds (sample sd, n−1; none with one seed), the number
of seeds, the paper's value or claim beside it, the protocol differences, our budget as a
share of the paper's, and the provenance of every file behind the row (stale and unknown
provenance are marked, with footnotes). The copying and state-tracking pages list every run
below the means: the seeds are few and far apart, and the longest length a run copies or
tracks says more than a mean near zero.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from srope.lab.report.records import Provenance, Run


class Row:
    """The runs (one per seed) of one variant under one protocol."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        first = runs[0]
        self.label, self.paper_row, self.ablation_row = first.label, first.paper_row, first.ablation_row
        self.experiment, self.group, self.group_key, self.fields = first.experiment, first.group, first.group_key, first.fields
        self.train_len = first.train_len
        self.title = first.group  # build_pages adds what tells apart groups that read alike

    def values(self, metric: str) -> list[float]:
        return [float(r.metrics[metric]) for r in self.runs if isinstance(r.metrics.get(metric), (int, float)) and math.isfinite(r.metrics[metric])]

    def stat(self, metric: str) -> tuple[float, float | None, int] | None:
        values = self.values(metric)
        if not values:
            return None
        return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)

    def mean(self, metric: str) -> float | None:
        s = self.stat(metric)
        return None if s is None else s[0]

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.runs]

    @property
    def provenance(self) -> list[Provenance]:
        return list(dict.fromkeys(p for r in self.runs for p in r.provenance))

    @property
    def stale(self) -> bool:
        return any(p.known and p.stale for p in self.provenance)

    @property
    def unknown(self) -> bool:
        return any(not p.known for p in self.provenance)

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys(n for r in self.runs for n in r.notes))

    @property
    def sources(self) -> list[Path]:
        return list(dict.fromkeys(s for r in self.runs for s in r.sources))

    @property
    def time_limit(self) -> str | None:
        """The runs a time limit ended before their planned steps, in one note (None: none)."""
        timed = [pair for r in self.runs for pair in r.time_limited]
        if not timed:
            return None
        steps, planned = sorted(s for s, _ in timed), sorted({p for _, p in timed})
        span = f"{steps[0]:,}" if steps[0] == steps[-1] else f"{steps[0]:,}–{steps[-1]:,}"
        of = f"{planned[0]:,}" if len(planned) == 1 else f"{planned[0]:,}–{planned[-1]:,}"
        runs = sum(r.trained for r in self.runs)
        return f"time limit: {span} of {of} steps" if runs == 1 else f"time limit: {len(timed)} of {runs} runs at {span} of {of} steps"


def _rows(runs: list[Run]) -> list[Row]:
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((run.experiment, run.group_key, run.variant_key), []).append(run)
    rows = [Row(sorted(g, key=lambda r: str(r.seed))) for g in groups.values()]
    order = {"NoPE": 0, "RoPE": 1}
    rows.sort(key=lambda r: (r.experiment, r.group, order.get(r.paper_row or "", 2), r.label))
    seen: dict[tuple, int] = {}
    for row in rows:  # two variants with one label (options differ) stay apart in the table
        key = (row.group_key, row.label)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            row.label += f" ({seen[key]})"
    return rows


def _by_group(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row.group_key, []).append(row)
    return out


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _titles(groups: Iterable[list[Row]]) -> dict[str, str]:
    """A title per protocol group: its description, and where two groups read alike, the
    settings that tell them apart."""
    by_text: dict[str, list[list[Row]]] = {}
    for group in groups:
        by_text.setdefault(group[0].group, []).append(group)
    titles = {}
    for text, same in by_text.items():
        flats = [_flatten(g[0].runs[0].config) for g in same]
        keys = sorted({k for f in flats for k in f if len({repr(x.get(k)) for x in flats}) > 1})
        for group, flat in zip(same, flats):
            apart = ", ".join(f"{k}={flat.get(k)}" for k in keys[:6]) + (", ..." if len(keys) > 6 else "")
            titles[group[0].group_key] = text + (f" [{apart}]" if apart else "")
    return titles


def _folders(rows: list[Row], limit: int = 6) -> str:
    here = Path.cwd()
    folders = []
    for row in rows:
        for source in row.sources:
            folder = source.parent
            try:
                folder = folder.relative_to(here)
            except ValueError:
                pass
            folders.append(str(folder))
    folders = sorted(dict.fromkeys(folders))
    text = ", ".join(f"`{f}`" for f in folders[:limit])
    return "From " + text + (f" and {len(folders) - limit} more" if len(folders) > limit else "") + "."
