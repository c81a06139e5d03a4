"""A sweep's summary: per setting, the optimiser point with the best mean score over seeds."""

from __future__ import annotations

import numpy as np


def _curve_stats(records: list[dict]) -> dict:
    out = {}
    for name, first in records[0]["metrics"].get("curves", {}).items():
        ys = np.array([r["metrics"]["curves"][name]["y"] for r in records], dtype=np.float64)
        out[name] = {"x": first["x"], "mean": ys.mean(0).tolist(), "min": ys.min(0).tolist(), "max": ys.max(0).tolist()}
    return out


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per setting: the optimiser point with the best mean score over seeds, and its stats."""
    by_setting: dict[str, dict[tuple, list[dict]]] = {}
    for run in runs:
        by_setting.setdefault(run["setting"], {}).setdefault((run["lr"], run["weight_decay"]), []).append(run)
    summary = {}
    for name, grid in by_setting.items():
        means = {point: float(np.mean([r["score"] for r in recs])) for point, recs in grid.items()}
        point = max(means, key=means.get)
        recs = grid[point]
        scores = [r["score"] for r in recs]
        scalar_keys = [k for k, v in recs[0]["metrics"].items() if k != "curves" and isinstance(v, (int, float))]
        summary[name] = {
            "group": recs[0]["group"], "x": recs[0]["x"], "lr": point[0], "weight_decay": point[1],
            "score_mean": float(np.mean(scores)), "score_std": float(np.std(scores)), "scores": scores, "seeds": [r["seed"] for r in recs],
            "scalars": {k: float(np.mean([r["metrics"][k] for r in recs])) for k in scalar_keys},
            # the last evaluation's, where a task reports another (select best / min_loss)
            "final_scalars": {k: float(np.mean([r["final"][k] for r in recs])) for k in scalar_keys if all(k in r.get("final", {}) for r in recs)},
            "curves": _curve_stats(recs),
            "grid": [{"lr": p[0], "weight_decay": p[1], "score_mean": m} for p, m in sorted(means.items())],
        }
    return summary
