"""Markdown tables and cells of the report pages: numbers, budgets, provenance marks and footnotes."""

from __future__ import annotations

import math
from collections.abc import Callable

from srope.lab.report import paper
from srope.lab.report.records import Run, marks
from srope.lab.report.rows import Row


STALE_NOTE = ("† stale: the model or op code (src/srope/ops, modules, layers, models) changed after the commit that produced this result "
              "(`srope.lab.provenance.is_stale`); re-run it at HEAD before trusting it.")
UNKNOWN_NOTE = "‡ provenance unknown: the result records no commit (it predates `srope.lab.provenance`); treat it as stale."
DIRTY_NOTE = "+dirty: src/ had uncommitted changes when the result was made, so its commit does not pin the code."


def _table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    return "\n".join(lines)


def fmt(stat: tuple[float, float | None, int] | None, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± sd`` (no sd with one seed); ``–`` when there is no value."""
    if stat is None:
        return "–"
    mean, sd, _ = stat
    text = f"{scale * mean:.{digits}f}"
    return text + (f" ± {scale * sd:.{digits}f}" if sd is not None else "")


def _short(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value >= 1e9:
        return f"{value / 1e9:.3g}B"
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


def share(fraction: float) -> str:
    """A budget fraction as a percentage with two significant digits."""
    percent = 100 * fraction
    if percent >= 99.5:
        return f"{percent:.0f}%"
    if percent >= 0.001:
        return f"{float(f'{percent:.2g}'):g}%"
    return f"{percent:.1e}%"


def differences(fields: dict, protocol: paper.Protocol) -> str:
    """Our protocol values that differ from the paper's, as ``name ours (paper theirs)``."""
    out = []
    for name, theirs in protocol.compare.items():
        ours = fields.get(name)
        if ours is None:
            continue
        same = ours == theirs or (isinstance(ours, (int, float)) and isinstance(theirs, (int, float)) and math.isclose(ours, theirs, rel_tol=1e-6))
        if not same:
            out.append(f"{name} {_short(ours)} (paper {_short(theirs)})")
    return "; ".join(out) or "none found"


def budget_cell(row: Row, protocol: paper.Protocol) -> str:
    values = sorted({r.budget for r in row.runs if r.budget})
    if not values:
        return "unknown"
    text = " / ".join(share(v / protocol.budget) for v in values)
    return text


def provenance_cell(row: Row) -> str:
    return marks(row.provenance)


def seeds_cell(row: Row) -> str:
    repeated = len(set(map(str, row.seeds))) < len(row.seeds)
    return f"{len(row.runs)} ({', '.join(str(s) for s in row.seeds)}{'; a seed repeated: runs that differ only in how they ran' if repeated else ''})"


def paper_cell(exp: paper.Experiment | None, row_name: str | None, column: str, scale: float = 1.0) -> str:
    if exp is None:
        return "no counterpart in the paper"
    entry = exp.value(row_name, column) if row_name else None
    if entry is None:
        return "not in the paper" if exp.numbers else "no claim for this row"
    if entry.value is None:
        return f"no numbers; claim: {entry.claim}"
    return f"{entry.value * scale:g}"


def _label_cell(row: Row) -> str:
    marks = ("†" if row.stale else "") + ("‡" if row.unknown else "")
    shown = [n for n in row.notes if n in ("incomplete", "diverged") or n.startswith("eval set") or "(max_steps)" in n]
    shown += [row.time_limit] if row.time_limit else []
    extra = f" ({', '.join(shown)})" if shown else ""
    return row.label + marks + extra


def _footnotes(rows: list[Row]) -> str:
    notes = []
    if any(r.stale for r in rows):
        notes.append(STALE_NOTE)
    if any(r.unknown for r in rows):
        notes.append(UNKNOWN_NOTE)
    if any(p.dirty for r in rows for p in r.provenance):
        notes.append(DIRTY_NOTE)
    return "\n\n".join(notes)


def holds_up_to(curve: tuple[list, list] | None, threshold: float) -> int | None:
    """The longest length up to which the accuracy at every evaluated length is ≥ ``threshold``
    (None: not even at the shortest, or no curve)."""
    if not curve:
        return None
    longest = None
    for length, acc in zip(*curve):
        if acc < threshold:
            break
        longest = length
    return longest


def _percent(run: Run, metric: str) -> str:
    value = run.metrics.get(metric)
    return f"{100 * value:.1f}" if isinstance(value, (int, float)) else "–"


def _every_run(group: list[Row], columns: list[tuple[str, Callable[[Run], str]]]) -> str:
    """One line per run (seed) of the rows' means, with when a time limit ended it."""
    body = []
    for row in group:
        for run in row.runs:
            stopped = "; ".join(f"at {s:,} of {p:,} steps" for s, p in run.time_limited) or "–"
            body.append([row.label, str(run.seed), stopped, *(cell(run) for _, cell in columns), marks(run.provenance)])
    return _table(["variant", "seed", "time limit", *(header for header, _ in columns), "provenance"], body)
