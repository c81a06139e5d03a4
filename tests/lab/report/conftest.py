"""A hand-made results folder with every kind of file ``srope report`` reads, and the report
written from it once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srope.lab import provenance

FIRST_COMMIT = "065f752e731c1806eb86a98031ced433e15923fa"  # the package skeleton: older than every later change to src/srope/ops
EVAL_X = [2, 32, 64, 128, 256, 512]


def head() -> str | None:
    return provenance._git("rev-parse", "HEAD")


def prov(commit: str | None) -> dict:
    return {"commit": commit, "dirty": False, "command": "srope synth ...", "versions": {}, "date": "2026-12-03T00:00:00+0000", "seeds": [0, 1]}


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def synth(task: str, position: str, runs: list[dict], config: dict, settings: list[dict], commit: str | list[str] | None, label: str | None = None,
          release_differences: list[str] | None = ()) -> dict:
    """A ``srope synth`` results.json; ``commit`` a list: a sweep resumed at several commits (one provenance record per call).
    By default a release-exact sweep (``release_differences`` empty); None: a preset that is not."""
    data = {"task": task, "preset": "test", "label": label or f"gla/{position}", "mixer": config.get("mixer", "gla"), "position_type": position,
            "config": {"mixer": "gla", "position_type": position, "position": {"selective_rope": {"gate": None, "bias": False}}, **config},
            "settings": settings, "complete": True, "runs": runs,
            "release_differences": None if release_differences is None else list(release_differences)}
    if commit is not None:
        data["provenance"] = [prov(c) for c in (commit if isinstance(commit, list) else [commit])]
    return data


def run(setting: str, seed: int, score: float, metrics: dict | None = None, lr: float = 1e-3, planned: int = 1000) -> dict:
    return {"setting": setting, "group": setting, "x": None, "lr": lr, "weight_decay": 0.1, "seed": seed, "score": score,
            "metrics": {"score": score, **(metrics or {})}, "planned_steps": planned, "protocol_steps": planned, "steps": planned, "diverged": False}


def copying_runs(extrapolation: tuple[float, float]) -> list[dict]:
    out = []
    for seed, acc in enumerate(extrapolation):
        curve = {"x": EVAL_X, "y": [1.0, 1.0, 0.9, acc, acc, acc]}
        out.append(run("copy", seed, acc, {"str_acc_train_range": 0.95, "str_acc_extrapolation": acc, "char_acc_extrapolation": acc,
                                           "curves": {"str_acc_by_length": curve}}))
    return out


def state_runs(train: tuple[float, ...], extra: tuple[float, ...]) -> list[dict]:
    return [run("S2", seed, e, {"seq_acc_at_train_len": t, "curves": {"seq_acc_by_length": {"x": [1, 128, 512], "y": [1.0, t, e]}}}, planned=100)
            for seed, (t, e) in enumerate(zip(train, extra))]


def build_fixture(root: Path) -> Path:
    current = head()
    copy_cfg = {"steps": 1000, "batch_size": 256, "min_len": 2, "max_len": 64, "eval_lengths": "2-512:30", "seeds": [0, 1],
                "model": {"hidden_size": 512, "num_hidden_layers": 4, "num_heads": 16}}
    copy_settings = [{"name": "copy", "params": {}, "max_len": 420}]
    _write(root / "synthetic/copy-nope/results.json", synth("copying", "nope", copying_runs((0.05, 0.07)), copy_cfg, copy_settings, current))
    _write(root / "synthetic/copy-rope/results.json", synth("copying", "rope", copying_runs((0.0, 0.02)), copy_cfg, copy_settings, [FIRST_COMMIT, current]))
    _write(root / "synthetic/copy-srope/results.json", synth("copying", "selective_rope", copying_runs((0.8, 0.9)), copy_cfg, copy_settings, None))

    st_cfg = {"group": "S2", "train_len": 128, "eval_len": 512, "train_size": 100_000, "epochs": 4, "batch_size": 1024, "lrs": [5e-4],
              "model": {"hidden_size": 384, "num_hidden_layers": 1, "num_heads": 12}}
    st_settings = [{"name": "S2", "params": {}, "max_len": 129}]
    for position, train, extra in (("nope", (0.0, 0.01), (0.0, 0.0)), ("rope", (0.0, 0.0), (0.0, 0.0)), ("selective_rope", (1.0, 1.0), (0.97, 0.99))):
        _write(root / f"synthetic/st-{position}/results.json", synth("state_tracking", position, state_runs(train, extra), st_cfg, st_settings, current))

    mqar_cfg = {"vocab": 8192, "train_examples": 100_000, "epochs": 64, "batch_size": 0, "lrs": [1e-3], "model": {"num_hidden_layers": 2}}
    for position, accs in (("nope", (0.2, 0.4)), ("rope", (0.3, 0.5)), ("selective_rope", (0.6, 0.9))):
        runs = [run(f"T512-kv64-d{d}", 123, acc, planned=500) for d, acc in zip((64, 128), accs)]
        settings = [{"name": f"T512-kv64-d{d}", "params": {"seq_len": 512, "kv_pairs": 64}, "max_len": 512} for d in (64, 128)]
        _write(root / f"synthetic/mqar-{position}/results.json", synth("mqar", position, runs, mqar_cfg, settings, current))

    mad_cfg = {"batch_size": 128, "epochs": 200, "lrs": [1e-3], "weight_decays": [0.1], "model": {"hidden_size": 128, "num_hidden_layers": 2, "num_heads": 8}}
    names = ["in-context-recall/baseline", "compression/baseline"]
    for position, scores in (("nope", (0.80, 0.70)), ("rope", (0.90, 0.80)), ("selective_rope", (0.95, 0.81))):
        runs = [run(name, 12345, score, planned=100) for name, score in zip(names, scores)]
        settings = [{"name": name, "params": {}, "max_len": 128} for name in names]
        _write(root / f"synthetic/mad-{position}/results.json", synth("mad", position, runs, mad_cfg, settings, current))

    # srope train runs (a sweep for NoPE) with srope eval JSON and lm-eval results beside them
    lm_eval = {"nope": (0.40, 0.66, 0.42, 0.52, 0.48, 0.24), "rope": (0.41, 0.67, 0.42, 0.51, 0.47, 0.24), "selective_rope": (0.42, 0.68, 0.43, 0.53, 0.49, 0.26)}
    for position in ("nope", "rope", "selective_rope"):
        folder = root / "lm" / position / ("lr_0.001" if position == "nope" else "")
        config = {"preset": "gla-370m", "position": position, "model": {"num_hidden_layers": 4}, "data": "shakespeare", "max_steps": 200,
                  "seq_len": 512, "global_batch_size": 32, "lr": 1e-3, "seed": 1}
        record = {"config": config, "metrics": {"val_ppl": {"nope": 80.0, "rope": 79.0, "selective_rope": 78.0}[position]}, "complete": True}
        if position != "rope":
            record["provenance"] = prov(current)
        _write(folder / "run.json", record)
        _write(folder / "eval.json", {"model": str(folder / "model"), "data": {"split": "test"}, "train_seq_len": 512,
                                      "contexts": [{"seq_len": 512, "ppl": record["metrics"]["val_ppl"] + 1}, {"seq_len": 2048, "ppl": 90.0}]})
        accs = lm_eval[position]
        tasks = {"lambada_openai": {"acc,none": accs[0], "perplexity,none": 20.0}, "piqa": {"acc,none": accs[1]}, "hellaswag": {"acc_norm,none": accs[2]},
                 "winogrande": {"acc,none": accs[3]}, "arc_easy": {"acc,none": accs[4]}, "arc_challenge": {"acc_norm,none": accs[5]},
                 "wikitext": {"word_perplexity,none": 30.0}}
        _write(root / "lm-eval" / f"{position}.json", {"results": tasks, "config": {"model_args": f"pretrained=/elsewhere/lm/{folder.relative_to(root / 'lm')}/model,backend=causal"}})
    _write(root / "lm/nope/sweep.json", {"lrs": [1e-3, 3e-3], "selection": "lowest final val_ppl", "chosen": {"dir": "lr_0.001"},
                                         "runs": [{"lr": 1e-3, "dir": "lr_0.001"}, {"lr": 3e-3, "dir": "lr_0.003"}]})
    _write(root / "lm/nope/lr_0.003/run.json", {"config": {"preset": "gla-370m", "position": "nope", "model": {"num_hidden_layers": 4}, "data": "shakespeare",
                                                           "max_steps": 200, "seq_len": 512, "global_batch_size": 32, "lr": 3e-3, "seed": 1},
                                                "metrics": {"val_ppl": 95.0}, "provenance": prov(current)})

    # srope demo (our recipe; no provenance: it predates it)
    curve = {"length": [1, 128, 512], "seq_acc": [1.0, 0.0, 0.0]}
    results = {kind: {"seq_acc": {"train": acc, "eval": acc}, "curve": {**curve, "seq_acc": [1.0, acc, acc]}}
               for kind, acc in (("nope", 0.0), ("rope", 0.0), ("selective_rope", 1.0))}
    _write(root / "demo/seed0/results.json", {"task": "parity", "group": "S2", "train_len": 128, "eval_len": 512, "seed": 0, "preset": "cpu", "device": "cpu",
                                               "config": {"name": "cpu", "model": {"hidden_size": 64, "num_hidden_layers": 1, "num_heads": 4},
                                                          "curriculum": [[16, 100], [128, 200]], "batch_size": 64, "lr": 1.5e-3}, "results": results})
    _write(root / "theory/rff.json", {"not": "a result"})
    return root


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="session")
def written(fixture_dir, tmp_path_factory) -> dict:
    from srope.lab.report.write import write_report

    out = tmp_path_factory.mktemp("report")
    result = write_report([fixture_dir], out)
    result["out"] = out
    return result
