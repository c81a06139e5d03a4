"""The runner: a CPU smoke run per task family (JSON + PNG), learning, determinism, the
stopping rules, schedules, the model interface, the report and the CLI handler."""

from __future__ import annotations

import argparse
import json
import math
import types

import numpy as np
import pytest
import torch
from torch import nn

from srope.lab.tasks import run_synthetic
from srope.lab.tasks.cli import add_synth_arguments, run_synth_command
from srope.lab.config import apply_overrides
from srope.lab.tasks.common import ArrayStream, Prepared, Setting, check_train_config
from srope.lab.tasks.runner import head_at_targets, report, resolve_preset, train_run
from srope.lab.tasks.state_tracking import PRESETS as ST_PRESETS
from srope.lab.cli import srope_model_factory
from tests.lab.tasks.standin import gru_factory


SMOKE = {
    "state_tracking": {"group": "A3", "train_size": 64, "eval_size": 16, "train_len": 6, "eval_len": 10, "seeds": "0,1", "epochs": 2, "batch_size": 32},
    "copying": {"steps": 3, "epochs": 3, "batch_size": 4, "context_len": 40, "max_len": 8, "eval_lengths": "2-4,12", "eval_examples": 4,
                "autoregressive": "true", "ar_examples": 2, "ar_lengths": "3", "seeds": "0"},
    "mqar": {"vocab": 128, "configs": "64x4", "d_models": "8,16", "train_examples": 32, "test_examples": 16, "epochs": 2, "lrs": "1e-3,3e-3"},
    "mad": {"only": "compression/baseline,memorization/baseline,selective-copying/baseline", "max_train_examples": 16, "num_test_examples": 8,
            "epochs": 2, "lrs": "1e-3", "weight_decays": "0,0.1"},
}


@pytest.mark.parametrize("task", list(SMOKE))
def test_smoke_run_writes_json_and_plot(task, tmp_path):
    """Each task family end to end with the real model (a 1-layer GLA + Selective RoPE)."""
    overrides = {**SMOKE[task], "model.hidden_size": 16, "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
    results = run_synthetic(task, srope_model_factory, out=tmp_path, overrides=overrides, cache_dir=tmp_path / "cache", progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["complete"] and saved["task"] == task and saved["device"] == "cpu" and "torch" in saved["versions"]
    cfg = resolve_preset(task, None, overrides)
    n_settings = len(saved["settings"])
    assert len(saved["runs"]) == n_settings * len(cfg.lrs) * len(cfg.weight_decays) * len(cfg.seeds)
    assert set(saved["summary"]) == {s["name"] for s in saved["settings"]}
    for run in saved["runs"]:
        assert 0.0 <= run["score"] <= 1.0 and run["steps"] > 0 and run["history"] and run["seconds"] > 0
        assert 0.0 < run["eval_seconds"] < run["seconds"]
        assert run["graph_steps"] == 0  # the CPU's step is eager
    assert (tmp_path / "results.png").stat().st_size > 1000
    assert results["summary"] == saved["summary"]
    text = report([tmp_path])
    assert saved["label"] in text and "|---" in text
    partial = {k: v for k, v in saved.items() if k not in ("summary", "aggregate")}  # as written mid-sweep
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "results.json").write_text(json.dumps({**partial, "complete": False, "runs": saved["runs"][:1]}))
    assert "(incomplete)" in report([tmp_path / "partial"])
    if task == "mad":
        assert saved["aggregate"]["settings_per_task"] == {"compression": 1, "memorization": 1, "selective-copying": 1}
        assert "paper: GLA Selective RoPE" in text and "94.9" in text
    else:
        assert "without numbers" in text


def test_the_loop_learns_parity_and_a_constant_model_does_not(tmp_path):
    overrides = {"train_size": 64, "eval_size": 64, "train_len": 6, "eval_len": 12, "seeds": "0", "epochs": 60, "batch_size": 16, "lrs": "2e-2",
                 "model.hidden_size": 16}
    learned = run_synthetic("state_tracking", gru_factory, out=tmp_path / "gru", overrides=overrides, cache_dir=None, progress=False, plot=False)
    run = learned["runs"][0]
    assert run["stopped"] == "threshold" and run["score"] >= 0.99 and run["steps"] < 60 * 4
    assert learned["summary"]["S2"]["scalars"]["seq_acc_at_train_len"] >= 0.99

    class Constant(nn.Module):  # position-blind: it can only learn the label frequencies
        def __init__(self, vocab):
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(vocab))

        def forward(self, x):
            return self.bias.expand(*x.shape, -1)

    blind = run_synthetic("state_tracking", lambda r: Constant(r.vocab_size), out=tmp_path / "blind", overrides={**overrides, "epochs": 5},
                          cache_dir=None, progress=False, plot=False)
    assert blind["runs"][0]["score"] == 0.0 and blind["runs"][0]["stopped"] is None


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    overrides = {**SMOKE["state_tracking"], "seeds": "3", "model.hidden_size": 8}
    runs = [run_synthetic("state_tracking", gru_factory, out=tmp_path / str(i), overrides=o, cache_dir=None, progress=False, plot=False)["runs"][0]
            for i, o in enumerate([overrides, overrides, {**overrides, "seeds": "4"}])]
    assert runs[0]["history"] == runs[1]["history"] and runs[0]["metrics"] == runs[1]["metrics"]
    assert runs[0]["history"] != runs[2]["history"]


class _Scripted:
    """A fake task whose evaluations return a fixed sequence of scores."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), 0
        x = np.ones((4, 3), dtype=np.int64)
        self.prepared = Prepared(train=ArrayStream(x, x, batch_size=2, shuffle=False), evaluate=self.evaluate)

    def evaluate(self, forward):
        score = self.scores[self.calls]
        self.calls += 1
        return {"score": score, "tag": self.calls, **({"loss": self.losses[self.calls - 1]} if self.losses else {})}

    losses: list = []


@pytest.mark.parametrize("changes,scores,epochs,stopped,chosen", [
    ({"patience": 2}, [0.1, 0.3, 0.2, 0.25, 0.9], 4, "patience", 0.25),
    ({"patience": 2, "select": "best"}, [0.1, 0.3, 0.2, 0.25, 0.9], 4, "patience", 0.3),
    ({"stop_at": 0.5}, [0.2, 0.5, 0.6, 0.1], 3, "threshold", 0.6),
    ({"stop_at": 0.5, "stop_inclusive": True}, [0.2, 0.5, 0.6, 0.1], 2, "threshold", 0.5),
    ({}, [0.2, 0.1, 0.3, 0.4], 4, None, 0.4),
])
def test_stopping_rules(changes, scores, epochs, stopped, chosen):
    cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": 4 if not changes else 10, "stop_at": None, "stop_inclusive": False, "select": "final", **changes})
    fake = _Scripted(scores)
    setting = Setting(name="fake", group="fake", vocab_size=3, max_len=3, params={})
    record = train_run("state_tracking", cfg, setting, fake.prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                       lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)
    assert record["epochs"] == epochs and record["stopped"] == stopped and record["score"] == chosen
    assert record["steps"] == 2 * epochs and [h["score"] for h in record["history"]] == scores[:epochs]


def test_best_of_equal_scores_is_the_later_evaluation_and_the_record_says_which_step():
    """A run whose scores are all 0 reports the model it ended with (not its first evaluation);
    a tie is not an improvement for patience; every record names the reported step and keeps
    the last and the best evaluation's scalars with theirs."""
    setting = Setting(name="fake", group="fake", vocab_size=3, max_len=3, params={})

    def record(scores, **changes):
        cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": len(scores), "stop_at": None, "select": "best", **changes})
        return train_run("state_tracking", cfg, setting, _Scripted(scores).prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                         lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)

    flat = record([0.0, 0.0, 0.0])
    assert flat["reported_step"] == 6 and flat["metrics"]["tag"] == 3 and "step" not in flat["metrics"]
    peaked = record([0.0, 0.5, 0.1])
    assert peaked["reported_step"] == 4 and peaked["metrics"]["tag"] == 2 and peaked["score"] == 0.5
    assert peaked["best"]["step"] == 4 and peaked["final"] == {"score": 0.1, "tag": 3, "step": 6}
    tied = record([0.3, 0.3, 0.3, 0.3], epochs=10, patience=2)
    assert tied["stopped"] == "patience" and tied["epochs"] == 3 and tied["reported_step"] == 6
    assert record([0.2, 0.1], select="final")["reported_step"] == 4


def test_min_loss_reports_the_evaluation_of_least_test_loss():
    cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": 5, "stop_at": None, "select": "min_loss"})
    fake = _Scripted([0.1, 0.3, 0.2, 0.25, 0.9])
    fake.losses = [2.0, 1.0, float("nan"), 0.5, 0.7]
    setting = Setting(name="fake", group="fake", vocab_size=3, max_len=3, params={})
    record = train_run("state_tracking", cfg, setting, fake.prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                       lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)
    assert record["score"] == 0.25 and record["metrics"]["tag"] == 4 and record["min_loss"]["loss"] == 0.5
    assert record["final"]["score"] == 0.9 and record["best"]["score"] == 0.9
    assert [h["loss"] for h in record["history"]][:2] == [2.0, 1.0]
    with pytest.raises(ValueError, match="min_loss.*report 'loss'"):
        train_run("state_tracking", cfg, setting, _Scripted([0.1] * 5).prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                  lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)


def test_a_diverging_run_is_stopped_and_flagged():
    class Exploding(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return (self.w * float("inf") - self.w * float("inf")).expand(*x.shape, 3)  # NaN logits

    cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": 5, "stop_at": None})
    record = train_run("state_tracking", cfg, Setting("fake", "fake", 3, 3, {}), _Scripted([0.0] * 5).prepared, lambda r: Exploding(),
                       lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)
    assert record["diverged"] and record["stopped"] == "diverged" and record["epochs"] == 1
    assert record["history"][0]["train_loss"] is None
    json.dumps(record, allow_nan=False)


def test_max_steps_caps_a_run():
    cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": 10, "stop_at": None, "max_steps": 3})
    fake = _Scripted([0.0] * 10)
    record = train_run("state_tracking", cfg, Setting("fake", "fake", 3, 3, {}), fake.prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                       lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)
    assert record["steps"] == 3 and record["planned_steps"] == 3 and record["epochs"] == 2


def test_max_seconds_ends_a_run_with_an_evaluation():
    cfg = apply_overrides(ST_PRESETS["authors"], {"epochs": 10, "stop_at": None, "max_seconds": 1e-9})
    fake = _Scripted([0.25] * 10)
    record = train_run("state_tracking", cfg, Setting("fake", "fake", 3, 3, {}), fake.prepared, lambda r: nn.Sequential(nn.Embedding(3, 4), nn.Linear(4, 3)),
                       lr=1e-3, weight_decay=0.0, seed=0, device=torch.device("cpu"), progress=False)
    assert record["steps"] == 1 and record["stopped"] == "time" and record["epochs"] == 1 and record["score"] == 0.25
    with pytest.raises(ValueError, match="max_seconds"):
        check_train_config(apply_overrides(ST_PRESETS["authors"], {"max_seconds": 0}))


def test_loss_curve_holds_the_mean_loss_of_every_window(tmp_path):
    overrides = {**SMOKE["state_tracking"], "seeds": "0", "epochs": 3, "model.hidden_size": 8, "threads": 1}  # 2 steps an epoch
    per_step = run_synthetic("state_tracking", gru_factory, out=tmp_path / "a", overrides={**overrides, "loss_every": 1}, cache_dir=None,
                             progress=False)["runs"][0]
    assert (tmp_path / "a" / "loss.png").stat().st_size > 1000
    assert [step for step, _ in per_step["loss_curve"]] == list(range(1, 7))
    for epoch in per_step["history"]:  # an epoch's mean loss is the mean of its steps' losses
        losses = [loss for step, loss in per_step["loss_curve"] if epoch["step"] - 2 < step <= epoch["step"]]
        assert epoch["train_loss"] == pytest.approx(sum(losses) / 2, rel=1e-6)
    windows = run_synthetic("state_tracking", gru_factory, out=tmp_path / "b", overrides={**overrides, "loss_every": 4}, cache_dir=None,
                            progress=False, plot=False)["runs"][0]
    assert [step for step, _ in windows["loss_curve"]] == [4]  # across an epoch's end; steps 5-6 make no full window
    assert windows["loss_curve"][0][1] == pytest.approx(sum(loss for _, loss in per_step["loss_curve"][:4]) / 4, rel=1e-6)
    none = run_synthetic("state_tracking", gru_factory, out=tmp_path / "c", overrides={**overrides, "loss_every": 0}, cache_dir=None,
                         progress=False)["runs"][0]
    assert not (tmp_path / "c" / "loss.png").exists()
    assert "loss_curve" not in none and none["weights_sha256"] == per_step["weights_sha256"]  # recording changes no number
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="loss_every"):
            check_train_config(apply_overrides(ST_PRESETS["authors"], {"loss_every": bad}))


def test_model_interface(tmp_path):
    requests = []

    class HFStyle(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.embed = nn.Embedding(vocab, 8)
            self.lm_head = nn.Linear(8, vocab + 5)  # a padded vocabulary is fine

        def forward(self, x):
            return types.SimpleNamespace(logits=self.lm_head(self.embed(x)))

    def factory(request):
        requests.append(request)
        return HFStyle(request.vocab_size)

    overrides = {**SMOKE["mqar"], "epochs": 1, "lrs": "1e-3", "position_type": "rope", "position.theta": "1e4", "mixer": "attention"}
    results = run_synthetic("mqar", factory, out=tmp_path, overrides=overrides, preset="zoology", cache_dir=None, progress=False, plot=False)
    assert [r.model["hidden_size"] for r in requests] == [8, 16] and all(r.model["num_hidden_layers"] == 2 for r in requests)
    assert requests[0].position == {"type": "rope", "theta": 1e4} and requests[0].mixer == "attention"
    assert requests[0].vocab_size == 128 and requests[0].max_len == 64 and requests[0].task == "mqar"
    assert results["label"] == "attention/rope"

    with pytest.raises(ValueError, match="logits must be"):
        run_synthetic("mqar", lambda r: nn.Embedding(r.vocab_size, 4), out=tmp_path / "bad", overrides=overrides, preset="zoology", cache_dir=None, progress=False)
    with pytest.raises(ValueError, match="unknown setting"):
        run_synthetic("mqar", factory, out=tmp_path / "x", overrides={"learning_rate": 1}, cache_dir=None)
    with pytest.raises(ValueError, match="unknown synthetic task"):
        run_synthetic("parity", factory, out=tmp_path / "x")
    with pytest.raises(ValueError, match="unknown preset"):
        run_synthetic("mqar", factory, out=tmp_path / "x", preset="authors")


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_synth_arguments(parser)
    return parser.parse_args(argv)


def test_cli_handler(tmp_path, capsys):
    assert run_synth_command(_parse(["mad", "--dry-run"]), gru_factory) == 0
    printed = capsys.readouterr().out
    assert "66 settings x 6 runs each" in printed and "memorization/vocab_size=8192" in printed
    argv = ["state_tracking", "--position", "nope", "--mixer", "gla", "--out", str(tmp_path / "run"), "--no-progress", "--cache-dir", "none"]
    argv += [f"--set={k}={v}" for k, v in {**SMOKE["state_tracking"], "seeds": "0", "model.hidden_size": 8}.items()]
    assert run_synth_command(_parse(argv), gru_factory) == 0
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["label"] == "gla/nope" and saved["config"]["group"] == "A3" and saved["overrides"]["position_type"] == "nope"
    assert "| gla/nope [" in capsys.readouterr().out  # the sweep's closing table (srope.lab.report.folders)
    with pytest.raises(ValueError, match=r"`srope synth report` is now `srope report DIR\.\.\.`"):
        run_synth_command(_parse(["report", str(tmp_path / "run")]), gru_factory)
    with pytest.raises(ValueError, match="unknown setting"):
        run_synth_command(_parse(["copying", "--set", "bogus=1", "--out", str(tmp_path / "y")]), gru_factory)
    with pytest.raises(ValueError, match="--out"):
        run_synth_command(_parse(["copying"]), gru_factory)


# What a sweep started from another's results.json may record otherwise: the overrides of its
# own command line (none), its provenance (commit, command, wall times) and its seconds.
MAY_DIFFER_FROM_THE_FILE = ("overrides", "provenance", "seconds")
TIMING = ("seconds", "eval_seconds")


def test_a_sweep_started_from_a_sweeps_results_repeats_it(tmp_path):
    """`srope synth TASK --config FIRST/results.json --out SECOND` runs the first sweep's preset and
    settings again, with the same numbers bitwise; options and --set on top change what they
    name; a hand-written TOML file says the same as --set."""
    common = ["--no-progress", "--cache-dir", "none", "--device", "cpu"]
    sets = {**SMOKE["state_tracking"], "seeds": "0", "model.hidden_size": 16, "model.num_heads": 2, "model.num_hidden_layers": 1}
    first, second = tmp_path / "first", tmp_path / "second"
    argv = ["state_tracking", "--preset", "cpu", "--position", "rope", "--out", str(first), *common, *(f"--set={k}={v}" for k, v in sets.items())]
    assert run_synth_command(_parse(argv), srope_model_factory) == 0
    assert run_synth_command(_parse(["state_tracking", "--config", str(first / "results.json"), "--out", str(second), *common]), srope_model_factory) == 0

    def kept(results: dict) -> dict:
        runs = [{k: v for k, v in run.items() if k not in TIMING} for run in results["runs"]]
        return {**{k: v for k, v in results.items() if k not in MAY_DIFFER_FROM_THE_FILE}, "runs": runs}

    a, b = (json.loads((folder / "results.json").read_text()) for folder in (first, second))
    assert kept(b) == kept(a) and b["preset"] == "cpu" and b["position_type"] == "rope" and b["overrides"] == {}
    cfg = resolve_preset("state_tracking", "cpu", {**sets, "position_type": "rope"})
    assert a["config"] == cfg.to_dict()
    on_top = {"mixer": "attention", "seeds": "1", "position.theta": "500"}
    assert resolve_preset("state_tracking", None, on_top, config=first / "results.json") == apply_overrides(cfg, on_top)
    (tmp_path / "hand.toml").write_text('task = "state_tracking"\npreset = "cpu"\nseeds = [1]\n[model]\nhidden_size = 16\n')
    assert resolve_preset("state_tracking", None, None, config=tmp_path / "hand.toml") == resolve_preset("state_tracking", "cpu", {"seeds": "1", "model": '{"hidden_size": 16}'})


def test_presets_resolve_and_check():
    for task, module_presets in {"mqar": ["zoology", "paper"], "mad": ["paper"], "copying": ["authors", "paper"],
                                 "state_tracking": ["authors", "paper", "paper_a3"]}.items():
        for name in module_presets:
            cfg = resolve_preset(task, name)
            assert cfg.lrs and cfg.seeds and not math.isnan(cfg.lrs[0])
    with pytest.raises(ValueError, match="schedule"):
        resolve_preset("copying", None, {"schedule": "step"})
    with pytest.raises(ValueError, match="group"):
        resolve_preset("state_tracking", None, {"group": "X3"})


@pytest.mark.parametrize("task,preset", [("mqar", "zoology"), ("mad", "paper"), ("copying", "authors"), ("state_tracking", "authors"), ("state_tracking", "paper_a3")])
def test_preset_position_options_build_the_real_modules(task, preset):
    """Every position-encoding option a preset carries is accepted by srope.modules."""
    from srope.modules import build_position_encoding

    cfg = resolve_preset(task, preset)
    hidden = cfg.model.get("hidden_size", 64)
    heads = cfg.model.get("num_heads", 2)
    head_dim = int(hidden * cfg.model.get("expand_k", 1.0)) // heads
    assert set(cfg.position) == {"rope", "selective_rope"}
    for kind, options in cfg.position.items():
        module = build_position_encoding({"type": kind, **options}, hidden_size=hidden, num_heads=heads, head_dim=head_dim)
        q = torch.randn(2, 5, heads, head_dim)
        out_q, out_k, _ = module(q, q.clone(), torch.randn(2, 5, hidden))
        assert out_q.shape == q.shape and torch.isfinite(out_q).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runner_on_cuda_uses_bf16_autocast(tmp_path):
    seen = []

    class Recording(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.gru = gru_factory(types.SimpleNamespace(vocab_size=vocab, model={"hidden_size": 16}))

        def forward(self, x):
            logits = self.gru(x)
            seen.append((logits.device.type, logits.dtype))
            return logits

    overrides = {**SMOKE["state_tracking"], "train_size": 256, "eval_size": 64, "epochs": 20, "lrs": "1e-2", "seeds": "0"}
    results = run_synthetic("state_tracking", lambda r: Recording(r.vocab_size), out=tmp_path, overrides=overrides, device="cuda", cache_dir=None, progress=False)
    assert results["device"].startswith("cuda") and results["device_name"]
    assert ("cuda", torch.bfloat16) in seen and all(device == "cuda" for device, _ in seen)
    assert (tmp_path / "results.png").exists() and results["runs"][0]["score"] >= 0.0


def _keeping(models: dict):
    """``factory(tag)``: srope's model factory that keeps the model it builds in ``models[tag]``."""

    def factory(tag):
        def make(request):
            models[tag] = srope_model_factory(request)
            return models[tag]

        return make

    return factory


GRAPH_CASES = {
    # batches of 64 and 36 rows: warm-up, eager, warm-up (after an eager step), eager, capture, eager, replay, eager
    "state_tracking": ({**SMOKE["state_tracking"], "train_size": 100, "batch_size": 64, "epochs": 4, "seeds": "0", "lrs": "3e-3", "grad_clip": 1.0,
                        "model.hidden_size": 32}, 8),
    # the head at the queries only (index_select inside the graph): 5 equal batches an epoch
    "mqar": ({**SMOKE["mqar"], "d_models": "16", "lrs": "3e-3", "train_examples": 160, "batch_size": 32, "head_at_targets": "on", "grad_clip": 1.0}, 10),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("task", list(GRAPH_CASES))
def test_the_cuda_graph_step_trains_as_the_eager_step(tmp_path, task):
    """cuda_graph='on' (the step captured after two eager warm-up steps and replayed; batches
    of other shapes eager) against 'off', the real model (GLA + Selective RoPE), clipping on."""
    models = {}
    factory = _keeping(models)
    settings, steps = GRAPH_CASES[task]
    overrides = {**settings, "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
    runs = {tag: run_synthetic(task, factory(tag), out=tmp_path / tag, overrides={**overrides, "cuda_graph": tag}, device="cuda",
                               cache_dir=None, progress=False, plot=False)["runs"][0] for tag in ("off", "on")}  # fmt: skip
    assert runs["on"]["steps"] == runs["off"]["steps"] == steps
    assert runs["off"]["graph_steps"] == 0 < runs["on"]["graph_steps"] < steps  # the record says which steps were replayed
    losses = [[h["train_loss"] for h in runs[tag]["history"]] for tag in ("off", "on")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4), losses
    for (name, a), b in zip(models["off"].named_parameters(), models["on"].parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5), name


@pytest.mark.parametrize("task", ["mqar", "mad"])
def test_an_evaluation_in_parts_scores_as_one_in_a_piece(tmp_path, monkeypatch, task):
    """A test batch whose logits exceed EVAL_LOGITS runs in parts (here one row at a time):
    the same predictions, so the same scores, and the same summed test loss (MAD's)."""
    from srope.lab.tasks import training  # train_run looks these names up there

    overrides = {**SMOKE[task], "model.hidden_size": 16, "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
    histories = {}
    for name, limit in (("whole", training.EVAL_LOGITS), ("rows", 1)):
        monkeypatch.setattr(training, "EVAL_LOGITS", limit)
        runs = run_synthetic(task, srope_model_factory, out=tmp_path / name, overrides=overrides, cache_dir=tmp_path / "cache", progress=False, plot=False)["runs"]
        histories[name] = [{k: v for k, v in h.items() if k in ("score", "loss")} for run in runs for h in run["history"]]
    assert histories["whole"] and [h["score"] for h in histories["rows"]] == [h["score"] for h in histories["whole"]]
    if task == "mad":
        assert [h["loss"] for h in histories["rows"]] == pytest.approx([h["loss"] for h in histories["whole"]], rel=1e-5)


@pytest.mark.parametrize("task", ["copying", "mqar", "mad"])
def test_an_evaluation_out_of_device_memory_continues_in_smaller_parts(tmp_path, monkeypatch, task):
    """A forward pass of the evaluation that runs out of device memory is retried with half the
    rows, and the run keeps the rows that fit: the same scores as without the shortage, a warning
    that says so, and an error only when one row does not fit."""
    from srope.lab.tasks import training  # train_run looks these names up there

    overrides = {**SMOKE[task], "model.hidden_size": 16, "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
    logits, passes = training.task_logits, []

    def short_of_memory(fits):
        def task_logits(model, x, vocab):
            if not torch.is_grad_enabled():  # the evaluation's passes, not the training step's
                passes.append(len(x))
                if len(x) > fits:
                    raise torch.OutOfMemoryError(f"stand-in: {len(x)} rows do not fit")
            return logits(model, x, vocab)
        return task_logits

    def scores(name):
        runs = run_synthetic(task, srope_model_factory, out=tmp_path / name, overrides=overrides, cache_dir=tmp_path / "cache", progress=False, plot=False)["runs"]
        return [{k: v for k, v in h.items() if k in ("score", "loss")} for run in runs for h in run["history"]]

    whole = scores("whole")
    monkeypatch.setattr(training, "task_logits", short_of_memory(3))
    with pytest.warns(UserWarning, match="ran out of device memory"):
        short = scores("short")
    failed, fitted = [n for n in passes if n > 3], [n for n in passes if n <= 3]
    assert failed and len(failed) < len(fitted)  # it kept the rows that fit instead of trying more every time
    assert [h["score"] for h in short] == [h["score"] for h in whole]
    if task == "mad":
        assert [h["loss"] for h in short] == pytest.approx([h["loss"] for h in whole], rel=1e-5)
    monkeypatch.setattr(training, "task_logits", short_of_memory(0))
    with pytest.raises(torch.OutOfMemoryError), pytest.warns(UserWarning):
        scores("none")


def test_head_at_targets_auto_is_on_for_few_targets_on_cuda_with_a_head():
    """'auto' chooses the head at the targets only where it pays and keeps a captured step's
    shapes: a task with the same few targets in every example (MQAR), on CUDA, and a model
    with its body and head apart; 'on' and 'off' are what they say."""
    with_head, without = nn.Module(), nn.Linear(2, 2)
    with_head.model, with_head.lm_head = nn.Linear(2, 2), nn.Linear(2, 2)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # only the device's type is read

    def choice(task, model, device, value="auto"):
        return head_at_targets(types.SimpleNamespace(head_at_targets=value), task, model, device)

    assert choice("mqar", with_head, cuda)
    assert not choice("mqar", with_head, cpu) and not choice("mqar", without, cuda)
    assert not any(choice(task, with_head, cuda) for task in ("copying", "mad", "state_tracking"))
    assert choice("copying", with_head, cpu, "on") and not choice("mqar", with_head, cuda, "off")


def test_the_head_at_targets_only_gives_the_same_training(tmp_path):
    """head_at_targets: the head and the loss at the scored positions only (MQAR's queries) is
    the same mean loss as over every position's logits; 'on' with a model without a body and
    head apart is refused, 'auto' leaves it (and the CPU) the full head."""
    models = {}
    factory = _keeping(models)

    overrides = {**SMOKE["mqar"], "d_models": "16", "lrs": "3e-3", "model.num_heads": 2, "model.num_hidden_layers": 1, "mixer": "gla", "position_type": "selective_rope"}
    runs = {flag: run_synthetic("mqar", factory(flag), out=tmp_path / flag, overrides={**overrides, "head_at_targets": flag}, cache_dir=None,
                                progress=False, plot=False)["runs"][0] for flag in ("off", "on")}  # fmt: skip
    assert (runs["off"]["head_at_targets"], runs["on"]["head_at_targets"]) == (False, True)
    losses = [[h["train_loss"] for h in runs[flag]["history"]] for flag in ("off", "on")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and runs["on"]["steps"] == runs["off"]["steps"] > 0
    for (name, a), b in zip(models["off"].named_parameters(), models["on"].parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    gru = {**SMOKE["mqar"], "d_models": "8"}
    with pytest.raises(ValueError, match="head_at_targets needs a model with .model"):
        run_synthetic("mqar", gru_factory, out=tmp_path / "gru", overrides={**gru, "head_at_targets": "on"}, cache_dir=None, progress=False, plot=False)
    auto = run_synthetic("mqar", gru_factory, out=tmp_path / "auto", overrides=gru, cache_dir=None, progress=False, plot=False)
    assert auto["config"]["head_at_targets"] == "auto" and not auto["runs"][0]["head_at_targets"]
    with pytest.raises(ValueError, match="head_at_targets must be 'auto', 'on' or 'off', got 'true'"):
        run_synthetic("mqar", gru_factory, out=tmp_path / "bad", overrides={**gru, "head_at_targets": "true"}, cache_dir=None, progress=False, plot=False)


def test_a_finished_run_is_freed_before_the_next_one_starts(tmp_path):
    """A sweep's runs follow each other in one process: a model held only by a reference
    cycle (and with it, on CUDA, the run's captured step and its memory pool) must be gone
    when the next run builds its model, whenever the garbage collector would have run."""
    import gc
    import weakref

    built, alive_at_build = [], []

    def cyclic_factory(request):
        alive_at_build.append([ref() is not None for ref in built])
        model = gru_factory(request)
        model.__dict__["_cycle"] = [model]  # as the frames torch.fx.wrap leaves behind hold a first-built model
        built.append(weakref.ref(model))
        return model

    gc.disable()
    try:
        run_synthetic("state_tracking", cyclic_factory, out=tmp_path, overrides={**SMOKE["state_tracking"], "seeds": "0,1,2", "model.hidden_size": 8},
                      cache_dir=None, progress=False, plot=False)
    finally:
        gc.enable()
    assert alive_at_build == [[], [False], [False, False]]
