"""``srope demo``: a tiny run end to end, argument checks, and the metric recomputed by XOR."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from srope.lab import demo
from srope.lab.tasks import state_tracking
from srope.lab.tasks.groups import get_group

BOS = state_tracking.bos_id(get_group("S2"))

# A few seconds of CPU: a 16-wide GLA, lengths 6 then 9 (odd, not a multiple of the GLA
# chunk), evaluation at 4x the training length.
TINY = dataclasses.replace(
    demo.CPU,
    name="tiny",
    model={"hidden_size": 16, "num_hidden_layers": 1, "num_heads": 2, "expand_k": 0.5, "expand_v": 1.0, "use_short_conv": True},
    curriculum=((6, 4), (9, 4)),
    lr_by_stage=None,
    batch_size=8,
    warmup_steps=2,
    cooldown_steps=3,
    eval_len=36,
    eval_size=24,
    eval_batch_size=10,
)


def parity_targets(bits: np.ndarray) -> np.ndarray:
    """``[N, L+1]`` targets for ``[N, L]`` bits: BOS, then the XOR of the bits so far."""
    states = np.bitwise_xor.accumulate(bits.astype(np.int64), axis=1)
    return np.concatenate([np.full((len(bits), 1), BOS), states], axis=1)


def test_tiny_demo_writes_results_and_plot(tmp_path, capsys):
    results = demo.run_demo(tmp_path / "out", device="cpu", seed=3, config=TINY, progress=False)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["task"] == "parity" and saved["device"] == "cpu" and saved["seed"] == 3
    assert saved["train_len"] == 9 and saved["eval_len"] == 36
    assert saved["seconds"] > 0 and saved["cpu_seconds"] > 0
    assert set(saved["results"]) == {"nope", "rope", "selective_rope"}
    counts = {}
    for kind, run in saved["results"].items():
        assert set(run["seq_acc"]) == {"train", "eval"}
        assert all(0.0 <= v <= 1.0 for v in [*run["seq_acc"].values(), *run["token_acc"].values()])
        assert run["curve"]["length"] == list(range(1, 37)) and len(run["curve"]["seq_acc"]) == 36
        curve = np.array(run["curve"]["seq_acc"])
        assert np.all(np.diff(curve) <= 0), "a prefix accuracy cannot grow with the prefix length"
        assert curve[-1] == pytest.approx(run["seq_acc"]["eval"])
        assert len(run["loss"]) == TINY.steps and run["finite"]
        counts[kind] = (run["parameters"], run["position_parameters"])
    # Same model up to the position encoding's own parameters (NoPE and RoPE have none).
    assert counts["nope"] == counts["rope"] == (counts["nope"][0], 0)
    assert counts["selective_rope"][0] - counts["selective_rope"][1] == counts["nope"][0] > 0
    assert saved["eval_sequences"]["train"] + saved["eval_sequences"]["eval"] + saved["eval_sequences"]["dropped_seen_in_training"] == 2 * TINY.eval_size
    assert set(saved["targets"]) == {"selective_rope_learns", "selective_rope_extrapolates", "nope_fails", "rope_fails"}
    png = (tmp_path / "out" / "parity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    printed = capsys.readouterr().out
    for label in ("NoPE", "RoPE", "Selective RoPE", "seq_acc@9", "seq_acc@36"):
        assert label in printed


def test_parallel_workers_match_sequential(tmp_path):
    """Models trained in worker processes (1 thread each) equal those trained in this one."""
    config = dataclasses.replace(TINY, curriculum=((7, 5),), eval_len=28)
    one = demo.run_demo(tmp_path / "one", seed=1, config=config, workers=1, progress=False)
    three = demo.run_demo(tmp_path / "three", seed=1, config=config, workers=3, progress=False)
    assert three["workers"] == 3 and three["threads_per_worker"] >= 1
    # both sides rounded to the report's 3 decimals (a float sum of 3-decimal values can exceed
    # its own rounding: 0.42 against 0.42000000000000004)
    assert three["cpu_seconds"] >= round(sum(three["results"][kind]["cpu_seconds"] for kind in demo.POSITIONS), 3) > 0
    for kind in demo.POSITIONS:
        np.testing.assert_allclose(three["results"][kind]["loss"], one["results"][kind]["loss"], rtol=1e-4, atol=1e-6)


def test_default_workers():
    """All three models at once on a CPU with 2+ cores; one at a time on a single core or CUDA."""
    assert demo.default_workers("cpu", 2) == demo.default_workers("cpu", 16) == 3
    assert demo.default_workers("cpu", 1) == demo.default_workers("cuda", 16) == 1


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"out": 3}, TypeError, "out must be a folder path"),
        ({"out": ""}, ValueError, "non-empty"),
        ({"device": "tpu"}, ValueError, r"device must be one of \('cpu', 'cuda'\)"),
        ({"device": 0}, TypeError, "device must be a string"),
        ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*32\)"),
        ({"seed": 2**32}, ValueError, r"seed must be in \[0, 2\*\*32\)"),
        ({"seed": 1.5}, TypeError, "seed must be an integer"),
        ({"seed": True}, TypeError, "seed must be an integer"),
        ({"preset": "gpu"}, ValueError, "preset must be one of"),
        ({"workers": 0}, ValueError, r"workers must be None \(automatic\) or an integer in \[1, 3\]"),
        ({"workers": 4}, ValueError, r"in \[1, 3\]"),
        ({"config": {"lr": 1e-3}}, TypeError, "config must be a DemoConfig"),
        ({"config": dataclasses.replace(TINY, eval_len=8)}, ValueError, r"eval_len \(8\) must be >= the training length \(9\)"),
        ({"config": dataclasses.replace(TINY, curriculum=())}, ValueError, "at least one"),
        ({"config": dataclasses.replace(TINY, curriculum=((0, 5),))}, ValueError, "length >= 1, steps >= 1"),
        ({"config": dataclasses.replace(TINY, warmup_steps=6)}, ValueError, r"warmup_steps \+ cooldown_steps <= steps=8"),
        ({"config": dataclasses.replace(TINY, label_smoothing=1.0)}, ValueError, r"label_smoothing must be in \[0, 1\)"),
        ({"config": dataclasses.replace(TINY, lr=0.0)}, ValueError, "lr must be a positive number"),
        ({"config": dataclasses.replace(TINY, betas=(0.9, 1.0))}, ValueError, "betas"),
        ({"config": dataclasses.replace(TINY, adam_eps=0.0)}, ValueError, "adam_eps must be a positive number"),
        ({"config": dataclasses.replace(TINY, eval_size=0)}, ValueError, "eval_size must be a positive integer"),
        ({"config": dataclasses.replace(TINY, mixed_density=1.5)}, ValueError, r"mixed_density must be in \[0, 1\]"),
        ({"config": dataclasses.replace(TINY, mixed_from_stage=2)}, ValueError, r"mixed_from_stage must be a curriculum stage index in \[0, 2\)"),
        ({"config": dataclasses.replace(TINY, cuda_graph="yes")}, ValueError, "cuda_graph must be 'off', 'auto' or 'on'"),
        ({"config": dataclasses.replace(TINY, autotune="fast")}, ValueError, "autotune must be 'full' or 'first'"),
    ],
)
def test_run_demo_rejects_bad_arguments(tmp_path, kwargs, error, match):
    args = {"out": tmp_path / "never", "config": TINY, "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        demo.run_demo(**args)
    assert not (tmp_path / "never").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when no GPU is visible")
def test_cuda_without_gpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs a visible CUDA GPU"):
        demo.run_demo(tmp_path, device="cuda", config=TINY, progress=False)


class ParityOracle(nn.Module):
    """Logits of the true parity (by cumulative XOR), wrong on purpose at chosen places:
    position ``3`` of every row whose first two bits are 1, 1, and position ``L`` of every
    row that ends in 0."""

    def forward(self, input_ids):
        bits = (input_ids[:, 1:] == 1).long()
        states = torch.cumsum(bits, dim=1) % 2
        preds = torch.cat([torch.full_like(input_ids[:, :1], BOS), states], dim=1)
        wrong = preds.clone()
        wrong[:, 1:] = 1 - wrong[:, 1:]
        corrupt = torch.zeros_like(preds, dtype=torch.bool)
        corrupt[:, 3] = (bits[:, 0] == 1) & (bits[:, 1] == 1)
        corrupt[:, -1] |= bits[:, -1] == 0
        preds = torch.where(corrupt, wrong, preds)
        return type("Output", (), {"logits": nn.functional.one_hot(preds, 4).float() * 5.0 - 1.0})()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_captured_demo_step_trains_as_the_eager_step():
    """``cuda_graph="on"``: each curriculum stage's step is captured after its two warm-up
    steps (one graph per stage, its length and phase noise in it) and the losses follow the
    eager run's to rounding (the captured AdamW keeps its step counts on the device)."""
    from srope.lab.demo.model import build_model
    from srope.lab.demo.training import PhaseNoise, device_batches, make_trainer

    config = dataclasses.replace(TINY, curriculum=((6, 8), (9, 8), (9, 6)), phase_noise_by_stage=(0.2, 0.1, 0.0), bf16_autocast=True)
    device = torch.device("cuda")
    losses, replayed = {}, {}
    for mode in ("off", "on"):
        model = build_model(dataclasses.replace(config, cuda_graph=mode), "selective_rope", 0).to(device)
        trainer = make_trainer(model, dataclasses.replace(config, cuda_graph=mode), device, [PhaseNoise(model, config)])
        steps = []
        for step, inputs, targets in device_batches(config, 0, device):
            trainer.before_step(step)
            steps.append(float(trainer.train_step(step, trainer.lr_at(step), inputs, targets)))
        losses[mode], replayed[mode] = steps, trainer.graph_steps
    assert replayed == {"off": 0, "on": 22 - 2 * 3}
    assert np.allclose(losses["on"], losses["off"], rtol=0, atol=2e-3), (losses["on"], losses["off"])


def test_metric_recomputed_by_xor():
    data = demo.eval_sets(TINY, seed=5)
    inputs, targets = data["eval"]
    bits = inputs[:, 1:].astype(np.int64)
    assert (inputs[:, 0] == BOS).all() and set(np.unique(bits)) <= {0, 1}
    np.testing.assert_array_equal(targets, parity_targets(bits))

    preds = demo.predict(ParityOracle(), inputs, batch_size=7, device=torch.device("cpu"))
    scored = demo.score(preds, targets)
    first_two_ones = (bits[:, 0] == 1) & (bits[:, 1] == 1)
    ends_in_zero = bits[:, -1] == 0
    length = bits.shape[1]
    assert scored["seq_acc"] == pytest.approx(np.mean(~first_two_ones & ~ends_in_zero))
    expected_curve = [np.mean(~first_two_ones) if t >= 3 else 1.0 for t in range(1, length + 1)]
    expected_curve[-1] = np.mean(~first_two_ones & ~ends_in_zero)
    np.testing.assert_allclose(scored["curve"], expected_curve)
    errors = first_two_ones.sum() + ends_in_zero.sum()
    assert scored["token_acc"] == pytest.approx(1 - errors / targets.size)


def test_mixed_density_stream():
    """From ``mixed_from_stage`` on, ``mixed_density`` of the rows have their own bit density
    (row means spread far beyond a fair coin's), labels stay the XOR of the bits, and
    earlier stages stay uniform."""
    config = dataclasses.replace(TINY, curriculum=((64, 30), (64, 30)), batch_size=64, mixed_density=1.0, mixed_from_stage=1)
    spread = {}
    for step, inputs, targets in demo.train_batches(config, seed=2):
        bits = inputs[:, 1:].astype(np.int64)
        np.testing.assert_array_equal(targets, parity_targets(bits))
        spread.setdefault(config.stage_at(step), []).append(bits.mean(1).std())
    fair = 0.5 / np.sqrt(64)  # the std of a fair-coin row mean
    assert np.mean(spread[0]) < 1.3 * fair and np.mean(spread[1]) > 3 * fair  # U(0, 1) densities: std ~0.29
    half = dataclasses.replace(config, mixed_density=0.5, mixed_from_stage=0)
    extreme = [np.mean(np.abs(x[:, 1:].mean(1) - 0.5) > 0.3) for _, x, _ in demo.train_batches(half, seed=2)]
    assert 0.17 < np.mean(extreme) < 0.23  # half the rows mixed, of which ~40% have |p - 1/2| > 0.3; fair rows ~never


def test_position_weight_decay_groups():
    config = dataclasses.replace(TINY, weight_decay=0.1, position_weight_decay=False)
    for kind, decays in (("nope", [0.1]), ("selective_rope", [0.1, 0.0])):
        model = demo.build_model(config, kind, seed=0)
        groups = demo.make_optimizer(model, config).param_groups
        assert [g["weight_decay"] for g in groups] == decays
        assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    model = demo.build_model(TINY, "selective_rope", seed=0)
    decayed = dataclasses.replace(TINY, weight_decay=0.1, position_weight_decay=True)
    assert [g["weight_decay"] for g in demo.make_optimizer(model, decayed).param_groups] == [0.1, 0.1]


def test_position_lr_scale_scales_only_the_encodings_steps():
    """Adam's first step moves every parameter by lr (sign of its gradient); with
    position_lr_scale s the encoding's parameters move by s·lr and the rest by lr."""
    config = dataclasses.replace(TINY, position_lr_scale=0.25, weight_decay=0.0, grad_clip=None, warmup_steps=0,
                                 cooldown_steps=0, curriculum=((8, 1),), ema_decay=None)
    model = demo.build_model(config, "selective_rope", seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trained, _ = demo.train_model("selective_rope", config, seed=0, device="cpu")
    moved = {name: (p.detach() - before[name]).abs().max().item() for name, p in trained.named_parameters()}
    position = [v for name, v in moved.items() if ".position." in name and v > 0]
    others = [v for name, v in moved.items() if ".position." not in name and v > 0]
    assert position and others
    # g / (|g| + ε) is just below 1 for the largest steps (Adam ε = 1e-6)
    assert max(position) == pytest.approx(0.25 * config.lr, rel=1e-2) and max(others) == pytest.approx(config.lr, rel=1e-2)
    with pytest.raises(ValueError, match="position_lr_scale must be a positive number"):
        dataclasses.replace(TINY, position_lr_scale=0.0).check()


def test_phase_noise_by_stage_sets_the_noise_per_stage(monkeypatch):
    """phase_noise_by_stage gives Selective RoPE its stage's noise at every step (what the
    encoding holds when its forward runs); None leaves the encoding's own."""
    from srope.modules.selective_rope import SelectiveRoPE

    seen = []
    original = SelectiveRoPE.phase_increments
    monkeypatch.setattr(SelectiveRoPE, "phase_increments", lambda self, *a, **k: (seen.append(self.phase_noise), original(self, *a, **k))[1])
    noise = tuple(0.05 * (stage + 1) for stage in range(len(TINY.curriculum)))
    config = dataclasses.replace(TINY, phase_noise_by_stage=noise)
    demo.train_model("selective_rope", config, seed=0, device="cpu")
    assert seen == [noise[config.stage_at(step)] for step in range(config.steps)] and len(set(seen)) == len(noise) > 1
    assert TINY.phase_noise_at(0) is None
    seen.clear()
    demo.train_model("selective_rope", TINY, seed=0, device="cpu")
    assert seen == [TINY.selective_rope["phase_noise"]] * TINY.steps
    for bad in ((-0.1,) * len(noise), (math.inf,) * len(noise), (math.nan,) * len(noise), noise[:-1], (True,) * len(noise)):
        with pytest.raises(ValueError, match="phase_noise_by_stage must be None or"):
            dataclasses.replace(TINY, phase_noise_by_stage=bad).check()


def test_trained_model_accuracy_by_hand():
    """The demo's score of a (briefly) trained model equals a by-hand count on a few sequences."""
    model, losses = demo.train_model("selective_rope", TINY, seed=0, device="cpu")
    assert losses.shape == (TINY.steps,) and np.isfinite(losses).all()
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2, size=(9, 21))
    inputs = np.concatenate([np.full((9, 1), BOS), bits], axis=1)
    with torch.no_grad():
        logits = model(torch.as_tensor(inputs)).logits[..., :4]
    preds = logits.argmax(-1).numpy()
    truth = [[BOS] + [int(v) for v in np.cumsum(row) % 2] for row in bits]
    by_hand = sum(all(int(p) == t for p, t in zip(row_p, row_t)) for row_p, row_t in zip(preds, truth)) / len(bits)
    scored = demo.score(demo.predict(model, inputs, 4, torch.device("cpu")), parity_targets(bits))
    assert scored["seq_acc"] == by_hand
    assert scored["token_acc"] == pytest.approx(np.mean(preds == np.array(truth)))


def test_shared_weights_start_equal():
    models = {kind: demo.build_model(TINY, kind, seed=4) for kind in demo.POSITIONS}
    states = {kind: model.state_dict() for kind, model in models.items()}
    own = [name for name in states["selective_rope"] if ".position." in name]
    assert own and not any(".position." in name for name in states["nope"])
    assert set(states["nope"]) == set(states["rope"]) == set(states["selective_rope"]) - set(own)
    for name, value in states["nope"].items():
        assert torch.equal(states["rope"][name], value) and torch.equal(states["selective_rope"][name], value), name
    other_seed = demo.build_model(TINY, "nope", seed=5).state_dict()
    assert not torch.equal(other_seed["model.embeddings.weight"], states["nope"]["model.embeddings.weight"])


def test_training_stream_is_shared_and_eval_rows_are_unseen():
    # Length 4 has only 16 distinct sequences, so the training stream must contain eval rows.
    config = dataclasses.replace(TINY, curriculum=((4, 6),), eval_len=4, eval_size=16)
    first = [(x.copy(), y.copy()) for _, x, y in demo.train_batches(config, seed=2)]
    again = [(x, y) for _, x, y in demo.train_batches(config, seed=2)]
    other = [x for _, x, _ in demo.train_batches(config, seed=3)]
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, again))
    assert not all(np.array_equal(a[0], b) for a, b in zip(first, other))
    for x, y in first:
        np.testing.assert_array_equal(y, parity_targets(x[:, 1:]))
    data = demo.eval_sets(config, seed=2)
    seen = {row.tobytes() for x, _ in first for row in x}
    kept = [row for name in ("train", "eval") for row in data[name][0]]
    assert data["dropped_seen_in_training"] > 0
    assert len(kept) + data["dropped_seen_in_training"] == 2 * 16
    assert not any(row.tobytes() in seen for row in kept)


def test_schedule_and_curriculum():
    config = dataclasses.replace(TINY, curriculum=((5, 3), (7, 2), (11, 5)), warmup_steps=2, cooldown_steps=4, lr=1e-2, min_lr_ratio=0.1)
    assert config.steps == 10 and config.train_len == 11
    assert [config.length_at(s) for s in range(10)] == [5, 5, 5, 7, 7, 11, 11, 11, 11, 11]
    expected = [5e-3, 1e-2, 1e-2, 1e-2, 1e-2, 1e-2] + [1e-2 * (1 - 0.9 * k / 4) for k in (1, 2, 3, 4)]
    np.testing.assert_allclose([config.lr_at(s) for s in range(10)], expected)
    assert config.lr_at(9) == pytest.approx(1e-3)  # the last step ends the cooldown at min_lr_ratio
    flat = dataclasses.replace(config, warmup_steps=0, cooldown_steps=0)
    assert [flat.lr_at(s) for s in range(10)] == [1e-2] * 10
    # a fresh 3-step warm-up at each later stage (steps 3 and 5 start stages), on top of the schedule
    rewarm = dataclasses.replace(config, switch_warmup_steps=3)
    factors = [1, 1, 1, 1 / 3, 2 / 3, 1 / 3, 2 / 3, 1, 1, 1]
    np.testing.assert_allclose([rewarm.lr_at(s) for s in range(10)], [f * e for f, e in zip(factors, expected)])
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="switch_warmup_steps must be an integer >= 0"):
            dataclasses.replace(config, switch_warmup_steps=bad).check()
    # per-stage factors multiply everything else (stages start at steps 0, 3 and 5)
    staged = dataclasses.replace(rewarm, lr_by_stage=(1.0, 0.5, 0.25))
    stage_factors = [1, 1, 1, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]
    np.testing.assert_allclose([staged.lr_at(s) for s in range(10)],
                               [g * f * e for g, f, e in zip(stage_factors, factors, expected)])
    staged.check()
    for bad in ((1.0, 0.5), (1.0, 0.0, 1.0), (1.0, -1.0, 1.0), (1.0, math.inf, 1.0), (1.0, math.nan, 1.0), (True, 1.0, 1.0)):
        with pytest.raises(ValueError, match="lr_by_stage must be None or 3 finite numbers > 0"):
            dataclasses.replace(config, lr_by_stage=bad).check()


def test_targets_and_table():
    def fake(train, evl):
        return {"seq_acc": {"train": train, "eval": evl}, "token_acc": {"train": 1.0, "eval": 1.0}, "parameters": 10, "final_loss": 0.5}

    results = {"train_len": 128, "eval_len": 512, "device": "cpu", "seed": 0, "seconds": 12.0, "cpu_seconds": 20.0,
               "results": {"nope": fake(0.0, 0.0), "rope": fake(0.1, 0.0), "selective_rope": fake(0.995, 0.95)}}
    assert demo.check_targets(results) == {"selective_rope_learns": True, "selective_rope_extrapolates": True, "nope_fails": True, "rope_fails": True}
    results["results"]["rope"] = fake(0.2, 0.0)
    results["results"]["selective_rope"] = fake(0.98, 0.95)
    assert demo.check_targets(results) == {"selective_rope_learns": False, "selective_rope_extrapolates": True, "nope_fails": True, "rope_fails": False}
    table = demo.format_table(results)
    assert "seq_acc@128" in table and "seq_acc@512" in table and "0.980" in table


@torch.no_grad()
def test_parity_angles_find_a_pair_set_to_the_exact_solution():
    """Set one pair's steps to π per "1" and 0 per "0" through its conv tap and bias (conv
    width 1: step = Θ·gate·(w·u + exp(b))); the diagnostic must find that pair, with ~0 error."""
    model = demo.build_model(demo.CPU, "selective_rope", seed=3)
    encoding = next(m for m in model.modules() if m.__class__.__name__ == "SelectiveRoPE")
    u, gate = encoding.generator_inputs(demo.encoding_input(model, encoding, [BOS, 0, 1]))
    pair, theta = 5, float(encoding.temperature(torch.float64)[0])
    (u0, u1), (_g0, g1) = u[0, 1:, pair].double(), gate[0, 1:, pair].double()
    # w·u0 + B = 0 and w·u1 + B = ±π/(Θ·g1) (a step of -π is as good as π), with B = exp(b) > 0
    tap = math.pi / theta / g1 / (u1 - u0)
    tap = tap if -tap * u0 > 0 else -tap
    bias = -tap * u0
    encoding.conv.weight[pair, 0, -1] = tap
    encoding.bias.view(-1)[pair] = torch.log(bias)
    angles = demo.parity_angles(model, eval_len=512)
    assert angles["pair"] == pair
    assert abs(angles["error_per_one"]) < 1e-5 and abs(angles["error_per_zero"]) < 1e-5
    assert abs(angles["step_per_one"]) == pytest.approx(math.pi, abs=1e-5)
    assert angles["drift_at_eval_len"] == pytest.approx(256 * (angles["error_per_one"] + angles["error_per_zero"]))
    assert demo.parity_angles(demo.build_model(demo.CPU, "nope", seed=3), 512) is None


def test_the_demo_builds_its_own_model_which_srope_models_does_not_call_gla_tiny():
    from srope.models import PRESETS

    assert demo.CPU.model["num_hidden_layers"] == 1 != PRESETS["gla-tiny"].config["num_hidden_layers"]
    assert "srope demo builds its own 1-layer GLA" in PRESETS["gla-tiny"].description


def test_parity_angles_of_a_trainable_model_warn_nothing():
    """The diagnostic reads angles without autograd (it printed a UserWarning about converting a
    tensor that requires grad to a float in every demo run)."""
    import warnings

    model = demo.build_model(demo.CPU, "selective_rope", seed=3)
    assert any(p.requires_grad for p in model.parameters())
    once = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once per process: an earlier test may have used it up
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert demo.parity_angles(model, eval_len=512) is not None
    finally:
        torch.set_warn_always(once)


def test_progress_bars_count_each_models_steps_and_label_the_loss(tmp_path, capsys):
    """One bar per model counting its own steps (the documented 700 of the CPU preset, not the
    three models' 2,100 together), with the number beside it named as the training loss."""
    config = dataclasses.replace(TINY, curriculum=((7, 10),), eval_len=14, warmup_steps=2, cooldown_steps=3)
    demo.run_demo(tmp_path / "out", seed=1, config=config, workers=1, progress=True)
    err = capsys.readouterr().err
    assert f"3 models of {config.steps} steps each" in err
    for label in ("NoPE", "RoPE", "Selective RoPE"):
        finished = [line for line in err.replace("\r", "\n").splitlines() if line.startswith(label) and f"{config.steps}/{config.steps}" in line]
        assert finished and "training loss" in finished[-1], err[-1000:]
    assert f"/{3 * config.steps}" not in err
    assert demo.CPU.steps == 700  # what docs/demo.md says the bar counts


def test_ema_averages_the_last_stage_and_leaves_training_alone(monkeypatch):
    """ema_decay d: training (the losses) is unchanged, and the returned weights are
    e ← d·e + (1-d)·w over the last stage's steps, e starting from the weights at its start."""
    snapshots = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        snapshots.append([p.detach().clone() for group in self.param_groups for p in group["params"]])
        return result

    plain, plain_losses = demo.train_model("selective_rope", dataclasses.replace(TINY, ema_decay=None), seed=3, device="cpu")
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    decay = 0.6
    averaged, losses = demo.train_model("selective_rope", dataclasses.replace(TINY, ema_decay=decay), seed=3, device="cpu")
    np.testing.assert_array_equal(losses, plain_losses)
    first = TINY.steps - TINY.curriculum[-1][1]  # the last stage's first step
    expected = [w.clone() for w in snapshots[first - 1]]
    for weights in snapshots[first:]:
        expected = [decay * e + (1 - decay) * w for e, w in zip(expected, weights)]
    order = {id(p): i for i, p in enumerate(p for group in demo.make_optimizer(averaged, TINY).param_groups for p in group["params"])}
    got = sorted(averaged.parameters(), key=lambda p: order[id(p)])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(averaged.parameters(), plain.parameters()))
    monkeypatch.setattr(torch.optim.AdamW, "step", original)
    partly, _ = demo.train_model("selective_rope", dataclasses.replace(TINY, ema_decay=decay, ema_position_only=True), seed=3, device="cpu")
    for (name, p), a, b in zip(partly.named_parameters(), averaged.parameters(), plain.parameters()):
        torch.testing.assert_close(p, a if ".position." in name else b, rtol=0, atol=0)
    for bad in (0.0, 1.0, -0.5, math.nan):
        with pytest.raises(ValueError, match="ema_decay must be None or in"):
            dataclasses.replace(TINY, ema_decay=bad).check()


def test_seeds_summary_matches_the_single_runs(tmp_path, capsys):
    """run_demo_seeds: one run_demo per seed in OUT/seed<N> (each equal to a run on its own),
    a summary whose counts are recomputed from those results, and the plot."""
    summary = demo.run_demo_seeds(tmp_path, seeds=[2, 0], config=TINY, progress=False)
    single = demo.run_demo(tmp_path / "alone", seed=2, config=TINY, progress=False)
    assert summary["seeds"] == [2, 0] and set(summary["per_seed"]) == {"2", "0"}
    for seed in (2, 0):
        saved = json.loads((tmp_path / f"seed{seed}" / "results.json").read_text())
        entry = summary["per_seed"][str(seed)]
        assert entry["seq_acc"] == {kind: saved["results"][kind]["seq_acc"] for kind in demo.POSITIONS}
        assert entry["meets_all"] == all(saved["targets"].values())
    assert summary["per_seed"]["2"]["seq_acc"] == {kind: single["results"][kind]["seq_acc"] for kind in demo.POSITIONS}
    assert summary["meets_all"] == sum(e["meets_all"] for e in summary["per_seed"].values())
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "seeds.png").stat().st_size > 0
    assert "of 2 seeds meet every target" in capsys.readouterr().out
    with pytest.raises(ValueError, match="non-empty and distinct"):
        demo.run_demo_seeds(tmp_path, seeds=[1, 1], config=TINY, progress=False)
    with pytest.raises(TypeError, match="seeds must be a sequence of integers"):
        demo.run_demo_seeds(tmp_path, seeds="0-4", config=TINY, progress=False)
    with pytest.raises(ValueError, match="seed must be in"):
        demo.run_demo_seeds(tmp_path, seeds=[0, -1], config=TINY, progress=False)


def test_every_seed_records_the_commit_the_command_began_with(tmp_path, monkeypatch):
    """The workers run the code imported when --seeds began: a commit made while they train
    (HEAD moved between seeds) is not what the later seeds' results or the summary name."""
    from srope.lab import provenance

    monkeypatch.setenv("SROPE_COMMIT", "a" * 40)
    original = demo.eval_sets

    def moving_head(*args, **kwargs):  # each seed starts by drawing its evaluation sets
        out = original(*args, **kwargs)
        monkeypatch.setenv("SROPE_COMMIT", "b" * 40)
        return out

    monkeypatch.setattr("srope.lab.demo.run.eval_sets", moving_head)  # where run_demo looks it up
    summary = demo.run_demo_seeds(tmp_path, seeds=[0, 1], config=TINY, progress=False)
    assert provenance.commit()[0] == "b" * 40
    assert summary["provenance"]["commit"] == "a" * 40 and summary["provenance"]["seeds"] == [0, 1]
    for seed in (0, 1):
        assert json.loads((tmp_path / f"seed{seed}" / "results.json").read_text())["provenance"]["commit"] == "a" * 40


def test_cli_seed_list():
    from srope.lab.cli import _seed_list, build_parser

    assert _seed_list("0-4") == [0, 1, 2, 3, 4] and _seed_list("0,3,7-9") == [0, 3, 7, 8, 9] and _seed_list("5") == [5]
    for bad in ("4-0", "a", "-1", "1,1", "0-2,2", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _seed_list(bad)
    parser = build_parser()
    assert parser.parse_args(["demo", "--seeds", "0-2"]).seeds == [0, 1, 2]
    assert parser.parse_args(["demo"]).seeds is None
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--seed", "1", "--seeds", "0-2"])


def test_cli_workers():
    from srope.lab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo"]).workers is None and parser.parse_args(["demo", "--workers", "1"]).workers == 1
    for bad in ("0", "4", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", "--workers", bad])


UNGUARDED_SCRIPT = """
import dataclasses
from srope.lab import demo
config = dataclasses.replace(demo.CPU, name="tiny", curriculum=((6, 2),), lr_by_stage=None, cooldown_steps=1, eval_len=12,
                             eval_size=4, eval_batch_size=4,
                             model={"hidden_size": 16, "num_hidden_layers": 1, "num_heads": 2, "expand_k": 0.5, "expand_v": 1.0})
demo.run_demo(OUT, config=config, workers=3, progress=False)
"""


def test_parallel_workers_from_a_script_without_a_main_guard_fail_clearly(tmp_path):
    """Worker processes import the main script again; without the guard the demo says so."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.replace("OUT", repr(str(tmp_path / "out"))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr and "workers=1" in done.stderr, done.stderr[-2000:]
