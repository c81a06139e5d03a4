"""Runs of language modelling: ``srope train`` / ``sweep-lr`` folders with their ``srope eval`` and lm-eval results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from srope.lab.report import paper
from srope.lab.report.records import Provenance, Run, _key, label_of, read_provenance


# srope.modules.SelectiveRoPE's defaults for the options the LM ablation (Table 2) varies;
# tests/lab/report checks them against the module's signature.
SELECTIVE_ROPE_DEFAULTS = {"conv_activation": "silu", "gate": "standard", "bias": False}
# Model options that set the size of the model belong to the protocol; any other model
# override (a gate normaliser, a decay switch) makes a variant the paper does not have.
SIZE_KEYS = {"num_hidden_layers", "hidden_size", "num_heads", "head_dim", "expand_k", "expand_v", "vocab_size", "intermediate_size",
             "hidden_ratio", "max_position_embeddings", "tie_word_embeddings"}


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
