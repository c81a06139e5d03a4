"""What the verdicts of ``srope report`` share: the :class:`Verdict`, what "A beats B" means, a valid test.

Verdicts: each protocol group (runs that share a protocol) gets one line, "reproduced",
"not reproduced", "inconclusive (why)" or "not comparable (why)", by the rule its page states.
Each page keeps its rule, thresholds and validity condition beside it (``RULE``,
``MIN_STEPS_SHARE``, ``VALIDITY`` in the task's page module, which the task registry names;
:func:`srope.lab.report.page.rules` and :func:`~srope.lab.report.page.validity` gather them).
A verdict is only as good as its test: the copying, MQAR and state-tracking rules first check
that the runs are a valid test (:func:`validity_text`: the released configuration, enough of the
protocol's steps, and for copying and MQAR a baseline that learns where the paper's does) and
say "inconclusive" with the reason when they are not. "A beats B" means A's mean exceeds B's by
more than the larger of the two seed sds and :data:`MARGIN`; with one seed the spread is
unknown, and the verdict says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from srope.lab.report.cells import share
from srope.lab.report.rows import Row


MARGIN = 0.01  # accuracies in [0, 1]: smaller differences are not an ordering


def validity_text(min_steps_share: dict[str, float], conditions: list[str]) -> str:
    """When a test is valid: what every task asks (the release, a share of the protocol's
    steps, ``min_steps_share`` by task) and the tasks' own ``conditions``."""
    steps = ", ".join(f"{v:.0%} ({k.replace('_', ' ')})" for k, v in min_steps_share.items())
    return ("A test is valid when every run behind it used a release-exact preset without leaving the released configuration "
            f"(`srope synth TASK --preset release`; docs/release-presets.md) and trained at least {steps} of its protocol's steps"
            + (f"; {', '.join(conditions)}" if conditions else "") + ". Otherwise the verdict is \"inconclusive\" with the reason.")


@dataclass
class Verdict:
    status: str  # "reproduced", "not reproduced", "inconclusive", "not comparable"
    why: str

    def line(self) -> str:
        return f"**{self.status}**: {self.why}"


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


def invalid_test(rows: Iterable[Row], floor: float) -> str | None:
    """Why ``rows`` are not a valid test of the paper's claim (the release, and at least the
    share ``floor`` of the protocol's steps), or None."""
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
