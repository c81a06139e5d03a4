"""Whether a run is the authors' released configuration: what a valid verdict needs.

A task module lists its release-exact presets (``RELEASE_PRESETS``: equal field by field to the
release, as ``docs/release-presets.md`` cites it) and the settings a single run may choose
without leaving the release (``RELEASE_VARIES``: a setting name, dotted into ``model.`` and
``position.<type>.``, mapped to the values the release sweeps over, or None for any value,
such as the seeds, the learning rate of the release's grid or the encoding). Budget settings
(``max_steps``, ``max_seconds``) are not differences here: the report judges the steps a run
made against the protocol's (``protocol_steps`` in each run record).
"""

from __future__ import annotations

from typing import Any

# How a run is executed, not what it computes (or a budget, judged apart).
NOT_PROTOCOL = frozenset({
    "max_steps", "max_seconds", "checkpoint_every", "save_weights", "loss_every", "cuda_graph", "head_at_targets", "threads", "eval_batch_size",
})


def zoology_batch_size(seq_len: int) -> int:
    """Zoology's batch size by sequence length (its Figure-2 configs; MQAR's ``batch_size=0``).
    Here, not in :mod:`srope.lab.tasks.mqar`, so that the report reads it without torch."""
    return 64 if seq_len >= 1024 else 128 if seq_len >= 512 else 256 if seq_len >= 256 else 512


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def differences(module: Any, preset_name: str, cfg: Any) -> list[str] | None:
    """``None`` when ``preset_name`` is not one of the task's release-exact presets; else the
    settings of ``cfg`` that leave the release (``"name: release -> ours"``), empty when none."""
    if preset_name not in getattr(module, "RELEASE_PRESETS", ()):
        return None
    varies = getattr(module, "RELEASE_VARIES", {})
    release, ours = _flat(module.PRESETS[preset_name].to_dict()), _flat(cfg.to_dict())
    out = []
    for key in sorted(set(release) | set(ours)):
        if key in NOT_PROTOCOL or release.get(key) == ours.get(key):
            continue
        if key in varies and (varies[key] is None or all(v in varies[key] for v in (ours.get(key) if isinstance(ours.get(key), list) else [ours.get(key)]))):
            continue
        out.append(f"{key}: {release.get(key)!r} -> {ours.get(key)!r}")
    return out
