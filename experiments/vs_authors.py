"""Our pipelines against the authors', side by side: copying (the released ``copying`` package),
MQAR (Zoology as vendored in the release) and state tracking on S2 (the released
``state_tracking`` package), each seed in a process of its own.

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
- state tracking: ``state_tracking.main.train(cfg)`` on the configuration composed from
  ``configs/state_tracking`` as copying's (the GLA arm of ``state_tracking.yaml``: Selective
  RoPE, short conv, temperature ``rope`` with theta 1.0, gate off, bias on, lr 5e-4; equal to
  Hydra's own composition with the ``selective_rope`` group chosen, tested). Changed:
  ``epochs`` (3 of 100 batches: 300 steps; its cosine, ``T_max = epochs x batches``, follows
  it as ours does), ``max_val_acc`` off (every planned step runs, as in ours), ``logging`` off,
  ``data_dir``: our data written as the release's CSV files (the format of its
  ``generate_data.py``, byte for byte), which its ``get_dataset`` reads into the token ids of
  ours (BOS renumbered), so both runs record the same sha256 of their train and eval sets.
  Stand-ins where ``train(cfg)`` needs nothing real: ``git`` and ``hydra`` at import,
  ``polars`` for the vocabulary's one call (the csv module); under transformers 5 the
  tokenizer returns the ``token_type_ids`` column it removes (transformers 4's default).

Ours runs the same configuration through ``run_synthetic`` with the release presets. Data:
for copying and MQAR neither generator can give the other's examples (the authors draw from
NumPy's global state, we from per-run generators), so each run records statistics of its first
training batches (``data``), compared in the report; state tracking shares one data set.

    python experiments/vs_authors.py all --release ../selective-rope --out out/vs_authors
    python experiments/vs_authors.py report out/vs_authors     # curves and a JSON summary

One run: ``python experiments/vs_authors.py run --task copying --pipeline authors --seed 0 ...``.

The authors' Selective RoPE kernels time 390 configurations before their first step (six
minutes on an H100); by default their runs take the first one, through the release's own test
switch ``SELECTIVE_ROPE_TESTING=1`` (``--autotune release`` times them all), recorded under
``authors_changes``. fla's kernels still autotune: keep Triton's cache between calls (``source .tcache/use.sh`` first, ``bash .tcache/pack.sh``
last, ``../shared/tools/triton-cache.sh keep`` here). Zoology needs ``pydantic`` and the
authors' copying ``omegaconf``: carry their wheels in ``.whl``. State tracking needs
``datasets`` (with ``dill`` and ``multiprocess``) and ``ordered-set``: ``.whl-st``. Both folders
are git-ignored, filled with ``pip download --no-deps --only-binary=:all: --python-version 3.12
--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d DIR``
of omegaconf==2.4.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types typing_inspection
(``.whl``, beside fla's) and datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ordered-set==4.1.0 (``.whl-st``). The checkout travels as ``.authors/selective-rope``, a
``git archive`` of it in an ignored folder.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

TASKS = ("copying", "mqar", "state_tracking")
PIPELINES = ("authors", "ours")
IGNORE = -100
# The side-by-side protocol of each task (both pipelines): short runs whose loss leaves its
# starting plateau, on the release's model, optimiser and schedule shape.
PROTOCOL = {
    "copying": {"steps": 300, "arm": {"use_gate": False, "use_bias": True}, "max_eval_len": 66, "lr": 2e-3},
    "mqar": {"seq_len": 64, "kv_pairs": 4, "d_model": 128, "lr": 2.154434690031882e-3, "epochs": 2, "train_examples": 100_000,
             "test_examples": 3_000},
    # S2 at the release's lengths (128, evaluated at 512) on the same data in both pipelines;
    # 100 batches of 1024 an epoch, 3 epochs: both cosines are planned over the 300 steps run
    # (the release's T_max = epochs x batches an epoch, ours epochs x steps an epoch), with
    # the accuracy stop off in both so that every planned step runs.
    "state_tracking": {"group": "S2", "train_len": 128, "eval_len": 512, "steps_per_epoch": 100, "batch_size": 1024, "epochs": 3,
                       "eval_size": 2048, "lr": 5e-4, "data_seed": 0},
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


def stand_in(name: str, **attributes) -> types.ModuleType:
    """A module ``name`` holding ``attributes`` (with a spec, so that importlib accepts it)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    return module


def _nothing(*args, **kwargs) -> None:
    return None


def stub_wandb() -> None:
    """An inert ``wandb`` where none is installed: the authors' modules import it at the top;
    copying calls it only with logging on, state tracking calls ``Table``, ``plot.line`` (for
    ``Accelerator.log``, which logs nowhere without a tracker) and ``finish`` in every run."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        sys.modules["wandb"] = stand_in("wandb", Table=_nothing, plot=stand_in("wandb.plot", line=_nothing), finish=_nothing, alert=_nothing,
                                        log=_nothing)


class CsvPolars:
    """The one ``polars`` call of the release's state-tracking ``get_dataset`` (its vocabulary,
    synthetic_tasks/state_tracking/src/state_tracking/main.py:224-230), on the ``csv`` module:
    ``read_csv(path).select(col("input").map_batches(f)).explode("input").unique()["input"].to_list()``,
    where ``f`` splits the column's strings (``x.str.split(" ")``). The tokens come back in a
    different order than polars' ``unique``; the release sorts them (main.py:235)."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns

    @classmethod
    def read_csv(cls, path) -> CsvPolars:
        import csv

        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return cls({name: [row[name] for row in rows] for name in (rows[0] if rows else {})})

    class col:  # noqa: N801 (polars' name)
        def __init__(self, name: str, function=None):
            self.name, self.function = name, function

        def map_batches(self, function) -> CsvPolars.col:
            return CsvPolars.col(self.name, function)

    class Series(list):
        @property
        def str(self):
            return types.SimpleNamespace(split=lambda by: CsvPolars.Series(value.split(by) for value in self))

        def to_list(self) -> list:
            return list(self)

    def select(self, column: CsvPolars.col) -> CsvPolars:
        return CsvPolars({column.name: list(column.function(CsvPolars.Series(self.columns[column.name])))})

    def explode(self, name: str) -> CsvPolars:
        return CsvPolars({name: [value for row in self.columns[name] for value in row]})

    def unique(self) -> CsvPolars:
        (name, values), = self.columns.items()
        return CsvPolars({name: list(dict.fromkeys(values))})

    def __getitem__(self, name: str) -> CsvPolars.Series:
        return CsvPolars.Series(self.columns[name])


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


def import_release_copying(release: Path):
    """The release's ``copying.main`` from its checkout (``wandb`` stood in where missing), with the logger its
    ``__main__`` block sets."""
    # the authors' release is a checkout, not an installed package: import it from there on purpose
    for path in (release / "synthetic_tasks" / "copying" / "src", release / "src"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    stub_wandb()
    import copying.main as main_module
    from accelerate.logging import get_logger

    main_module.log = get_logger("copying")  # set by the release's __main__ block only
    return main_module


def run_authors_copying(release: Path, seed: int, out: dict, workers: int) -> None:
    p = PROTOCOL["copying"]
    main_module = import_release_copying(release)
    import accelerate
    from copying.data_utils import CopyDataset, get_tokenizer
    from omegaconf import OmegaConf

    cfg, changes = authors_copying_config(release, seed, p["steps"], p["arm"], p["max_eval_len"], workers)
    if cfg.trainer.lr != p["lr"]:
        raise SystemExit(f"the release's sweep learning rate is {cfg.trainer.lr}, the protocol's {p['lr']}")
    folder = Path(tempfile.mkdtemp(prefix="authors-copying-"))
    (folder / "model_config.json").write_text(json.dumps(OmegaConf.to_container(cfg.model, resolve=True)))
    cfg.trainer.model_name_or_path = str(folder / "model_config.json")

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
    # the authors' release is a checkout, not an installed package: import it from there on purpose
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


def annotations_for_zoology_gla() -> str:
    """Zoology's ``mixers/gla.py`` imports ``Cache`` and ``Unpack`` under ``TYPE_CHECKING``
    only (lines 9-11) and names them in ``forward``'s annotations (line 26), which Python
    evaluates when the class is made before 3.14 (PEP 649): a ``NameError`` on 3.12 and
    3.13, which the release's ``requires-python = ">=3.12"`` admits. The two names are made
    resolvable, the module unchanged."""
    import builtins

    from fla.models.utils import Cache
    from transformers.processing_utils import Unpack

    builtins.Cache, builtins.Unpack = Cache, Unpack
    return "Cache and Unpack resolvable for mixers/gla.py's annotations (a NameError on Python < 3.14)"


def run_authors_mqar(release: Path, seed: int, out: dict) -> None:
    config, changes = zoology_config(release, seed)
    if sys.version_info < (3, 14):
        changes["annotations"] = annotations_for_zoology_gla()
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


# The release's state-tracking tokenizer: the element tokens first, in numeric order, then 7
# specials [PAD] [BOS] [UNK] [EOS] [SEP] [CLS] [MASK]
# (synthetic_tasks/state_tracking/src/state_tracking/main.py:88-97, :233-236), so [BOS] is
# |G| + 1 where ours is |G|.
RELEASE_BOS_AFTER_ELEMENTS = 1
DIGEST_ROWS = 1024  # the "first rows" digest: one training batch of the protocol


def release_ids(tokens: np.ndarray, order: int) -> np.ndarray:
    """Our state-tracking token ids (elements ``0..order-1``, BOS ``order``) as the release's
    tokenizer numbers them: the elements keep theirs, BOS becomes ``order + 1``."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() > order):
        raise ValueError(f"state-tracking tokens must lie in [0, {order}] (elements and BOS), got [{tokens.min()}, {tokens.max()}]")
    return np.where(tokens == order, order + RELEASE_BOS_AFTER_ELEMENTS, tokens)


def write_release_csv(path: Path, inputs: np.ndarray, targets: np.ndarray, seed: int) -> None:
    """Our rows (``[BOS, x_1 … x_L]``, ``[BOS, s_1 … s_L]``) as the release's generate_data.py
    writes a file: polars' ``write_csv`` of the columns seed, input, target, the element indices
    and the states after each prefix joined by spaces, no BOS (the release's tokenizer prepends
    it), synthetic_tasks/state_tracking/generate_data.py:200-225."""
    with open(path, "w", newline="") as f:
        f.write("seed,input,target\n")
        for x, y in zip(np.asarray(inputs)[:, 1:], np.asarray(targets)[:, 1:]):
            f.write(f"{seed},{' '.join(map(str, x.tolist()))},{' '.join(map(str, y.tolist()))}\n")


def token_digest(inputs: np.ndarray, targets: np.ndarray) -> dict:
    """sha256 of the token ids (int64, little-endian, inputs then targets) of the first
    ``DIGEST_ROWS`` rows and of all rows."""

    def sha(rows: slice) -> str:
        h = hashlib.sha256()
        for array in (inputs, targets):
            h.update(np.ascontiguousarray(np.asarray(array)[rows], dtype="<i8").tobytes())
        return h.hexdigest()

    return {"rows": int(len(inputs)), "sha256": sha(slice(None)), "first_rows": min(DIGEST_ROWS, len(inputs)), "first_sha256": sha(slice(DIGEST_ROWS))}


def state_tracking_stats(inputs: np.ndarray, targets: np.ndarray, identity: int = 0) -> dict:
    """Statistics of tagged state-tracking rows (BOS first): length, how often the element and
    the state are the identity, distinct rows."""
    inputs, targets = np.asarray(inputs)[:, 1:], np.asarray(targets)[:, 1:]
    return {"rows": int(len(inputs)), "length": int(inputs.shape[1]), "identity_inputs": float((inputs == identity).mean()),
            "identity_states": float((targets == identity).mean()), "distinct_rows": int(len(np.unique(inputs, axis=0)))}


def state_tracking_record(inputs: np.ndarray, targets: np.ndarray) -> dict:
    """A split's ``data`` entry, in the release's token ids: statistics and digests."""
    return {**state_tracking_stats(inputs, targets), **token_digest(inputs, targets)}


def our_state_tracking(seed: int):
    """Our overrides of the ``release`` preset for the protocol and the resolved preset (its
    data, ``state_tracking.datasets(cfg, None)``, is the same for every seed: ``data_seed`` is
    fixed, as the release's files are)."""
    from srope.lab.tasks.runner import resolve_preset

    p = PROTOCOL["state_tracking"]
    overrides = {"group": p["group"], "train_len": p["train_len"], "eval_len": p["eval_len"], "seeds": str(seed), "lrs": str(p["lr"]),
                 "batch_size": p["batch_size"], "eval_batch_size": p["batch_size"], "epochs": p["epochs"],
                 "train_size": p["steps_per_epoch"] * p["batch_size"], "eval_size": p["eval_size"], "data_seed": p["data_seed"], "stop_at": None,
                 "loss_every": 10, **p.get("ours_extra", {})}
    return overrides, resolve_preset("state_tracking", "release", overrides)


def authors_state_tracking_config(release: Path, seed: int, data_dir: Path, workers: int):
    from omegaconf import OmegaConf

    p = PROTOCOL["state_tracking"]
    cfg, axes = release_config(release, "state_tracking")
    if "selective_rope" not in axes["model.position_embedding.type"] or seed not in axes["trainer.seed"]:
        raise SystemExit(f"the release's sweep has no selective_rope arm or no seed {seed}: {axes}")
    released = {"data.group": p["group"], "data.k": p["train_len"], "data.k_test": p["eval_len"], "trainer.lr": p["lr"],
                "trainer.batch_size": p["batch_size"], "trainer.use_scheduler": True, "data.curriculum": False, "data.strict_len": True}
    differ = {key: OmegaConf.select(cfg, key) for key, value in released.items() if OmegaConf.select(cfg, key) != value}
    if differ:
        raise SystemExit(f"the release's configuration differs from the protocol's: {differ}")
    changes = {"trainer.seed": seed, "trainer.epochs": p["epochs"], "trainer.max_val_acc": None, "trainer.logging": False,
               "trainer.num_workers": workers, "data.data_dir": str(data_dir)}
    apply_changes(cfg, changes)
    return cfg, changes


def import_state_tracking_main(release: Path):
    """The release's ``state_tracking.main``, imported with stand-ins for three of its
    module-level imports: ``git`` (``git.Repo(...).git.rev_parse("--show-toplevel")`` at import,
    only to find the Hydra config folder: the release's root), ``hydra`` (``hydra.main`` as an
    identity decorator: ``train(cfg)`` is called with a composed configuration) and ``polars``
    (:class:`CsvPolars`, its one call). They are put in ``sys.modules`` for the import only."""
    # the authors' release is a checkout, not an installed package: import it from there on purpose
    sys.path[:0] = [str(release / "src"), str(release / "synthetic_tasks" / "state_tracking" / "src")]
    stub_wandb()
    root = str(release)
    repo = types.SimpleNamespace(git=types.SimpleNamespace(rev_parse=lambda *args: root))
    stand_ins = {"git": stand_in("git", Repo=lambda *args, **kwargs: repo), "hydra": stand_in("hydra", main=lambda **kwargs: lambda function: function),
                 "polars": stand_in("polars", read_csv=CsvPolars.read_csv, col=CsvPolars.col)}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        import state_tracking.main as main_module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    from accelerate.logging import get_logger

    main_module.log = get_logger("state_tracking")  # set by the release's __main__ block only
    return main_module


def release_get_dataset(get_dataset, tokenizer_class, **kwargs):
    """The release's ``get_dataset(**kwargs)`` (``tokenizer_class``: the
    ``PreTrainedTokenizerFast`` its module imported), and whether it needed transformers 4's tokenizer
    outputs: it removes a ``token_type_ids`` column (main.py:266) that transformers 4 tokenizers
    returned by default and transformers 5 ones return only when ``token_type_ids`` is among
    ``model_input_names``; that list is set back to transformers 4's for the call. The column is
    removed unread, so ``input_ids`` and ``labels`` do not change."""
    if "token_type_ids" in tokenizer_class.model_input_names:
        return get_dataset(**kwargs), False
    missing = object()
    own = tokenizer_class.__dict__.get("model_input_names", missing)
    tokenizer_class.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    try:
        return get_dataset(**kwargs), True
    finally:
        if own is missing:
            del tokenizer_class.model_input_names
        else:
            tokenizer_class.model_input_names = own


def dataset_arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    """The ``input_ids`` and ``labels`` of the release's tokenized ``datasets.Dataset``."""
    rows = dataset.with_format("numpy")[:]
    return np.asarray(rows["input_ids"], dtype=np.int64), np.asarray(rows["labels"], dtype=np.int64)


STATE_TRACKING_CHANGES = {
    "data": "our train and eval sets (the release preset's generator, data_seed 0) written as the release's CSV files into a "
            "temporary data.data_dir; the release's generate_data.py (abstract_algebra, fire) is not run",
    "polars": "a stand-in reading the CSV with the csv module for get_dataset's one polars call (the vocabulary; main.py:224-230)",
    "git, hydra": "stand-ins at import: git_root (main.py:336) names the release's root, hydra.main is an identity decorator",
    "cwd": "a temporary folder (the release saves checkpoints/ under the working directory, main.py:651-659)",
}


TOKEN_TYPE_IDS_CHANGE = ("transformers 4's model_input_names on PreTrainedTokenizerFast during get_dataset, so that the "
                         "token_type_ids column it removes (main.py:266) exists under transformers 5")


def run_authors_state_tracking(release: Path, seed: int, out: dict, workers: int) -> None:
    import accelerate
    from omegaconf import OmegaConf

    from srope.lab.tasks import state_tracking

    _, ours = our_state_tracking(seed)
    data = state_tracking.datasets(ours, None)
    folder = Path(tempfile.mkdtemp(prefix="authors-state-tracking-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(folder / "hf-datasets"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    (folder / "data").mkdir()
    write_release_csv(folder / "data" / f"{ours.group}={ours.train_len}.csv", data["train_inputs"], data["train_targets"], ours.data_seed)
    write_release_csv(folder / "data" / f"{ours.group}={ours.eval_len}.csv", data["eval_inputs"], data["eval_targets"], ours.data_seed)
    cfg, changes = authors_state_tracking_config(release, seed, folder / "data", workers)
    main_module = import_state_tracking_main(release)

    out["data"], shimmed = {}, []
    get_dataset = main_module.get_dataset

    def recorded_get_dataset(**kwargs):
        built, shim = release_get_dataset(get_dataset, main_module.PreTrainedTokenizerFast, **kwargs)
        shimmed.append(shim)
        out["data"]["train" if kwargs["k"] == cfg.data.k else "eval"] = state_tracking_record(*dataset_arrays(built["dataset"]))
        return built

    main_module.get_dataset = recorded_get_dataset
    losses, evals = [], []
    backward, log = accelerate.Accelerator.backward, accelerate.Accelerator.log

    def record_loss(self, loss, **kwargs):
        losses.append(loss.detach().float())
        return backward(self, loss, **kwargs)

    def record_eval(self, values, step=None, log_kwargs=None):
        if "val/best_sequence_accuracy" in values:
            curve = np.asarray(values["val/sequence_accuracies"], dtype=np.float64)
            evals.append({"step": int(step), "sequence_accuracy": float(values["val/sequence_accuracy"]), "loss": float(values["val/loss"]),
                          "token_accuracy": float(values["val/token_accuracy"]), "best_sequence_accuracy": float(values["val/best_sequence_accuracy"]),
                          "sequence_accuracy_at_train_len": float(curve[cfg.data.k]), "sequence_accuracies": curve.tolist()})
        return log(self, values, step=step, log_kwargs=log_kwargs or {})

    accelerate.Accelerator.backward, accelerate.Accelerator.log = record_loss, record_eval
    here = os.getcwd()
    os.chdir(folder)
    start = time.perf_counter()
    try:
        main_module.train(cfg)
    finally:
        os.chdir(here)
    seconds = time.perf_counter() - start
    points = [(i + 1, float(v)) for i, v in enumerate(losses)]
    out.update(seconds=seconds, loss_curve=bin_curve(points, 10), eval=evals, steps=len(points),
               planned_steps=cfg.trainer.epochs * math.ceil(out["data"]["train"]["rows"] / cfg.trainer.batch_size),
               authors_changes={**changes, **STATE_TRACKING_CHANGES, **({"tokenizer": TOKEN_TYPE_IDS_CHANGE} if any(shimmed) else {})}, config=OmegaConf.to_container(cfg, resolve=True))


def run_ours_state_tracking(seed: int, out: dict, folder: Path) -> None:
    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import state_tracking
    from srope.lab.tasks.groups import get_group
    from srope.lab.tasks.runner import run_synthetic

    overrides, cfg = our_state_tracking(seed)
    data = state_tracking.datasets(cfg, None)
    order = get_group(cfg.group).order
    out["data"] = {split: state_tracking_record(release_ids(data[f"{split}_inputs"], order), release_ids(data[f"{split}_targets"], order))
                   for split in ("train", "eval")}
    start = time.perf_counter()
    results = run_synthetic("state_tracking", srope_model_factory, out=folder, overrides=overrides, preset="release", progress=False, plot=False)
    record = results["runs"][0]
    out.update(seconds=time.perf_counter() - start, loss_curve=record["loss_curve"], steps=record["steps"], planned_steps=record["planned_steps"],
               eval={"history": record["history"], "final": record["final"], "best": record["best"]}, overrides=overrides,
               parameters=record.get("parameters"), metrics=record["metrics"])  # metrics: the reported evaluation, its accuracy by length included


def check_release(release: Path, task: str) -> None:
    """Exit with a one-line message unless ``release`` holds the release's ``task`` pipeline."""
    if not (release / "synthetic_tasks" / task).is_dir():
        raise SystemExit(f"--release {release}: not a checkout of timurcarstensen/selective-rope (no synthetic_tasks/{task})")


def run_one(args: argparse.Namespace) -> None:
    import torch

    out = {"task": args.task, "pipeline": args.pipeline, "seed": args.seed, "protocol": PROTOCOL[args.task],
           "release": str(args.release), "release_commit": args.release_commit, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    runners = {
        ("copying", "authors"): lambda: run_authors_copying(args.release, args.seed, out, args.workers),
        ("mqar", "authors"): lambda: run_authors_mqar(args.release, args.seed, out),
        ("state_tracking", "authors"): lambda: run_authors_state_tracking(args.release, args.seed, out, args.workers),
        ("copying", "ours"): lambda: run_ours_copying(args.seed, out, folder / f"ours-copying-{args.seed}"),
        ("mqar", "ours"): lambda: run_ours_mqar(args.seed, out, folder / f"ours-mqar-{args.seed}"),
        ("state_tracking", "ours"): lambda: run_ours_state_tracking(args.seed, out, folder / f"ours-state_tracking-{args.seed}"),
    }
    if args.pipeline == "authors" and args.autotune == "first":
        # Imported by the authors' Selective RoPE kernels (src/selective_rope/ops/selective_rope.py:11-16):
        # their first configuration instead of timing 270 forward and 120 backward ones (six
        # minutes on an H100 before the first step). It picks tile sizes and warps, not arithmetic.
        os.environ["SELECTIVE_ROPE_TESTING"] = "1"
    runners[args.task, args.pipeline]()
    if args.pipeline == "authors":
        out.setdefault("authors_changes", {})["autotune"] = args.autotune
    from srope.lab import provenance

    out["provenance"] = provenance.record(source=provenance.commit())
    (folder / f"{args.task}-{args.pipeline}-{args.seed}.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"{args.task} {args.pipeline} seed {args.seed}: {out['seconds']:.0f} s, last loss {out['loss_curve'][-1]}", flush=True)


def run_all(args: argparse.Namespace) -> None:
    failed = []
    for task in args.tasks:
        for seed in args.seeds:
            for pipeline in PIPELINES:
                if (args.out / f"{task}-{pipeline}-{seed}.json").exists() and not args.redo:
                    print(f"{task} {pipeline} seed {seed}: done before, kept", flush=True)
                    continue
                command = [sys.executable, __file__, "run", "--task", task, "--pipeline", pipeline, "--seed", str(seed), "--release", str(args.release),
                           "--release-commit", args.release_commit, "--out", str(args.out), "--workers", str(args.workers), "--autotune", args.autotune]
                if subprocess.run(command).returncode:
                    failed.append(f"{task} {pipeline} seed {seed}")
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))


def final_score(run: dict) -> dict:
    """Copying: exact-copy accuracy over the training lengths (2-64) and beyond them; MQAR: the
    last evaluation's accuracy; state tracking: sequence accuracy at the evaluation length
    (512: the last evaluation's and the best) and at the training length (128, the last)."""
    if run["task"] == "mqar":
        last = run["eval"][-1]
        return {"accuracy": last.get("accuracy", last.get("score"))}
    if run["task"] == "state_tracking":
        if run["pipeline"] == "authors":
            last = run["eval"][-1]
            return {"seq_acc_final": last["sequence_accuracy"], "seq_acc_best": max(e["sequence_accuracy"] for e in run["eval"]),
                    "seq_acc_train_len_final": last["sequence_accuracy_at_train_len"]}
        final, best = run["eval"]["final"], run["eval"]["best"]
        return {"seq_acc_final": final["seq_acc"], "seq_acc_best": best["seq_acc"], "seq_acc_train_len_final": final.get("seq_acc_at_train_len")}
    if run["pipeline"] == "authors":
        by_length = {int(k): v["str_acc"] for k, v in run["eval"].items()}
    else:
        x, y = run["eval"]["curves"]["str_acc_by_length"]["x"], run["eval"]["curves"]["str_acc_by_length"]["y"]
        by_length = dict(zip((int(v) for v in x), y))
    train = [v for k, v in by_length.items() if k <= 64]
    beyond = [v for k, v in by_length.items() if k > 64]
    return {"str_acc_2_64": float(np.mean(train)) if train else None, "str_acc_65_up": float(np.mean(beyond)) if beyond else None}


def same_data(authors: dict, ours: dict) -> bool | None:
    """Whether both pipelines' ``data`` carry equal digests in every split (None: no digests)."""
    splits = [k for k, v in authors.items() if isinstance(v, dict) and "sha256" in v]
    if not splits:
        return None
    return all(authors[k]["sha256"] == ours.get(k, {}).get("sha256") for k in splits)


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
            if (same := same_data(entry["authors"]["data"], entry["ours"]["data"])) is not None:
                entry["same_data"] = same
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
        p.add_argument("--autotune", choices=("first", "release"), default="first",
                       help="the authors' Selective RoPE kernels: their first configuration (the release's test switch) or all")
        if name == "run":
            p.add_argument("--task", choices=TASKS, required=True)
            p.add_argument("--pipeline", choices=PIPELINES, required=True)
            p.add_argument("--seed", type=int, required=True)
        else:
            p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
            p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
            p.add_argument("--redo", action="store_true", help="run again what has a result in --out")
    p = sub.add_parser("report")
    p.add_argument("folder")
    args = parser.parse_args()
    if args.command == "report":
        return report(args)
    check_release(args.release, "copying")
    if not args.release_commit:
        done = subprocess.run(["git", "-C", str(args.release), "rev-parse", "HEAD"], capture_output=True, text=True)
        args.release_commit = done.stdout.strip() or "unknown"
    run_one(args) if args.command == "run" else run_all(args)


if __name__ == "__main__":
    main()
