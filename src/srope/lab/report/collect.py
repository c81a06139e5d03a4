"""Find result files and turn them into one :class:`Run` per trained model (per seed).

What is read (recognised by content, so folders may be arranged freely):

- ``results.json`` of ``srope synth`` (``task`` one of the synthetic tasks, ``runs``): every
  run (setting x optimiser point x seed) is pooled with the runs of other files that share
  the protocol and the variant, so a sweep split over several folders reads as one; per
  setting the optimiser point with the best mean score over seeds is kept (the runner's
  rule, MAD's "best over the grid").
- ``results.json`` of ``srope demo`` (``task`` "parity"): one run per position encoding.
  ``summary.json`` of ``srope demo --seeds`` repeats the per-seed files beside it and is
  not read.
- ``srope train`` run folders: ``run.json`` (provenance, config, final metrics), or for runs
  that predate it ``train_config.json`` + ``metrics.jsonl``. Inside an ``srope sweep-lr``
  folder (``sweep.json``) only the chosen learning rate's run is a row.
- ``srope eval`` JSON (``contexts``) and lm-evaluation-harness results (``results`` with
  ``acc,none``-style keys): attached to the training run whose folder holds them or whose
  model folder they name.

Anything else is listed as skipped. Provenance (``"provenance"`` in the JSON, see
:mod:`srope.lab.provenance`) is kept per file; files without it are "provenance unknown".
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srope.lab.report import paper
from srope.lab.tasks.registry import tasks
from srope.lab.tasks.release import zoology_batch_size
from srope.registry import positions

OUR_RECIPE = "our recipe"  # how a protocol group that is not the paper's protocol says so (srope demo's)
SKIP_DIRS = {"checkpoints", "tensorboard", "model", "__pycache__", "node_modules", "site-packages"}  # and every hidden folder
# The walk's bounds: folders this deep below a given one (results sit 1-5 deep: out/sweep/RUN/lr_X/run.json)
# and trees that never hold results (a given folder that is one of them is refused).
MAX_DEPTH = 8
SYSTEM_DIRS = {Path(p) for p in ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/snap", "/sys", "/usr", "/var")}


def label_of(kind: Any, default: Any = None) -> Any:
    """A position encoding's label in reports (:data:`srope.registry.positions`), else ``default``."""
    return positions[kind].label if isinstance(kind, str) and kind in positions else default


# srope.modules.SelectiveRoPE's defaults for the options the LM ablation (Table 2) varies;
# tests/lab/report checks them against the module's signature.
SELECTIVE_ROPE_DEFAULTS = {"conv_activation": "silu", "gate": "standard", "bias": False}
# Model options that set the size of the model belong to the protocol; any other model
# override (a gate normaliser, a decay switch) makes a variant the paper does not have.
SIZE_KEYS = {"num_hidden_layers", "hidden_size", "num_heads", "head_dim", "expand_k", "expand_v", "vocab_size", "intermediate_size",
             "hidden_ratio", "max_position_embeddings", "tie_word_embeddings"}
# Config entries that do not change what a run measures (or that the report pools over). A
# wall-clock limit is not protocol either: a run it stopped says so in its row and budget; nor
# are cuda_graph and head_at_targets, which compute the same loss and update.
DECAYING_SCHEDULES = ("cosine", "cosine_epoch", "linear_warmup")  # planned over a run's steps (srope.lab.schedule)
_NOT_PROTOCOL = {"seeds", "threads", "position_type", "position", "tasks", "only", "lrs", "weight_decays", "eval_batch_size",
                 "max_seconds", "checkpoint_every", "save_weights", "cuda_graph", "head_at_targets", "loss_every"}


# ---------------------------------------------------------------------------------------
# Provenance


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


# ---------------------------------------------------------------------------------------
# Records


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _json_files(roots: list[Path]) -> list[Path]:
    """The ``.json`` files under ``roots`` (files are taken as they are), at most :data:`MAX_DEPTH`
    folders deep, skipping hidden folders, :data:`SKIP_DIRS`, system trees and folders already seen
    (a symlink loop); a root that is the filesystem's or a system folder is refused."""
    found: list[Path] = []
    seen: set[Path] = set()
    for root in roots:
        if root.is_file():
            found.append(root)
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"no such result folder: {root}")
        if root.resolve() in SYSTEM_DIRS:
            raise ValueError(f"{root} is a system folder (or the filesystem's root), not a result folder: pass the folders srope's commands wrote (e.g. out/)")
        stack = [(root, 0)]
        while stack:
            folder, depth = stack.pop()
            real = folder.resolve()
            if real in seen or real in SYSTEM_DIRS:
                continue
            seen.add(real)
            try:
                entries = sorted(folder.iterdir())
            except OSError:  # unreadable: not ours
                continue
            for entry in entries:
                if entry.is_dir():
                    if depth < MAX_DEPTH and entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                        stack.append((entry, depth + 1))
                elif entry.is_file() and entry.suffix == ".json":
                    found.append(entry)
    return sorted(dict.fromkeys(p.resolve() for p in found))


def _kind(path: Path, data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    task = data.get("task")
    if path.name == "results.json" and isinstance(task, str) and task in tasks and isinstance(data.get("runs"), list):
        return "synth"
    if task == "parity" and isinstance(data.get("results"), dict) and "config" in data:
        return "demo"
    if task == "parity" and "per_seed" in data:
        return "demo-summary"
    if path.name == "run.json" and isinstance(data.get("config"), dict) and "metrics" in data:
        return "train"
    if path.name == "train_config.json" and "preset" in data and "max_steps" in data:
        return "train-legacy"
    if path.name == "sweep.json" and isinstance(data.get("runs"), list) and "lrs" in data:
        return "sweep"
    if isinstance(data.get("contexts"), list) and "model" in data:
        return "eval"
    results = data.get("results")
    if isinstance(results, dict) and any(isinstance(v, dict) and any("," in k for k in v) for v in results.values()):
        return "lm-eval"
    return None


def collect(dirs: list[Path | str]) -> Collected:
    """Every result under ``dirs`` (folders, searched recursively, or files)."""
    files = _json_files([Path(d) for d in dirs])
    by_kind: dict[str, list[tuple[Path, dict]]] = {}
    read, skipped = [], []
    for path in files:
        data = _read_json(path)
        kind = _kind(path, data)
        if kind is None:
            if path.parent.name != "model" and path.name != "config.json":
                skipped.append(path)
            continue
        by_kind.setdefault(kind, []).append((path, data))
        if kind != "demo-summary":
            read.append(path)
    runs = synthetic_runs(by_kind.get("synth", []))
    runs += demo_runs(by_kind.get("demo", []))
    runs += lm_runs(by_kind.get("train", []), by_kind.get("train-legacy", []), by_kind.get("sweep", []), by_kind.get("eval", []), by_kind.get("lm-eval", []))
    return Collected(runs, read, skipped)


# ---------------------------------------------------------------------------------------
# Synthetic tasks (srope synth)


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


# ---------------------------------------------------------------------------------------
# srope demo


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


# ---------------------------------------------------------------------------------------
# Language modelling (srope train / sweep-lr / eval, lm-eval)

_LM_EVAL_KEYS = {  # paper column -> (lm-eval task, metric); accuracies become %
    "wikitext_ppl": ("wikitext", "word_perplexity"),
    "lambada_ppl": ("lambada_openai", "perplexity"),
    "lambada_acc": ("lambada_openai", "acc"),
    "piqa_acc": ("piqa", "acc"),
    "hellaswag_acc_norm": ("hellaswag", "acc_norm"),
    "winogrande_acc": ("winogrande", "acc"),
    "arc_e_acc": ("arc_easy", "acc"),
    "arc_c_acc_norm": ("arc_challenge", "acc_norm"),
}


def lm_eval_columns(data: dict) -> dict[str, float]:
    """The paper's Table 3 columns from an lm-eval results JSON (accuracies in %)."""
    results = data.get("results", {})
    out = {}
    for column, (task, metric) in _LM_EVAL_KEYS.items():
        values = results.get(task, {})
        value = values.get(f"{metric},none", values.get(metric))
        if isinstance(value, (int, float)):
            out[column] = float(value) * (100.0 if column.endswith(("_acc", "_acc_norm")) else 1.0)
    if all(c in out for c in paper.ACCURACY_COLUMNS):
        out["avg_acc"] = sum(out[c] for c in paper.ACCURACY_COLUMNS) / len(paper.ACCURACY_COLUMNS)
    if "wikitext_ppl" in out and "lambada_ppl" in out:
        out["avg_ppl"] = (out["wikitext_ppl"] + out["lambada_ppl"]) / 2
    return out


def _suffix_match(target: str, folders: list[Path]) -> Path | None:
    """The folder whose path ends most like ``target`` (a model or run path written on
    another machine); None when no folder shares at least its last component."""
    parts = [p for p in Path(target).parts if p not in ("", ".")]
    if parts and parts[-1] == "model":
        parts = parts[:-1]
    best, best_len, tie = None, 0, False
    for folder in folders:
        mine = folder.parts
        n = 0
        while n < min(len(parts), len(mine)) and parts[-1 - n] == mine[-1 - n]:
            n += 1
        if n > best_len:
            best, best_len, tie = folder, n, False
        elif n == best_len and n > 0:
            tie = True
    return None if best is None or tie else best


def _owner(path: Path, target: str | None, folders: list[Path]) -> Path | None:
    for folder in folders:
        if folder in path.parents:
            return folder
    return _suffix_match(target, folders) if target else None


def _final_val(run_dir: Path, metrics: dict | None) -> float | None:
    if metrics and isinstance(metrics.get("val_ppl"), (int, float)):
        return float(metrics["val_ppl"])
    log = run_dir / "metrics.jsonl"
    if not log.exists():
        return None
    value = None
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record.get("val_ppl"), (int, float)):
            value = float(record["val_ppl"])
    return value


def lm_variant(position: Any, model_overrides: dict) -> tuple[str, str | None, str | None, dict]:
    """``(label, Table 3 row, Table 2 row, options)`` for a run's position encoding and the
    model overrides that are not sizes."""
    if isinstance(position, dict):
        kind, options = position.get("type", "selective_rope"), {k: v for k, v in position.items() if k != "type"}
    else:
        kind, options = str(position), {}
    extra = {k: v for k, v in model_overrides.items() if k not in SIZE_KEYS}
    label = label_of(kind, kind)
    table3 = table2 = None
    if kind == "selective_rope":
        merged = {**SELECTIVE_ROPE_DEFAULTS, **{k: v for k, v in options.items() if k in SELECTIVE_ROPE_DEFAULTS}}
        act, gate, bias = merged["conv_activation"], merged["gate"], merged["bias"]
        table2 = None if bias else {(None, None): "Selective RoPE: Baseline", ("silu", None): "+ SiLU", ("silu", "x"): "+ phase gate"}.get((act, "x" if gate else None))
        if table2 == "+ phase gate":
            table3 = "Selective RoPE"  # Table 3 uses the best configuration, Table 2's last row (digest §5.5)
        label += "" if table2 is None else ("" if table2 == "+ phase gate" else f" ({table2.replace('Selective RoPE: ', '').lower()})")
        others = {k: v for k, v in options.items() if k not in SELECTIVE_ROPE_DEFAULTS}
        if others:
            label += " [" + ", ".join(f"{k}={v}" for k, v in sorted(others.items())) + "]"
            table2 = table3 = None
    elif kind in ("nope", "rope"):
        table3 = table2 = label_of(kind)
        if options:
            label += " [" + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + "]"
            table3 = table2 = None
    if extra:
        label += " [" + ", ".join(f"model.{k}={v}" for k, v in sorted(extra.items())) + "]"
        table3 = table2 = None
    return label, table3, table2, options


SAME_SPLIT = "lr chosen on the split the perplexity is reported on"


def lm_runs(train: list, legacy: list, sweeps: list, evals: list, lm_evals: list) -> list[Run]:
    folders: dict[Path, dict] = {}
    for path, data in train:
        folders[path.parent] = {"config": data["config"], "metrics": data.get("metrics"), "provenance": read_provenance(data), "source": path,
                                "complete": data.get("complete", True)}
    for path, data in legacy:
        if path.parent not in folders:
            folders[path.parent] = {"config": data, "metrics": None, "provenance": [Provenance(None)], "source": path, "complete": True}
    sweep_of: dict[Path, dict] = {}
    for path, data in sweeps:
        chosen = (data.get("chosen") or {}).get("dir")
        for run in data["runs"]:
            sweep_of[(path.parent / run["dir"]).resolve()] = {"chosen": run.get("dir") == chosen, "lrs": data.get("lrs"), "selection": data.get("selection"),
                                                               "chosen_at_grid_edge": data.get("chosen_at_grid_edge")}
    known = sorted(folders, key=lambda p: len(p.parts), reverse=True)
    attached: dict[Path, dict] = {folder: {"evals": [], "lm_evals": []} for folder in folders}
    for path, data in evals:
        owner = _owner(path, data.get("model"), known)
        if owner is not None:
            attached[owner]["evals"].append((path, data))
    for path, data in lm_evals:
        args = str((data.get("config") or {}).get("model_args", ""))
        target = next((part.split("=", 1)[1] for part in args.split(",") if part.startswith("pretrained=")), None)
        owner = _owner(path, target, known)
        if owner is not None:
            attached[owner]["lm_evals"].append((path, data))
    runs, selection = [], []
    for folder, info in folders.items():
        sweep = sweep_of.get(folder.resolve())
        if sweep is not None and not sweep["chosen"]:
            continue
        (runs if sweep is None else selection).append(_lm_run(folder, info, attached[folder], sweep))
    # A sweep's chosen run only chose the learning rate when runs of the same variant and
    # protocol were trained at it outside the sweep (other seeds): those are the reported rows,
    # and they carry the choice as a note.
    for run in selection:
        kept = [r for r in runs if (r.group_key, r.variant_key) == (run.group_key, run.variant_key)]
        if not kept:
            runs.append(run)
            continue
        choice = next(note for note in run.notes if note.startswith("lr "))
        choice = choice.replace(" by ", f" on seed {run.seed} by ", 1)
        for r in kept:
            r.notes.append(choice)
            if r.fields.get("eval_split") in (None, "val"):
                r.notes.append(SAME_SPLIT)
    return runs


def _lm_run(folder: Path, info: dict, attached: dict, sweep: dict | None) -> Run:
    cfg = info["config"]
    overrides = cfg.get("model") or {}
    label, table3, table2, _ = lm_variant(cfg.get("position", "selective_rope"), overrides)
    preset = cfg.get("preset")
    seq_len, batch, steps = cfg.get("seq_len"), cfg.get("global_batch_size"), cfg.get("max_steps")
    tokens = float(seq_len * batch * steps) if seq_len and batch and steps else None
    metrics: dict[str, float] = {}
    notes = [] if info["complete"] else ["incomplete"]
    val = _final_val(folder, info["metrics"])
    if val is not None:
        metrics["val_ppl"] = val
    provs, sources = list(info["provenance"]), [info["source"]]
    eval_split = None
    for path, data in attached["evals"]:
        contexts = sorted(data["contexts"], key=lambda c: c["seq_len"])
        at_train = next((c for c in contexts if c["seq_len"] == data.get("train_seq_len", seq_len)), contexts[0] if contexts else None)
        if at_train is not None:
            metrics["eval_ppl"] = at_train["ppl"]
        if len(contexts) > 1:
            metrics["eval_ppl_longest"] = contexts[-1]["ppl"]
            metrics["eval_longest_len"] = contexts[-1]["seq_len"]
        eval_split = (data.get("data") or {}).get("split", eval_split)
        provs += read_provenance(data)
        sources.append(path)
    for path, data in attached["lm_evals"]:
        metrics.update(lm_eval_columns(data))
        provs += read_provenance(data)
        sources.append(path)
    if sweep is not None:
        lrs = sweep.get("lrs") or []
        notes.append(f"lr {cfg.get('lr'):g} chosen from {{{', '.join(f'{lr:g}' for lr in lrs)}}} by {sweep.get('selection') or 'the sweep'}"
                     + (" (at the grid's edge)" if sweep.get("chosen_at_grid_edge") else ""))
        if eval_split in (None, "val"):
            notes.append(SAME_SPLIT)
    experiment = f"lm/{preset}" if f"lm/{preset}" in paper.EXPERIMENTS else f"lm/other/{preset}"
    protocol = {k: v for k, v in cfg.items() if k not in ("seed", "lr", "position", "device", "compile", "cuda_graph", "checkpoint_every", "log_every",
                                                         "tensorboard", "eval_every", "cache", "micro_batch_size", "parallel")}
    protocol["model"] = {k: v for k, v in overrides.items() if k in SIZE_KEYS}
    data_name = Path(str(cfg.get("data", "?"))).name
    layers = overrides.get("num_hidden_layers")
    group = f"srope train --preset {preset}{f' (model.num_hidden_layers={layers})' if layers else ''}, {data_name}, {steps} steps x {batch} x {seq_len} tokens"
    if not layers and experiment in paper.EXPERIMENTS:
        layers = paper.EXPERIMENTS[experiment].protocol.compare.get("layers")  # the preset's depth is the paper's
    fields = {"data": data_name, "context": seq_len, "layers": layers, "tokens": tokens, "lr": cfg.get("lr"), "eval_split": eval_split}
    return Run(
        experiment=experiment, group_key=_key(["lm", protocol]), group=group, variant_key=_key([label]), label=label, paper_row=table3, seed=cfg.get("seed"),
        metrics=metrics, budget=tokens, fields=fields, provenance=provs, sources=sources, notes=notes,
        train_len=seq_len, ablation_row=table2 if preset == "gla-370m" else None, config=protocol,
    )  # fmt: skip
