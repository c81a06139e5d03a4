"""The verdict rules of ``srope report``: thresholds, validity of a test and what "A beats B" means.

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

from collections.abc import Iterable
from dataclasses import dataclass

from srope.lab.report.cells import share
from srope.lab.report.rows import Row


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
