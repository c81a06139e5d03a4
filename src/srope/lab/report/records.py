"""The records ``srope report`` reads results into: one :class:`Run` per trained model, with its :class:`Provenance`."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srope.registry import positions

OUR_RECIPE = "our recipe"  # how a protocol group that is not the paper's protocol says so (srope demo's)


def label_of(kind: Any, default: Any = None) -> Any:
    """A position encoding's label in reports (:data:`srope.registry.positions`), else ``default``."""
    return positions[kind].label if isinstance(kind, str) and kind in positions else default


@dataclass(frozen=True)
class Provenance:
    commit: str | None
    dirty: bool | None = None
    stale: bool | None = None  # None: cannot tell (no commit, or not a checkout)

    @property
    def known(self) -> bool:
        return bool(self.commit)

    def mark(self) -> str:
        if not self.commit:
            return "unknown‡"
        text = self.commit[:7] + ("+dirty" if self.dirty else "")
        if self.stale:
            return text + " stale†"
        return text + (" (staleness unknown)" if self.stale is None else "")


@functools.lru_cache(maxsize=None)
def _is_stale(commit: str) -> bool | None:
    from srope.lab import provenance

    return provenance.is_stale(commit)


def read_provenance(data: dict | None) -> list[Provenance]:
    """The provenance of a result file: one entry per record it holds (``srope synth`` keeps a
    list, one per call, when a sweep is resumed or split over calls; the other commands one
    record), or ``[Provenance(None)]`` when it holds none."""
    records = (data or {}).get("provenance") if isinstance(data, dict) else None
    if isinstance(records, dict):
        records = [records]
    out = []
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict) and record.get("commit"):
            commit = str(record["commit"])
            out.append(Provenance(commit, record.get("dirty"), _is_stale(commit)))
        else:
            out.append(Provenance(None))
    return list(dict.fromkeys(out)) or [Provenance(None)]


def marks(provenances: list[Provenance]) -> str:
    """``abc1234``, ``abc1234 stale†``, ``unknown‡``, ... for a list of provenances."""
    return ", ".join(dict.fromkeys(p.mark() for p in provenances)) or "unknown‡"


@dataclass
class Run:
    """One trained model (one seed) of one variant under one protocol, as the report needs it."""

    experiment: str  # a key of paper.EXPERIMENTS, or "<family>/other..." when the paper has no such panel
    group_key: str  # the protocol: runs with the same key are comparable
    group: str  # the protocol in words
    variant_key: str
    label: str  # our name for the row
    paper_row: str | None  # the paper's row this variant corresponds to
    seed: Any
    metrics: dict[str, float]
    curves: dict[str, tuple[list, list]] = field(default_factory=dict)
    budget: float | None = None  # in the paper protocol's budget unit
    fields: dict = field(default_factory=dict)  # protocol values, named as paper.Protocol.compare names them
    provenance: list[Provenance] = field(default_factory=list)
    sources: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    time_limited: list[tuple[int, int]] = field(default_factory=list)  # (steps, planned steps) of each run a time limit ended
    trained: int = 1  # how many runs (settings) this seed's numbers come from
    train_len: int | None = None
    ablation_row: str | None = None  # the LM ablation's row (v3 Table 2)
    config: dict = field(default_factory=dict)  # the protocol's settings, to tell apart groups that read alike
    histories: dict[str, tuple[list, list]] = field(default_factory=dict)  # setting -> (steps, score after each evaluation)
    # per setting, which evaluation the metrics come from: {"select", "step" (None: not recorded),
    # "steps" (trained), "final" (the last evaluation's scalars)}
    reported: list[dict] = field(default_factory=list)
    # srope.lab.tasks.release.differences of the run's sweep: None when its preset is not
    # release-exact (or the result predates release-exact presets), [] when it is the release
    release_differences: list[str] | None = None
    # the smallest share of its protocol's steps any of this seed's runs trained (a run that met
    # its stopping threshold counts as whole); None where the records do not say
    steps_share: float | None = None


@dataclass
class Collected:
    runs: list[Run]
    read: list[Path]
    skipped: list[Path]


def _key(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:10]
