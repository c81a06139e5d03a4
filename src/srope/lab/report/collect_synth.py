"""Runs of the synthetic tasks: ``srope synth`` sweeps (best optimiser point per setting) and ``srope demo``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from srope.lab.report import paper
from srope.lab.report.records import OUR_RECIPE, Run, _key, label_of, read_provenance
from srope.lab.tasks.release import zoology_batch_size


# Config entries that do not change what a run measures (or that the report pools over). A
# wall-clock limit is not protocol either: a run it stopped says so in its row and budget; nor
# are cuda_graph and head_at_targets, which compute the same loss and update.
DECAYING_SCHEDULES = ("cosine", "cosine_epoch", "linear_warmup")  # planned over a run's steps (srope.lab.schedule)
_NOT_PROTOCOL = {"seeds", "threads", "position_type", "position", "tasks", "only", "lrs", "weight_decays", "eval_batch_size",
                 "max_seconds", "checkpoint_every", "save_weights", "cuda_graph", "head_at_targets", "loss_every"}


def paper_variant(position_type: str, options: dict, *, with_options: bool) -> str | None:
    """The paper's row name for a position encoding; MAD's Table 1 separates the Selective
    RoPE variants by phase gate and bias (``with_options``), the figures do not."""
    base = label_of(position_type)
    if position_type != "selective_rope" or not with_options:
        return base
    gate, bias = bool(options.get("gate")), bool(options.get("bias"))
    return {(False, False): "Selective RoPE", (True, False): "+ phase gate", (False, True): "+ bias", (True, True): "+ phase gate & bias"}[(gate, bias)]


def _synth_experiment(task: str, cfg: dict) -> str:
    mixer = cfg.get("mixer", "gla")
    if task == "state_tracking":
        host = {"gla": "gla", "attention": "attention"}.get(mixer)
        if mixer == "gated_deltanet" and cfg.get("model", {}).get("use_forget_gate") is False:
            host = "deltanet"
        key = f"state_tracking/{host}-{cfg.get('group')}"
        return key if key in paper.EXPERIMENTS else f"state_tracking/other/{mixer}-{cfg.get('group')}"
    return task if mixer == "gla" else f"{task}/other/{mixer}"


ST_PRESET_EVAL_SIZE = 500_000  # the state-tracking presets' evaluation set (srope.lab.tasks.state_tracking)


def _run_examples(task: str, cfg: dict, setting: dict, run: dict) -> float | None:
    """Examples (sequences) a run was allowed to train on: its planned steps x batch (the steps
    it trained when a time limit ended it)."""
    steps = run.get("steps") if run.get("stopped") == "time" else run.get("planned_steps")
    if steps is None:
        return None
    batch = cfg.get("batch_size") or (zoology_batch_size(int(setting.get("params", {}).get("seq_len", setting.get("max_len", 0)))) if task == "mqar" else None)
    return float(steps * batch) if batch else None


def _max_length(spec: Any) -> int | None:
    """The largest length of an ``eval_lengths`` spec such as ``"2-512:30"`` or ``"2,8,16"``."""
    numbers = [int(tok) for tok in str(spec).replace(":", ",").replace("-", ",").split(",") if tok.strip().isdigit()]
    if not numbers:
        return None
    text = str(spec)
    return int(text.split(":")[0].split("-")[-1]) if "-" in text else max(numbers)


def _synth_fields(task: str, cfg: dict, settings: list[str], points: int) -> dict:
    model = cfg.get("model", {})
    common = {"layers": model.get("num_hidden_layers"), "width": model.get("hidden_size"), "heads": model.get("num_heads")}
    if task == "copying":
        return {**common, "steps": cfg.get("steps") if cfg.get("max_steps") is None else min(cfg["steps"], cfg["max_steps"]), "batch": cfg.get("batch_size"),
                "longest train string": cfg.get("max_len"), "longest eval string": _max_length(cfg.get("eval_lengths"))}
    if task == "mqar":
        return {"layers": model.get("num_hidden_layers"), "vocab": cfg.get("vocab"), "train set": cfg.get("train_examples"), "epochs": cfg.get("epochs"),
                "batch": cfg.get("batch_size") or zoology_batch_size(512), "lr points": points}
    if task == "state_tracking":
        lrs = cfg.get("lrs") or []
        return {**common, "train set": cfg.get("train_size"), "epochs": cfg.get("epochs"), "batch": cfg.get("batch_size"),
                "lr": lrs[0] if len(lrs) == 1 else lrs, "train len": cfg.get("train_len"), "eval len": cfg.get("eval_len")}
    if task == "mad":
        return {**common, "batch": cfg.get("batch_size"), "epochs": cfg.get("epochs"), "optimiser points": points, "settings": len(settings)}
    return common


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _synth_group(task: str, cfg: dict, preset: str | None) -> str:
    model = cfg.get("model", {})
    size = f"{model.get('num_hidden_layers', '?')} layers x {model.get('hidden_size', 'd')}" if task != "mqar" else f"{model.get('num_hidden_layers', '?')} layers"
    parts = [f"srope synth {task} --preset {preset}", f"{cfg.get('mixer', 'gla')} {size}"]
    if task == "copying":
        parts.append(f"{cfg.get('steps')} steps x {cfg.get('batch_size')}, strings {cfg.get('min_len')}-{cfg.get('max_len')}")
    elif task == "state_tracking":
        parts.append(f"{cfg.get('group')}, {cfg.get('epochs')} epochs x {_count(cfg.get('train_size'))} sequences, length {cfg.get('train_len')} -> {cfg.get('eval_len')}")
    elif task == "mqar":
        parts.append(f"{cfg.get('epochs')} epochs x {_count(cfg.get('train_examples'))} examples")
    elif task == "mad":
        parts.append(f"up to {cfg.get('epochs')} epochs, batch {cfg.get('batch_size')}")
    return ", ".join(parts)


def synthetic_runs(files: list[tuple[Path, dict]]) -> list[Run]:
    pools: dict[tuple, dict] = {}
    for path, data in files:
        task, cfg = data["task"], data.get("config", {})
        position_type = data.get("position_type") or cfg.get("position_type")
        options = (cfg.get("position") or {}).get(position_type, {}) or {}
        experiment = _synth_experiment(task, cfg)
        protocol = {k: v for k, v in cfg.items() if k not in _NOT_PROTOCOL}
        group_key = _key([task, protocol])
        variant = {"type": position_type, "options": options, "label": data.get("label")}
        pool = pools.setdefault((experiment, group_key, _key(variant)), {
            "task": task, "cfg": cfg, "preset": data.get("preset"), "label": data.get("label") or f"{cfg.get('mixer')}/{position_type}",
            "paper_row": paper_variant(position_type, options, with_options=task == "mad"), "records": {}, "settings": {},
            "provenance": {}, "sources": [], "complete": True, "release_differences": data.get("release_differences"),
        })
        pool["sources"].append(path)
        pool["complete"] &= bool(data.get("complete"))
        for setting in data.get("settings", []):
            pool["settings"][setting["name"]] = setting
        prov = read_provenance(data)
        for run in data["runs"]:
            point = (run["setting"], run["lr"], run["weight_decay"], run["seed"])
            if point not in pool["records"]:  # the same run in two folders (a copy) counts once
                pool["records"][point] = run
                pool["provenance"][point] = (tuple(prov), path)
    runs: list[Run] = []
    for (experiment, group_key, variant_key), pool in pools.items():
        runs += _select(experiment, group_key, variant_key, pool)
    return runs


def _select(experiment: str, group_key: str, variant_key: str, pool: dict) -> list[Run]:
    """Per setting, the optimiser point with the best mean score over seeds; one Run per seed."""
    task, cfg = pool["task"], pool["cfg"]
    grid: dict[str, dict[tuple, list[dict]]] = {}
    for (setting, lr, wd, _seed), record in pool["records"].items():
        grid.setdefault(setting, {}).setdefault((lr, wd), []).append(record)
    chosen: dict[str, list[dict]] = {}
    points = 0
    for setting, by_point in grid.items():
        best = max(by_point, key=lambda p: sum(r["score"] for r in by_point[p]) / len(by_point[p]))
        chosen[setting] = by_point[best]
        points = max(points, len(by_point))
    seeds = sorted({r["seed"] for records in chosen.values() for r in records}, key=str)
    notes = [] if pool["complete"] else ["incomplete"]
    fields = _synth_fields(task, cfg, sorted(chosen), points)
    runs = []
    for seed in seeds:
        mine = {s: next((r for r in records if r["seed"] == seed), None) for s, records in chosen.items()}
        mine = {s: r for s, r in mine.items() if r is not None}
        metrics: dict[str, float] = {}
        curves: dict[str, tuple[list, list]] = {}
        histories = {s: ([h["step"] for h in r["history"]], [h["score"] for h in r["history"]]) for s, r in mine.items() if r.get("history")}
        budget = 0.0
        seed_notes, time_limited, reported, shares = list(notes), [], [], []
        for setting, record in mine.items():
            examples = _run_examples(task, cfg, pool["settings"].get(setting, {}), record)
            budget = budget + examples if examples is not None and budget is not None else None
            if task in ("mqar", "mad"):  # one score per setting (model width, MAD task setting)
                metrics[setting] = record["score"]
            else:
                metrics.update({k: v for k, v in record["metrics"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
                for name, curve in record["metrics"].get("curves", {}).items():
                    curves[name] = (curve["x"], curve["y"])
            select = cfg.get("select", "final")
            reported.append({"select": select, "step": _reported_step(record, select), "steps": record.get("steps"), "final": record.get("final", {})})
            shares.append(_steps_share(record))
            if record.get("diverged") and "diverged" not in seed_notes:
                seed_notes.append("diverged")
            if record.get("stopped") == "time":
                time_limited.append((record["steps"], record["planned_steps"]))
            capped = cfg.get("max_steps")
            if capped is not None and record.get("planned_steps") == capped and cfg.get("schedule") in DECAYING_SCHEDULES:
                # the schedule decays over the cap, unlike a time-limited run's: say which it was
                note = f"{cfg['schedule']} schedule over {capped:,} steps (max_steps)"
                seed_notes += [note] if note not in seed_notes else []
        if task == "state_tracking" and cfg.get("eval_size") not in (None, ST_PRESET_EVAL_SIZE):
            seed_notes.append(f"eval set {cfg['eval_size']:,} sequences, not {ST_PRESET_EVAL_SIZE:,}")
        if task == "mad":
            metrics = {**mad_scores(metrics), **{f"s:{name}": score for name, score in metrics.items()}}
        elif task == "state_tracking" and budget is not None:
            budget *= cfg.get("train_len", 1)  # the protocol's unit is tokens
        if task == "mqar" and budget is not None and mine:
            budget /= len(mine)  # the paper's budget is per trained model, i.e. per width
        provs = [pool["provenance"][(s, r["lr"], r["weight_decay"], seed)] for s, r in mine.items()]
        runs.append(Run(
            experiment=experiment, group_key=group_key, group=_synth_group(task, cfg, pool["preset"]), variant_key=variant_key, label=pool["label"],
            paper_row=pool["paper_row"], seed=seed, metrics=metrics, curves=curves, budget=budget or None, fields=fields,
            provenance=list(dict.fromkeys(p for group, _ in provs for p in group)), sources=list(dict.fromkeys(src for _, src in provs)), notes=seed_notes,
            time_limited=time_limited, trained=len(mine),
            train_len=cfg.get("train_len") or cfg.get("max_len"), config={k: v for k, v in cfg.items() if k not in _NOT_PROTOCOL},
            histories=histories, reported=reported, release_differences=pool["release_differences"],
            steps_share=None if not shares or None in shares else min(shares),
        ))  # fmt: skip
    return runs


def _steps_share(record: dict) -> float | None:
    """The share of its protocol's steps a run trained (1.0 once its stopping rule ended it)."""
    if record.get("stopped") in ("threshold", "patience"):
        return 1.0
    planned = record.get("protocol_steps")
    return None if not planned else min(1.0, record.get("steps", 0) / planned)


def _reported_step(record: dict, select: str) -> int | None:
    """The step of the evaluation a record's metrics come from. Records that do not say
    (``reported_step`` is newer) kept, of equal best scores, the first."""
    if "reported_step" in record:
        return record["reported_step"]
    history = record.get("history") or []
    if not history or select not in ("final", "best"):
        return None
    if select == "final":
        return history[-1]["step"]
    top = max(h["score"] for h in history)
    return next(h["step"] for h in history if h["score"] == top)


def mad_scores(per_setting: dict[str, float]) -> dict[str, float]:
    """MAD's protocol score from per-setting results: the mean per task over its settings,
    the mean of those, and how many settings each task has (``n:<task>``)."""
    by_task: dict[str, list[float]] = {}
    for name, score in per_setting.items():
        by_task.setdefault(name.split("/")[0], []).append(float(score))
    out: dict[str, float] = {task: sum(v) / len(v) for task, v in by_task.items()}
    out["average"] = sum(out.values()) / len(out) if out else math.nan
    out.update({f"n:{task}": float(len(v)) for task, v in by_task.items()})
    return out


def demo_runs(files: list[tuple[Path, dict]]) -> list[Run]:
    runs = []
    for path, data in files:
        cfg = data["config"]
        model = cfg.get("model", {})
        group = data.get("group", "S2")
        experiment = "state_tracking/gla-S2" if group == "S2" else f"state_tracking/other/gla-{group}"
        stages = cfg.get("curriculum") or []
        tokens = sum(s[0] * s[1] * (s[2] if len(s) > 2 else cfg.get("batch_size", 0)) for s in stages) or None
        fields = {"layers": model.get("num_hidden_layers"), "width": model.get("hidden_size"), "heads": model.get("num_heads"),
                  "train set": "fresh batches", "epochs": None, "batch": cfg.get("batch_size"), "lr": cfg.get("lr"),
                  "train len": data.get("train_len"), "eval len": data.get("eval_len")}
        description = (f"srope demo --preset {data.get('preset', cfg.get('name'))} ({OUR_RECIPE}: length curriculum "
                       f"{'/'.join(str(s[0]) for s in stages)}, {sum(s[1] for s in stages)} steps; not the paper's protocol)")
        for kind, result in data["results"].items():
            options = cfg.get(kind, {}) if kind in ("rope", "selective_rope") else {}
            curve = result.get("curve") or {}
            runs.append(Run(
                experiment=experiment, group_key=_key(["demo", cfg]), group=description, variant_key=_key([kind, options]), label=f"demo {label_of(kind, kind)}",
                paper_row=label_of(kind), seed=data.get("seed"),
                metrics={"seq_acc_at_train_len": result["seq_acc"]["train"], "score": result["seq_acc"]["eval"]},
                curves={"seq_acc_by_length": (curve.get("length", []), curve.get("seq_acc", []))} if curve else {},
                budget=float(tokens) if tokens else None, fields=fields, provenance=read_provenance(data), sources=[path],
                train_len=data.get("train_len"), config=cfg,
            ))  # fmt: skip
    return runs
