"""Tables, verdicts and the index of ``srope report``.

Rows: the runs of one variant under one protocol (:class:`srope.lab.report.collect.Run`, one per
seed) make a row: the mean ± sd over seeds (sample sd, n−1; none with one seed), the number
of seeds, the paper's value or claim beside it, the protocol differences, our budget as a
share of the paper's, and the provenance of every file behind the row (stale and unknown
provenance are marked, with footnotes). The copying and state-tracking pages list every run
below the means: the seeds are few and far apart, and the longest length a run copies or
tracks says more than a mean near zero.

Verdicts: each protocol group (runs that share a protocol) gets one line, "reproduced",
"not reproduced", "inconclusive (why)" or "not comparable (why)", by the rule :data:`RULES`
states for the experiment. A verdict is only as good as its test: the copying, MQAR and
state-tracking rules first check that the runs are a valid test (:data:`VALIDITY`: the released
configuration, enough of the protocol's steps, and for copying and MQAR a baseline that learns
where the paper's does) and say "inconclusive" with the reason when they are not. "A beats B"
means A's mean exceeds B's by more than the larger of the two seed sds and :data:`MARGIN`; with
one seed the spread is unknown, and the verdict says so.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from srope.lab.report import paper
from srope.lab.report.collect import OUR_RECIPE, Collected, Provenance, Run, marks

MARGIN = 0.01  # accuracies in [0, 1]: smaller differences are not an ordering
LEARNS, FAILS, EXTRAPOLATES = 0.99, 0.9, 0.9  # state tracking: the protocol's stopping threshold; "does not learn" below 0.9
COPY_EXTRAPOLATES = 0.5  # copying: string accuracy beyond the training length that counts as extrapolating
COPY_FITS = 0.9  # copying: string accuracy at the training lengths every arm needs for a valid test
MQAR_LEARNS = 0.5  # MQAR: query accuracy some arm needs at 512 x 64 for a valid test
# The least share of the protocol's steps a run of a valid test trains (a run that met its
# stopping threshold counts as whole): the released protocols of copying and MQAR are cheap
# enough to run in full; state tracking's (48,900-195,400 steps) is asked at a tenth, with
# its schedule planned over the steps run (max_steps).
MIN_STEPS_SHARE = {"copying": 1.0, "mqar": 1.0, "state_tracking": 0.1}
VALIDITY = (
    "A test is valid when every run behind it used a release-exact preset without leaving the released configuration "
    "(`srope synth TASK --preset release`; docs/release-presets.md) and trained at least "
    + ", ".join(f"{v:.0%} ({k.replace('_', ' ')})" for k, v in MIN_STEPS_SHARE.items())
    + f" of its protocol's steps; for copying every arm also copies at least {COPY_FITS:.0%} of the strings at the training lengths, "
    f"for MQAR some arm reaches {MQAR_LEARNS:.0%} at sequence 512 / 64 KV pairs. Otherwise the verdict is \"inconclusive\" with the reason."
)

RULES = {
    "copying": (
        f"Reproduced when Selective RoPE's (best variant's) string accuracy on strings longer than the training strings is at least "
        f"{COPY_EXTRAPOLATES} and beats NoPE's and RoPE's (Fig. 5's claim: it extrapolates, RoPE does not); not comparable without all three encodings."
    ),
    "mqar": (
        "Reproduced when, at sequence 512 with 64 KV pairs (the paper's only panel), Selective RoPE's accuracy averaged over the model widths that all "
        "three encodings ran beats NoPE's and RoPE's (Fig. 6's claim: the greatest improvement over NoPE); not comparable without that setting or an encoding."
    ),
    "state_tracking": (
        f"\"Learns\": mean sequence accuracy at the training length >= {LEARNS} (the protocol's stopping threshold); \"does not learn\": below {FAILS}; "
        f"\"extrapolates\": >= {EXTRAPOLATES} at the evaluation length. GLA S2 is reproduced when Selective RoPE learns and extrapolates and NoPE and RoPE "
        "do not learn; Transformer S2 when Selective RoPE learns and NoPE and RoPE do not; DeltaNet A3 when Selective RoPE learns. A panel the text "
        "makes no claim about is not comparable."
    ),
    "mad": (
        "Numbers are comparable only over all 66 settings (the paper averages them). Ordering: reproduced when every Selective RoPE variant's average "
        "beats NoPE's and the best Selective RoPE variant is not beaten by RoPE (v3's text: improves over NoPE, matches or improves upon RoPE); "
        "with fewer settings the ordering is checked on the settings every variant ran and the verdict is \"not comparable\" with that ordering stated."
    ),
    "lm": (
        "Comparable only with lm-eval's six zero-shot accuracies (Table 3's Avg) for NoPE, RoPE and Selective RoPE: reproduced when the encoding with the "
        "paper's best Avg in that block also has our best Avg and beats the others (for the ablation: \"+ phase gate\" > \"+ SiLU\" > \"Baseline\" in Avg, "
        "Table 2's order). Perplexity on another corpus or at another scale is shown, with its ordering, but is not comparable."
    ),
}
STALE_NOTE = ("† stale: the model or op code (src/srope/ops, modules, layers, models) changed after the commit that produced this result "
              "(`srope.lab.provenance.is_stale`); re-run it at HEAD before trusting it.")
UNKNOWN_NOTE = "‡ provenance unknown: the result records no commit (it predates `srope.lab.provenance`); treat it as stale."
DIRTY_NOTE = "+dirty: src/ had uncommitted changes when the result was made, so its commit does not pin the code."


@dataclass
class Verdict:
    status: str  # "reproduced", "not reproduced", "inconclusive", "not comparable"
    why: str

    def line(self) -> str:
        return f"**{self.status}**: {self.why}"


# ---------------------------------------------------------------------------------------
# Rows


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


# ---------------------------------------------------------------------------------------
# Formatting


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


def _beats(a: tuple | None, b: tuple | None, margin: float = MARGIN) -> bool:
    if a is None or b is None:
        return False
    spread = max(a[1] or 0.0, b[1] or 0.0)
    return a[0] - b[0] > max(spread, margin)


def _caveats(rows: Iterable[Row]) -> str:
    rows = list(rows)
    out = " (one seed: the spread is unknown)" if any(len(r.runs) < 2 for r in rows) else ""
    if any(r.time_limit for r in rows):
        out += " (runs ended by a time limit before their planned steps, see the budget column: not learning there says little)"
    return out


def _by_paper_row(rows: list[Row], metric: str) -> dict[str, Row]:
    """Per paper row the variant with the best mean of ``metric`` (Selective RoPE with and
    without gate or bias are all the paper's Selective RoPE in a figure)."""
    out: dict[str, Row] = {}
    for row in rows:
        if row.paper_row is None:
            continue
        best = out.get(row.paper_row)
        if best is None or (row.mean(metric) or -1) > (best.mean(metric) or -1):
            out[row.paper_row] = row
    return out


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


# ---------------------------------------------------------------------------------------
# Experiments


@dataclass
class Page:
    name: str
    title: str
    markdown: str
    verdicts: list[tuple[str, str, Verdict]]  # (panel, group, verdict)
    rows: list[Row]
    plot: str | None = None


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


def copying_page(rows: list[Row]) -> Page:
    exp = paper.COPYING
    mine, parts = _opening("copying", "Copying", exp, rows)
    verdicts = []
    for group in _by_group(mine).values():
        title = group[0].title
        train_len = group[0].train_len
        body = []
        for row in group:
            curve = _mean_curve(row, "str_acc_by_length")
            longest = f"{100 * curve[1][-1]:.1f} @ {curve[0][-1]}" if curve else "–"
            body.append([_label_cell(row), fmt(row.stat("str_acc_train_range")), fmt(row.stat("str_acc_extrapolation")), fmt(row.stat("char_acc_extrapolation")),
                         longest, seeds_cell(row), paper_cell(exp, row.paper_row, "str_acc_extrapolation"), differences(row.fields, exp.protocol),
                         budget_cell(row, exp.protocol), provenance_cell(row)])
        verdict = copying_verdict(group)
        verdicts.append(("", title, verdict))
        parts += [f"## {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "",
                  _table(["variant", f"str acc ≤ {train_len}, %", f"str acc > {train_len}, %", f"char acc > {train_len}, %", "str acc @ longest, %", "seeds",
                          f"paper ({exp.source.split(' (')[0]})", "protocol differences", "budget", "provenance"], body), "",
                  "Every run:", "", _copying_runs_table(group, train_len), ""]
    if not mine:
        parts.append("No copying results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment != "copying"])]
    return Page("copying", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows)


EXTRAPOLATION_LENGTHS = {"str_acc_by_length": (1.25, 1.5), "char_acc_by_length": (2, 4, 8)}  # multiples of the training length
COPIES = 0.9  # string accuracy that counts as copying a length


def _at_or_after(x: list, length: float) -> int | None:
    """The index of the first evaluated length ≥ ``length`` (None: evaluated only shorter)."""
    return next((i for i, v in enumerate(x) if v >= length), None)


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


def _copying_runs_table(group: list[Row], train_len: int | None) -> str:
    """Each run's longest length copied and its accuracies at a few multiples of the training length."""
    first = next((r.curves for row in group for r in row.runs if r.curves), {})
    columns: list[tuple[str, Callable[[Run], str]]] = [
        (f"str acc ≤ {train_len}, %", lambda run: _percent(run, "str_acc_train_range")),
        (f"longest length with str acc ≥ {COPIES}", lambda run: str(holds_up_to(run.curves.get("str_acc_by_length"), COPIES) or "–")),
    ]
    for name, multiples in EXTRAPOLATION_LENGTHS.items():
        x = first.get(name, ([], []))[0]
        picked = list(dict.fromkeys(i for m in multiples if train_len and (i := _at_or_after(x, m * train_len)) is not None))
        if picked:
            def at_lengths(run: Run, name=name, picked=picked) -> str:
                y = run.curves.get(name, ([], []))[1]
                return " / ".join(f"{100 * y[i]:.1f}" if i < len(y) else "–" for i in picked)
            columns.append((f"{name.split('_')[0]} acc @ {' / '.join(str(x[i]) for i in picked)}, %", at_lengths))
    columns.append((f"str / char acc > {train_len}, %", lambda run: f"{_percent(run, 'str_acc_extrapolation')} / {_percent(run, 'char_acc_extrapolation')}"))
    return _every_run(group, columns)


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


def invalid_test(family: str, rows: Iterable[Row]) -> str | None:
    """Why ``rows`` are not a valid test of the paper's claim (release and budget), or None."""
    floor = MIN_STEPS_SHARE[family]
    for row in rows:
        differences = [r.release_differences for r in row.runs]
        if any(d is None for d in differences):
            return f"{row.label} did not run a release-exact preset ({row.group.split(',')[0]})"
        left = sorted({d for ds in differences for d in ds})
        if left:
            return f"{row.label} leaves the released configuration ({'; '.join(left)})"
        shares = [r.steps_share for r in row.runs]
        if any(s is None for s in shares):
            return f"{row.label}: its records do not say how much of the protocol's steps it trained"
        if min(shares) < floor:
            return f"{row.label} trained {share(min(shares))} of the protocol's steps (a valid test trains at least {share(floor)})"
    return None


def _inconclusive(why: str, said: str) -> Verdict:
    return Verdict("inconclusive", f"{why}; {said}")


def copying_verdict(group: list[Row]) -> Verdict:
    best = _by_paper_row(group, "str_acc_extrapolation")
    missing = [name for name in ("NoPE", "RoPE", "Selective RoPE") if name not in best]
    if missing:
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    sel, nope, rope = (best[n].stat("str_acc_extrapolation") for n in ("Selective RoPE", "NoPE", "RoPE"))
    if None in (sel, nope, rope):
        return Verdict("not comparable", "no accuracy beyond the training length (evaluated only up to it)")
    said = f"string accuracy beyond the training length: Selective RoPE ({best['Selective RoPE'].label}) {fmt(sel)}%, NoPE {fmt(nope)}%, RoPE {fmt(rope)}%"
    unfit = [f"{name} {fmt(best[name].stat('str_acc_train_range'))}%" for name in ("NoPE", "RoPE", "Selective RoPE")
             if (best[name].stat("str_acc_train_range") or (0.0,))[0] < COPY_FITS]
    why = invalid_test("copying", best.values()) or (
        f"not every arm fits the training lengths (string accuracy there: {', '.join(unfit)}; a valid test needs {COPY_FITS:.0%})" if unfit else None)
    if why:
        return _inconclusive(why, said + _caveats(best.values()))
    ok = sel[0] >= COPY_EXTRAPOLATES and _beats(sel, nope) and _beats(sel, rope)
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(best.values()))


def _mean_curve(row: Row, name: str) -> tuple[list, list] | None:
    curves = [r.curves[name] for r in row.runs if name in r.curves and r.curves[name][0]]
    if not curves:
        return None
    x = curves[0][0]
    ys = [c[1] for c in curves if list(c[0]) == list(x)]
    return list(x), [statistics.fmean(v) for v in zip(*ys)]


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


def mqar_page(rows: list[Row]) -> Page:
    exp = paper.MQAR
    mine, parts = _opening("mqar", "MQAR", exp, rows)
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
    return Page("mqar", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows)


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
    why = invalid_test("mqar", by_name.values()) or (
        f"no encoding learns sequence 512 / 64 KV pairs at any width run (best {100 * learned:.1f}%; a valid test needs one at {MQAR_LEARNS:.0%}), "
        "so the base model cannot tell the encodings apart" if learned < MQAR_LEARNS else None)
    if why:
        return _inconclusive(why, said + _caveats(by_name.values()))
    ok = _beats(sel, nope) and _beats(sel, rope)
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(by_name.values()))


def state_tracking_page(rows: list[Row]) -> Page:
    parts = ["# State tracking (v3 Fig. 7 (v1 Fig. 8))", "", f"Rule: {RULES['state_tracking']}", "", f"Validity: {VALIDITY}", ""]
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
    return Page("state_tracking", "State tracking (S2 parity, A3)", "\n".join(parts).rstrip() + "\n", verdicts, rows)


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
    why = invalid_test("state_tracking", best.values())
    if why:
        return _inconclusive(why, said + _caveats(best.values()))
    return Verdict("reproduced" if ok else "not reproduced", said + _caveats(best.values()))


def mad_page(rows: list[Row]) -> Page:
    exp = paper.MAD
    mine, parts = _opening("mad", "MAD", exp, rows)
    columns = [*paper.MAD_TASK_ORDER, "average"]
    parts += ["Cells: ours (mean ± sd over seeds of the protocol score, %) and the paper's Table 1 value in brackets.", ""]
    verdicts = []
    for group in _by_group(mine).values():
        title = group[0].title
        body = []
        for row in group:
            cells = []
            for column in columns:
                theirs = exp.value(row.paper_row, column) if row.paper_row else None
                count = row.mean(f"n:{column}")
                cells.append(fmt(row.stat(column)) + (f" [{count:.0f}]" if count and column != "average" else "") + (f" ({theirs.value:g})" if theirs else ""))
            settings = sum(int(row.mean(f"n:{t}") or 0) for t in paper.MAD_TASK_ORDER)
            body.append([_label_cell(row), row.paper_row or "–", *cells, f"{settings}/{paper.MAD_SETTINGS}", seeds_cell(row),
                         differences(row.fields, exp.protocol), budget_cell(row, exp.protocol), provenance_cell(row)])
        verdict = mad_verdict(group)
        verdicts.append(("", title, verdict))
        parts += [f"## {title}", "", _folders(group), "", f"Verdict: {verdict.line()}", "",
                  _table(["variant", "paper row", *[paper.MAD_SHORT[c] + " [settings]" if c != "average" else "Average" for c in columns], "settings", "seeds",
                          "protocol differences", "budget", "provenance"], body), ""]
    if not mine:
        parts.append("No MAD results were found.")
    parts += [_footnotes(mine), _no_counterpart([r for r in rows if r.experiment != "mad"])]
    return Page("mad", exp.title, "\n".join(parts).rstrip() + "\n", verdicts, rows)


def mad_verdict(group: list[Row]) -> Verdict:
    named = [r for r in group if r.paper_row]
    kinds = {r.paper_row for r in named}
    sels = [r for r in named if r.paper_row not in ("NoPE", "RoPE")]
    if "NoPE" not in kinds or "RoPE" not in kinds or not sels:
        missing = [n for n, ok in (("NoPE", "NoPE" in kinds), ("RoPE", "RoPE" in kinds), ("Selective RoPE", bool(sels))) if not ok]
        return Verdict("not comparable", f"{', '.join(missing)} not run under this protocol")
    common = set.intersection(*[{k[2:] for r in row.runs for k in r.metrics if k.startswith("s:")} for row in named])
    if not common:
        return Verdict("not comparable", "no MAD setting that every variant ran")
    from srope.lab.report.collect import mad_scores

    def average(row: Row) -> tuple:
        per_seed = [mad_scores({s: r.metrics[f"s:{s}"] for s in common if f"s:{s}" in r.metrics})["average"] for r in row.runs]
        return statistics.fmean(per_seed), (statistics.stdev(per_seed) if len(per_seed) > 1 else None), len(per_seed)

    avg = {id(r): average(r) for r in named}
    nope = next(avg[id(r)] for r in named if r.paper_row == "NoPE")
    rope = next(avg[id(r)] for r in named if r.paper_row == "RoPE")
    best_sel = max(sels, key=lambda r: avg[id(r)][0])
    above_nope = all(_beats(avg[id(r)], nope) for r in sels)
    not_below_rope = not _beats(rope, avg[id(best_sel)])
    said = (f"average over the {len(common)} settings all variants ran: NoPE {fmt(nope)}, RoPE {fmt(rope)}, "
            + ", ".join(f"{r.paper_row} {fmt(avg[id(r)])}" for r in sels)
            + f"; every Selective RoPE variant beats NoPE: {'yes' if above_nope else 'no'}; the best ({best_sel.paper_row}) is not beaten by RoPE: "
            + ("yes" if not_below_rope else "no"))
    ordering = above_nope and not_below_rope
    if len(common) < paper.MAD_SETTINGS:
        return Verdict("not comparable", f"{len(common)}/{paper.MAD_SETTINGS} settings (the paper averages all 66); the paper's ordering "
                       f"{'holds' if ordering else 'does not hold'} on them: {said}" + _caveats(named))
    return Verdict("reproduced" if ordering else "not reproduced", said + _caveats(named))


def lm_page(rows: list[Row]) -> Page:
    parts = ["# Language modelling (v3 Tables 2 and 3)", "", f"Rule: {RULES['lm']}", ""]
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
    return Page("lm", "Language modelling", "\n".join(parts).rstrip() + "\n", verdicts, rows)


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


# ---------------------------------------------------------------------------------------
# The whole report

PAGES = (("copying", copying_page), ("mqar", mqar_page), ("state_tracking", state_tracking_page), ("mad", mad_page), ("lm", lm_page))


def family(experiment: str) -> str:
    return experiment.split("/")[0]


def build_pages(collected: Collected) -> list[Page]:
    rows = _rows(collected.runs)
    for experiment in {r.experiment for r in rows}:
        groups = _by_group([r for r in rows if r.experiment == experiment])
        titles = _titles(groups.values())
        for key, group in groups.items():
            for row in group:
                row.title = titles[key]
    pages = []
    for name, builder in PAGES:
        pages.append(builder([r for r in rows if family(r.experiment) == name]))
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
        sources = {"copying": paper.COPYING.source, "mqar": paper.MQAR.source, "state_tracking": "v3 Fig. 7", "mad": paper.MAD.source, "lm": "v3 Tables 2, 3"}
        seeds = sum(len(r.runs) for r in paper_rows)
        lines.append(f"| [{page.title}]({page.name}.md) | {sources[page.name]} | {verdicts} | {len(paper_rows)} ({seeds}) | "
                     f"{sum(r.stale for r in paper_rows)} | {sum(r.unknown for r in paper_rows)} |")
    lines += ["", "## Verdicts"]
    for page in pages:
        lines += ["", f"### {page.title}", ""]
        for panel, group, verdict in page.verdicts:
            where = " / ".join(x for x in (_short_panel(panel), group) if x)
            lines.append(f"- {where}: {verdict.line()}")
        if not page.verdicts:
            lines.append("- no results")
    lines += ["", "## Rules", "", *(f"- {name}: {rule}" for name, rule in RULES.items()), "",
              f"An ordering \"A beats B\" needs a difference larger than the larger seed sd and than {MARGIN} (synthetic accuracies) or 0 (LM).", "",
              "## Files", "", f"Read {len(collected.read)} result files. Skipped {len(collected.skipped)} JSON files that are no srope result:"]
    skipped_dirs: dict[Path, int] = {}
    for path in collected.skipped:
        skipped_dirs[path.parent] = skipped_dirs.get(path.parent, 0) + 1
    here = Path.cwd()
    lines += [f"- `{folder.relative_to(here) if folder.is_relative_to(here) else folder}`: {count}" for folder, count in sorted(skipped_dirs.items())] or ["- none"]
    return "\n".join(lines) + "\n"
