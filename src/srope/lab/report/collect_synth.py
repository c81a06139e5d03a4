"""Runs of the synthetic tasks: ``srope synth`` sweeps (best optimiser point per setting) and ``srope demo``.

What differs between tasks (the experiment a sweep belongs to, its protocol fields, how a
seed's records become one run's metrics and budget) is the task page's: its module (the task
registry's ``report``) may define ``Records``, a :class:`SweepRecords` with those overridden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srope.lab.report.records import OUR_RECIPE, Run, _key, label_of, read_provenance
from srope.lab.tasks.registry import tasks


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


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def model_size(cfg: dict, *, width: bool = True) -> str:
    model = cfg.get("model", {})
    return f"{model.get('num_hidden_layers', '?')} layers" + (f" x {model.get('hidden_size', 'd')}" if width else "")


class SweepRecords:
    """How the records of one task's ``srope synth`` sweeps become report runs; a task's page
    module subclasses it as ``Records`` where its task differs."""

    paper_row_options = False  # whether the paper's rows tell Selective RoPE's gate and bias apart

    def __init__(self, task: str):
        self.task = task

    def experiment(self, cfg: dict) -> str:
        """The key of the paper's experiment (:data:`srope.lab.report.paper.EXPERIMENTS`) a sweep belongs to."""
        mixer = cfg.get("mixer", "gla")
        return self.task if mixer == "gla" else f"{self.task}/other/{mixer}"

    def fields(self, cfg: dict, settings: list[str], points: int) -> dict:
        """The protocol values compared with the paper's (``settings``: those run; ``points``: the optimiser grid's size)."""
        model = cfg.get("model", {})
        return {"layers": model.get("num_hidden_layers"), "width": model.get("hidden_size"), "heads": model.get("num_heads")}

    def describe(self, cfg: dict) -> str:
        """The protocol in words, after ``srope synth TASK --preset P``."""
        return f"{cfg.get('mixer', 'gla')} {model_size(cfg)}"

    def batch(self, cfg: dict, setting: dict) -> int | None:
        return cfg.get("batch_size")

    def metrics(self, records: dict[str, dict]) -> tuple[dict[str, float], dict[str, tuple[list, list]]]:
        """One seed's metrics and curves from its record per setting."""
        metrics: dict[str, float] = {}
        curves: dict[str, tuple[list, list]] = {}
        for record in records.values():
            metrics.update({k: v for k, v in record["metrics"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
            for name, curve in record["metrics"].get("curves", {}).items():
                curves[name] = (curve["x"], curve["y"])
        return metrics, curves

    def budget(self, examples: float, cfg: dict, trained: int) -> float:
        """The budget in the protocol's unit from the examples (sequences) that ``trained`` models were allowed."""
        return examples

    def notes(self, cfg: dict) -> list[str]:
        """What a row says of its protocol beyond the paper's fields."""
        return []


def sweep_records(task: str) -> SweepRecords:
    module = tasks[task].report_module()
    return getattr(module, "Records", SweepRecords)(task)


def _run_examples(batch: int | None, run: dict) -> float | None:
    """Examples (sequences) a run was allowed to train on: its planned steps x batch (the steps
    it trained when a time limit ended it)."""
    steps = run.get("steps") if run.get("stopped") == "time" else run.get("planned_steps")
    if steps is None:
        return None
    return float(steps * batch) if batch else None


def synthetic_runs(files: list[tuple[Path, dict]]) -> list[Run]:
    pools: dict[tuple, dict] = {}
    for path, data in files:
        task, cfg = data["task"], data.get("config", {})
        position_type = data.get("position_type") or cfg.get("position_type")
        options = (cfg.get("position") or {}).get(position_type, {}) or {}
        reader = sweep_records(task)
        experiment = reader.experiment(cfg)
        protocol = {k: v for k, v in cfg.items() if k not in _NOT_PROTOCOL}
        group_key = _key([task, protocol])
        variant = {"type": position_type, "options": options, "label": data.get("label")}
        pool = pools.setdefault((experiment, group_key, _key(variant)), {
            "task": task, "cfg": cfg, "preset": data.get("preset"), "label": data.get("label") or f"{cfg.get('mixer')}/{position_type}",
            "paper_row": paper_variant(position_type, options, with_options=reader.paper_row_options), "records": {}, "settings": {},
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
    reader = sweep_records(task)
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
    fields = reader.fields(cfg, sorted(chosen), points)
    runs = []
    for seed in seeds:
        mine = {s: next((r for r in records if r["seed"] == seed), None) for s, records in chosen.items()}
        mine = {s: r for s, r in mine.items() if r is not None}
        metrics, curves = reader.metrics(mine)
        histories = {s: ([h["step"] for h in r["history"]], [h["score"] for h in r["history"]]) for s, r in mine.items() if r.get("history")}
        budget = 0.0
        seed_notes, time_limited, reported, shares = list(notes), [], [], []
        for setting, record in mine.items():
            examples = _run_examples(reader.batch(cfg, pool["settings"].get(setting, {})), record)
            budget = budget + examples if examples is not None and budget is not None else None
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
        seed_notes += reader.notes(cfg)
        if budget is not None and mine:
            budget = reader.budget(budget, cfg, len(mine))
        provs = [pool["provenance"][(s, r["lr"], r["weight_decay"], seed)] for s, r in mine.items()]
        runs.append(Run(
            experiment=experiment, group_key=group_key, group=f"srope synth {task} --preset {pool['preset']}, {reader.describe(cfg)}", variant_key=variant_key, label=pool["label"],
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
