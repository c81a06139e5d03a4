"""Our pipelines against the authors', side by side: copying (the released ``copying`` package)
and MQAR (Zoology as vendored in the release), each seed in a process of its own.

The authors' checkout is read from ``--release`` (fetched outside this tree, never copied into
it; ``git clone https://github.com/timurcarstensen/selective-rope``) and run as released, with
only what a run here needs changed, listed in every result under ``authors_changes``:

- copying: the configuration is composed from the release's Hydra files
  (``configs/copying/{trainer/trainer,data/data,model/gla,model/position_embedding/<type>}.yaml``
  plus the sweep's fixed values in ``configs/copying/copying.yaml``), then ``copying.main.main``
  runs it. Changed: ``steps_budget`` (the run's length; the linear schedule follows it, as in
  ours), ``logging`` off (no wandb), ``compile`` off (the release compiles with
  ``dynamic=True``: minutes of compilation for no change in the arithmetic that matters here),
  ``max_eval_len`` (fewer evaluation lengths). ``wandb`` is imported at the top of its main
  module and never called with logging off: an empty module stands in where it is missing.
- MQAR: Zoology's ``train.train`` on a ``TrainConfig`` built as its files build it: the GLA
  model of ``experiments/models_repo.py::add_gla`` with the kernel-3 BaseConv of
  ``experiments/030325_new_arch/configs.py``, the data and batch size of
  ``experiments/iclr24_zoology_figure2/configs.py`` for one (sequence, pairs) setting.
  Changed: ``max_epochs`` (the run's length; its cosine follows it, as in ours), the logger
  (a recorder instead of wandb).

Ours runs the same configuration through ``run_synthetic`` with the release presets. Data:
neither generator can give the other's examples (the authors draw from NumPy's global state,
we from per-run generators), so each run records statistics of its first training batches
(``data``), compared in the report.

    python experiments/vs_authors.py all --release ../selective-rope --out out/vs_authors
    python experiments/vs_authors.py report out/vs_authors     # curves and a JSON summary

One run: ``python experiments/vs_authors.py run --task copying --pipeline authors --seed 0 ...``.

On the GPU machine the authors' copying model spends minutes autotuning before its first step:
keep Triton's cache between calls (``source .tcache/use.sh`` first, ``bash .tcache/pack.sh``
last, ``../shared/tools/triton-cache.sh keep`` here). Zoology needs ``pydantic`` and the
authors' copying ``omegaconf``: carry their wheels in ``.whl``.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

TASKS = ("copying", "mqar")
PIPELINES = ("authors", "ours")
IGNORE = -100
# The side-by-side protocol of each task (both pipelines): short runs whose loss leaves its
# starting plateau, on the release's model, optimiser and schedule shape.
PROTOCOL = {
    "copying": {"steps": 300, "arm": {"use_gate": False, "use_bias": True}, "max_eval_len": 66, "lr": 2e-3},
    "mqar": {"seq_len": 64, "kv_pairs": 4, "d_model": 128, "lr": 2.154434690031882e-3, "epochs": 2, "train_examples": 100_000,
             "test_examples": 3_000},
}


def bin_curve(points: list[tuple[int, float]], every: int) -> list[list[float]]:
    """``[step, mean loss of the steps in (step - every, step]]`` for every full window."""
    out, window = [], []
    for step, loss in points:
        window.append(loss)
        if step % every == 0:
            out.append([step, float(np.mean(window))])
            window = []
    return out


def copying_stats(next_tokens: np.ndarray, scored: np.ndarray, eos: int) -> dict:
    """Statistics of copying training rows: the next-token targets ``[N, T]`` and whether each
    is in the loss (``scored``, 0/1)."""
    per_row = scored.sum(1)
    examples = ((next_tokens == eos) & (scored > 0)).sum(1)
    return {"rows": int(len(next_tokens)), "scored_per_row": float(per_row.mean()), "examples_per_row": float(examples.mean()),
            "answer_tokens_per_example": float(per_row.sum() / max(examples.sum(), 1))}


def mqar_stats(inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Statistics of MQAR rows: queries per row, key and value ranges, query distance (query
    position minus the key's first position)."""
    rows, cols = np.nonzero(targets != IGNORE)
    keys, values = inputs[rows, cols], targets[rows, cols]
    first = np.array([int(np.argmax(inputs[r] == k)) for r, k in zip(rows, keys)])
    distance = cols - first
    return {"rows": int(len(inputs)), "queries_per_row": float(len(rows) / len(inputs)), "key_range": [int(keys.min()), int(keys.max())],
            "value_range": [int(values.min()), int(values.max())], "distance_mean": float(distance.mean()),
            "distance_median": float(np.median(distance)), "distance_p90": float(np.percentile(distance, 90))}


def stub_wandb() -> None:
    """An empty ``wandb`` where none is installed: the authors' modules import it at the top
    and call it only with logging on."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        module = types.ModuleType("wandb")
        module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        sys.modules["wandb"] = module


def parse_scalar(text: str):
    """A value as Hydra's override grammar reads it (``2e-3`` is a float, ``true`` a bool)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def release_config(release: Path, task: str):
    """The release's Hydra composition for ``task`` (``copying`` or ``state_tracking``), done by
    hand: ``configs/<task>/{trainer/trainer,data/data,logger/logger}.yaml``, ``model/gla.yaml``
    with the ``selective_rope`` position group (the sweep overrides that group's keys, while the
    model file's default group is ``nope``: docs/release-presets.md), then the sweep's
    single-valued settings (``configs/<task>/<task>.yaml``). Returns the configuration and the
    sweep's multi-valued axes (``{key: values}``), which each run picks from."""
    from omegaconf import OmegaConf

    root = release / "configs" / task
    model = OmegaConf.load(root / "model" / "gla.yaml")
    del model["defaults"]
    model.position_embedding = OmegaConf.load(root / "model" / "position_embedding" / "selective_rope.yaml")
    cfg = OmegaConf.create({"trainer": OmegaConf.load(root / "trainer" / "trainer.yaml"), "data": OmegaConf.load(root / "data" / "data.yaml"),
                            "model": model, "logger": OmegaConf.load(root / "logger" / "logger.yaml")})
    axes = {}
    for key, text in OmegaConf.load(root / f"{task}.yaml").hydra.sweeper.params.items():
        values = [parse_scalar(v) for v in str(text).split(",")]
        if len(values) == 1:
            OmegaConf.update(cfg, key, values[0])
        else:
            axes[key] = values
    return cfg, axes


def apply_changes(cfg, changes: dict) -> None:
    from omegaconf import OmegaConf

    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)


def authors_copying_config(release: Path, seed: int, steps: int, arm: dict, max_eval_len: int, workers: int):
    cfg, _ = release_config(release, "copying")
    apply_changes(cfg, {f"model.position_embedding.{key}": value for key, value in arm.items()})
    changes = {"trainer.seed": seed, "trainer.steps_budget": steps, "trainer.logging": False, "trainer.compile": False,
               "data.max_eval_len": max_eval_len, "trainer.num_workers": workers}
    apply_changes(cfg, changes)
    return cfg, changes


def run_authors_copying(release: Path, seed: int, out: dict, workers: int) -> None:
    p = PROTOCOL["copying"]
    sys.path[:0] = [str(release / "src"), str(release / "synthetic_tasks" / "copying" / "src")]
    stub_wandb()
    import accelerate
    import copying.main as main_module
    from accelerate.logging import get_logger
    from copying.data_utils import CopyDataset, get_tokenizer
    from omegaconf import OmegaConf

    cfg, changes = authors_copying_config(release, seed, p["steps"], p["arm"], p["max_eval_len"], workers)
    if cfg.trainer.lr != p["lr"]:
        raise SystemExit(f"the release's sweep learning rate is {cfg.trainer.lr}, the protocol's {p['lr']}")
    folder = Path(tempfile.mkdtemp(prefix="authors-copying-"))
    (folder / "model_config.json").write_text(json.dumps(OmegaConf.to_container(cfg.model, resolve=True)))
    cfg.trainer.model_name_or_path = str(folder / "model_config.json")
    main_module.log = get_logger("copying")  # set by the release's __main__ block only

    tokenizer, to_token, _ = get_tokenizer(cfg.data)
    np.random.seed(seed)
    sample = CopyDataset(tokenizer=tokenizer, vocab_size=cfg.data.vocab_size, n_gram=cfg.data.n_gram, length_answer=cfg.data.length_answer,
                         train_task=cfg.data.train_task, sequence_length=cfg.data.sequence_length, min_length=cfg.data.min_length,
                         max_length=cfg.data.max_length, batch_size=1, num_examples=256)
    rows = [sample[i] for i in range(256)]
    tokens = np.stack([np.asarray(r["input_ids"]).reshape(-1) for r in rows])
    mask = np.stack([np.asarray(r["mask"]).reshape(-1) for r in rows])
    out["data"] = copying_stats(tokens[:, 1:], mask[:, 1:], to_token["."])

    logged, evals = [], {}
    original = accelerate.Accelerator.log

    def record(self, values, step=None, log_kwargs=None):
        if "train/loss" in values:
            logged.append([int(values["step"]), float(values["train/loss"])])
        if "test/seq_len" in values:
            evals[int(values["test/seq_len"])] = {"str_acc": float(values["test/mean_str_acc"]), "char_acc": float(values["test/mean_char_acc"])}
        return original(self, values, step=step, log_kwargs=log_kwargs or {})

    accelerate.Accelerator.log = record
    start = time.perf_counter()
    main_module.main(cfg)
    out.update(seconds=time.perf_counter() - start, loss_curve=logged, eval=evals, authors_changes=changes,
               config=OmegaConf.to_container(cfg, resolve=True))


def run_ours_copying(seed: int, out: dict, folder: Path) -> None:
    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import copying
    from srope.lab.tasks.common import IGNORE as OURS_IGNORE
    from srope.lab.tasks.common import rng_for
    from srope.lab.tasks.runner import get_task, resolve_preset, run_synthetic

    p = PROTOCOL["copying"]
    overrides = {"steps": p["steps"], "seeds": str(seed), "lrs": str(p["lr"]), "loss_every": 10, "eval_lengths": f"2-{p['max_eval_len'] - 1}",
                 "eval_examples": 256, "position.gate": "standard" if p["arm"]["use_gate"] else "none", "position.bias": p["arm"]["use_bias"],
                 **p.get("ours_extra", {})}
    cfg = resolve_preset("copying", "release", overrides)
    setting = copying.settings(cfg)[0]
    prepared = get_task("copying").prepare(cfg, setting, None)
    x, y = next(iter(prepared.train.epoch(0, rng_for(seed, "shuffle", "copying", setting.name))))
    out["data"] = copying_stats(np.asarray(y), (np.asarray(y) != OURS_IGNORE).astype(np.int64), copying.EOS)
    start = time.perf_counter()
    results = run_synthetic("copying", srope_model_factory, out=folder, overrides=overrides, preset="release", progress=False, plot=False)
    record = results["runs"][0]
    out.update(seconds=time.perf_counter() - start, loss_curve=record["loss_curve"], eval=record["metrics"], overrides=overrides)


def zoology_config(release: Path, seed: int):
    sys.path.insert(0, str(release / "synthetic_tasks" / "zoology" / "src"))
    stub_wandb()
    from zoology.config import DataConfig, LoggerConfig, TrainConfig
    from zoology.data.associative_recall import MQARConfig
    from zoology.experiments.models_repo import add_gla

    p = PROTOCOL["mqar"]
    seq_len = p["seq_len"]
    batch = 64 if seq_len >= 1024 else 128 if seq_len >= 512 else 256 if seq_len >= 256 else 512  # iclr24_zoology_figure2/configs.py:21-28
    segment = {"vocab_size": 8192, "input_seq_len": seq_len, "num_kv_pairs": p["kv_pairs"], "random_non_queries": False}
    data = DataConfig(train_configs=[MQARConfig(num_examples=p["train_examples"], **segment)],
                      test_configs=[MQARConfig(num_examples=p["test_examples"], **segment)], batch_size=batch)
    conv = {"name": "zoology.mixers.base_conv.BaseConv", "kwargs": {"l_max": seq_len, "kernel_size": 3, "implicit_long_conv": True}}
    models = add_gla([], conv, seq_len, {"state_mixer": {"name": "torch.nn.Identity", "kwargs": {}}, "vocab_size": 8192})
    model = next(m for m in models if m.d_model == p["d_model"])
    config = TrainConfig(model=model, data=data, learning_rate=p["lr"], max_epochs=p["epochs"], seed=seed,
                         logger=LoggerConfig(), run_id=f"vs-authors-gla-seed{seed}")
    return config, {"max_epochs": p["epochs"], "logger": "a recorder instead of wandb"}


def run_authors_mqar(release: Path, seed: int, out: dict) -> None:
    config, changes = zoology_config(release, seed)
    import zoology.train as zoology_train
    from zoology.data.utils import prepare_data

    train_loader, _ = prepare_data(config.data)
    inputs, targets = [], []
    for i, (x, y, _) in enumerate(train_loader):
        inputs.append(x.numpy())
        targets.append(y.numpy())
        if i == 1:
            break
    out["data"] = mqar_stats(np.concatenate(inputs), np.concatenate(targets))
    losses, evals = [], []

    class Recorder:
        def __init__(self, config):
            pass

        def log_config(self, config):
            pass

        def log_model(self, model, config):
            out["parameters"] = sum(p.numel() for p in model.parameters())

        def log(self, metrics):
            if "train/loss" in metrics:
                losses.append([len(losses) + 1, float(metrics["train/loss"])])
            elif "valid/accuracy" in metrics:
                evals.append({"epoch": int(metrics["epoch"]), "accuracy": float(metrics["valid/accuracy"]), "loss": float(metrics["valid/loss"])})

        def finish(self):
            pass

    zoology_train.WandbLogger = Recorder
    start = time.perf_counter()
    zoology_train.train(config)
    out.update(seconds=time.perf_counter() - start, loss_curve=bin_curve(losses, 10), eval=evals, authors_changes=changes,
               config=json.loads(config.model_dump_json()))


def run_ours_mqar(seed: int, out: dict, folder: Path) -> None:
    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import mqar
    from srope.lab.tasks.runner import resolve_preset, run_synthetic

    p = PROTOCOL["mqar"]
    overrides = {"configs": f"{p['seq_len']}x{p['kv_pairs']}", "d_models": str(p["d_model"]), "lrs": str(p["lr"]), "seeds": str(seed),
                 "epochs": p["epochs"], "loss_every": 10, "position_type": "nope", "train_examples": p["train_examples"],
                 "test_examples": p["test_examples"], **p.get("ours_extra", {})}
    cfg = resolve_preset("mqar", "release", overrides)
    setting = mqar.settings(cfg)[0]
    data = mqar.datasets(cfg, p["seq_len"], p["kv_pairs"], None)
    batch = mqar.zoology_batch_size(p["seq_len"])
    out["data"] = mqar_stats(data["train_inputs"][: 2 * batch].astype(np.int64), data["train_targets"][: 2 * batch].astype(np.int64))
    start = time.perf_counter()
    results = run_synthetic("mqar", srope_model_factory, out=folder, overrides=overrides, preset="release", progress=False, plot=False)
    record = results["runs"][0]
    out.update(seconds=time.perf_counter() - start, loss_curve=record["loss_curve"], eval=record["history"], overrides=overrides,
               parameters=record.get("parameters"), setting=setting.name)


def run_one(args: argparse.Namespace) -> None:
    import torch

    out = {"task": args.task, "pipeline": args.pipeline, "seed": args.seed, "protocol": PROTOCOL[args.task],
           "release": str(args.release), "release_commit": args.release_commit, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    if args.pipeline == "authors" and args.task == "copying":
        run_authors_copying(args.release, args.seed, out, args.workers)
    elif args.pipeline == "authors":
        run_authors_mqar(args.release, args.seed, out)
    elif args.task == "copying":
        run_ours_copying(args.seed, out, folder / f"ours-copying-{args.seed}")
    else:
        run_ours_mqar(args.seed, out, folder / f"ours-mqar-{args.seed}")
    from srope.lab import provenance

    out["provenance"] = provenance.record(source=provenance.commit())
    (folder / f"{args.task}-{args.pipeline}-{args.seed}.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"{args.task} {args.pipeline} seed {args.seed}: {out['seconds']:.0f} s, last loss {out['loss_curve'][-1]}", flush=True)


def run_all(args: argparse.Namespace) -> None:
    failed = []
    for task in args.tasks:
        for seed in args.seeds:
            for pipeline in PIPELINES:
                command = [sys.executable, __file__, "run", "--task", task, "--pipeline", pipeline, "--seed", str(seed), "--release", str(args.release),
                           "--release-commit", args.release_commit, "--out", str(args.out), "--workers", str(args.workers)]
                if subprocess.run(command).returncode:
                    failed.append(f"{task} {pipeline} seed {seed}")
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))


def final_score(run: dict) -> dict:
    """Copying: exact-copy accuracy over the training lengths (2-64) and beyond them; MQAR: the
    last evaluation's accuracy."""
    if run["task"] == "mqar":
        last = run["eval"][-1]
        return {"accuracy": last.get("accuracy", last.get("score"))}
    if run["pipeline"] == "authors":
        by_length = {int(k): v["str_acc"] for k, v in run["eval"].items()}
    else:
        x, y = run["eval"]["curves"]["str_acc_by_length"]["x"], run["eval"]["curves"]["str_acc_by_length"]["y"]
        by_length = dict(zip((int(v) for v in x), y))
    train = [v for k, v in by_length.items() if k <= 64]
    beyond = [v for k, v in by_length.items() if k > 64]
    return {"str_acc_2_64": float(np.mean(train)) if train else None, "str_acc_65_up": float(np.mean(beyond)) if beyond else None}


def summarise(folder: Path) -> dict:
    """Per task: each pipeline's final-window loss over seeds (mean, spread), data statistics,
    and whether the means differ by less than the larger seed-to-seed spread."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*-*-*.json"))]
    summary = {}
    for task in TASKS:
        entry = {}
        for pipeline in PIPELINES:
            mine = [r for r in runs if r["task"] == task and r["pipeline"] == pipeline]
            if not mine:
                continue
            finals = [float(np.mean([v for _, v in r["loss_curve"][-5:]])) for r in mine]
            entry[pipeline] = {"seeds": [r["seed"] for r in mine], "final_loss": finals, "mean": float(np.mean(finals)),
                               "spread": float(np.ptp(finals)), "seconds": [round(r["seconds"]) for r in mine], "data": mine[0]["data"],
                               "device": mine[0]["device"], "scores": [final_score(r) for r in mine]}
        if len(entry) == 2:
            gap = abs(entry["authors"]["mean"] - entry["ours"]["mean"])
            entry["gap"] = gap
            entry["equal_within_spread"] = bool(gap <= max(entry["authors"]["spread"], entry["ours"]["spread"]))
        if entry:
            summary[task] = entry
    return summary


def report(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(args.folder)
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*-*-*.json"))]
    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for run in (r for r in runs if r["task"] == task):
            steps, losses = zip(*[(s, v) for s, v in run["loss_curve"] if v is not None])
            ax.plot(steps, losses, color="C0" if run["pipeline"] == "authors" else "C1", alpha=0.7,
                    label=f"{run['pipeline']} seed {run['seed']}")
        ax.set(title=f"{task}: training loss", xlabel="step", ylabel="loss (10-step mean)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "vs_authors.png", dpi=120)
    summary = summarise(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "all"):
        p = sub.add_parser(name)
        p.add_argument("--release", type=Path, required=True, help="a checkout of timurcarstensen/selective-rope")
        p.add_argument("--release-commit", default="", help="its commit (read with git when empty)")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--workers", type=int, default=4, help="the authors' copying data-loader workers (the release's 4)")
        if name == "run":
            p.add_argument("--task", choices=TASKS, required=True)
            p.add_argument("--pipeline", choices=PIPELINES, required=True)
            p.add_argument("--seed", type=int, required=True)
        else:
            p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
            p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p = sub.add_parser("report")
    p.add_argument("folder")
    args = parser.parse_args()
    if args.command == "report":
        return report(args)
    if not (args.release / "synthetic_tasks" / "copying").is_dir():
        raise SystemExit(f"--release {args.release}: not a checkout of timurcarstensen/selective-rope (no synthetic_tasks/copying)")
    if not args.release_commit:
        done = subprocess.run(["git", "-C", str(args.release), "rev-parse", "HEAD"], capture_output=True, text=True)
        args.release_commit = done.stdout.strip() or "unknown"
    run_one(args) if args.command == "run" else run_all(args)


if __name__ == "__main__":
    main()
