"""The copying crossover of issue 72 (item 2): the release's copying step against ours, from the same weights and batches.

The release's ``copying.main.main(cfg)`` (synthetic_tasks/copying/src/copying/main.py at d12e825)
runs as released on the CPU, on the configuration ``vs_authors.authors_copying_config`` composes
from its Hydra files with the protocol's arm (Selective RoPE with the bias, no gate:
``vs_authors.PROTOCOL``): ``get_tokenizer`` and ``CopyDataset`` (:124-137; the letters and
``$ | . *`` are our token ids, data_utils.py:284-300), whose rows are drawn from NumPy's global
state when the loader asks for them (data_utils.py:134-200), after ``set_seed`` (:154); the
sequential sampler (:138-141, ``_get_sampler`` :25-45) and ``DataLoader`` (:142-150,
``num_workers`` 0); ``Accelerator()`` (:155); the model from its config (:179-181: the
release's ``GLAForCausalLM``, src/selective_rope/models/gla/modeling.py:316, initialised by its
``_init_weights`` :131-146); AdamW over every parameter (:188-194); the linear schedule with
10% warm-up over ``steps_budget`` (:195-196, ``_init_scheduler`` :81-95);
``accelerator.prepare`` (:198-200); then each step (:205-237): ``_move_to_device`` (inputs the
first 419 tokens, targets and loss mask the next, :67-78), the forward (``mix_precision`` off:
autocast disabled, :217-222), ``_masked_cross_entropy`` (the mean over masked positions,
:48-64), ``accelerator.backward`` (:229), ``clip_grad_norm_`` at 1.0 (:230-233),
``optimizer.step``, ``zero_grad`` and ``scheduler.step`` (:234-237). Its evaluation (:258-309)
is skipped: the run stops after the last scheduler step. Changed from the release's
configuration (recorded under ``release_changes``): ``steps_budget``, ``seed``, logging off,
``compile`` off, ``max_eval_len``, ``num_workers`` 0, ``mix_precision`` off (float32 on both
sides), the batch and, at ``--size small``, the model's width, depth and heads and the data's
context and lengths.

Hooks on the release's own functions record what it does: the model and its initial weights
(``AutoModelForCausalLM.from_config``), every batch (``_move_to_device``), every loss
(``_masked_cross_entropy``), the clipped gradients and their norm before clipping
(``Accelerator.clip_grad_norm_``), and the learning rate of each update and the parameters
after it (``scheduler.step``).

Ours is ``train_run`` of the copying ``release`` preset as it stands (its spectrum
``rfa-float32``, the release's float32 temperatures, src/selective_rope/modules/rotary.py:18-31,
:130-133), with ``position.bias=true``, the same steps and batch, and at ``--size small`` the
same small model (its MLP at fla's GatedMLP width, the release's, instead of our rounding below
width 512). Its model is loaded with the release model's initial weights (every release tensor
but the fixed temperatures maps onto exactly one of ours, with its shape: checked), and it
trains on the release's batches in the release's order (checked against the batches our trainer
got). The optimiser settings, schedule, steps, batch and data sizes of both sides are checked
equal, and the release's temperatures against our spectrum.

Per step the two losses, the learning rates and the largest relative difference
(``max|a - b| / max|a|`` over each tensor, the largest over tensors) of the parameters after
the update and of the clipped gradients are printed, then the first step where the losses
differ by > 1e-6 and > 1e-3. The two trajectories part by float32 rounding, which training
amplifies; what the two computations differ by at one point is checked apart: both models at
the release's weights before the first and the last step, on that step's batch (logits, loss
and every gradient before clipping, ``||a - b|| / ||a||``). Everything goes to
``OUT/copying_crossover.json``.

On the CPU fla's Triton kernels cannot run: the release's GLA kernels, norms, fused SwiGLU and
``l2_norm`` are replaced by ``st_crossover.release_cpu_kernels`` (torch references computing in
float32; restored after the run). The release's Selective RoPE runs its own PyTorch path
(``use_triton`` is False, rotary.py:82). Ours runs its CPU paths.

``--spectrum rfa``: our side with the exact rfa spectrum (the ``authors`` preset's) instead of
the preset's: the release's float32 rounding then makes its inner pairs 1.099 times ours, the
difference this crossover found. ``--phase64``: a diagnostic, the release's cumulative phase
(``torch.cumsum``, rotary.py:298, and so its angles and their cos/sin, :311-314) in float64, as
ours computes the phase and the angles: how much of the difference that rounding makes.

    PYTHONPATH=DIR python experiments/copying_crossover.py --release ../selective-rope --out out/copying_crossover
    PYTHONPATH=DIR python experiments/copying_crossover.py --release ../selective-rope --size release --batch-size 4 --steps 10 --out out/copying_crossover

``DIR`` holds fla 0.6.0, einops and omegaconf (the release imports them).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import tempfile
import time
import types
from pathlib import Path
from unittest import mock

import numpy as np

HERE = Path(__file__).resolve().parent
THRESHOLDS = (1e-6, 1e-3)
SPECTRA = ("rfa-float32", "rfa")  # ours: the release preset's, or the exact rfa of the authors/paper presets
# The sizes: the model (ours under model.*, the release's under model.*) and the data (ours ->
# the release's data.* keys), and the default batch and steps. ``release`` is both
# configurations as they stand (GLA d512, 16 heads, 4 layers; 420-token contexts of 2-64
# letters) at a batch the CPU affords.
SIZES = {
    "small": {"model": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4}, "data": {"context_len": 80, "min_len": 2, "max_len": 16},
              "batch_size": 8, "steps": 20},
    "release": {"model": {}, "data": {}, "batch_size": 4, "steps": 10},
}  # fmt: skip
RELEASE_DATA_KEYS = {"context_len": "data.sequence_length", "min_len": "data.min_length", "max_len": "data.max_length"}


def _load(name: str):
    """experiments/NAME.py as a module, by path."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


st_crossover = _load("st_crossover")  # the release's names, its CPU kernels, first_above
vs_authors = st_crossover.vs_authors


# ---------------------------------------------------------------- configurations


def release_config(args: argparse.Namespace):
    """The release's composed copying configuration with this run's changes; returns it and the changes."""
    protocol = vs_authors.PROTOCOL["copying"]
    cfg, changes = vs_authors.authors_copying_config(args.release, args.seed, args.steps, protocol["arm"], max_eval_len=3, workers=0)
    size = SIZES[args.size]
    more = {"trainer.mix_precision": False, "trainer.micro_batch_size": args.batch_size, "trainer.batch_size": args.batch_size,
            **{f"model.{key}": value for key, value in size["model"].items()},
            **{RELEASE_DATA_KEYS[key]: value for key, value in size["data"].items()}}  # fmt: skip
    vs_authors.apply_changes(cfg, more)
    return cfg, {**changes, **more}


def our_config(args: argparse.Namespace):
    """Our copying ``release`` preset with the protocol's arm and this run's steps, batch and size."""
    from srope.lab.tasks.runner import resolve_preset
    from srope.models.convert_fla import fla_mlp_size

    arm = vs_authors.PROTOCOL["copying"]["arm"]
    size = SIZES[args.size]
    overrides = {"steps": args.steps, "batch_size": args.batch_size, "seeds": str(args.seed), "loss_every": 1, "eval_lengths": "2-3",
                 "eval_examples": 8, "position.bias": arm["use_bias"], "position.gate": "standard" if arm["use_gate"] else "none",
                 **{f"model.{key}": value for key, value in size["model"].items()}, **size["data"]}  # fmt: skip
    if size["model"]:  # below width 512 our MLP rounds to 8; the release's (fla's GatedMLP) to 256
        overrides["model.intermediate_size"] = fla_mlp_size({"hidden_size": size["model"]["hidden_size"]})
    if args.spectrum is not None:
        overrides["position.spectrum"] = args.spectrum
    return overrides, resolve_preset("copying", "release", overrides)


def check_settings(release, ours) -> dict:
    """The training settings of both sides, ``{name: [release, ours]}``; exits if any differ."""
    t, d = release.trainer, release.data
    pairs = {
        "lr": [t.lr, ours.lrs[0]], "weight_decay": [t.weight_decay, ours.weight_decays[0]], "betas": [[t.beta1, t.beta2], list(ours.betas)],
        "eps": [t.op_eps, ours.eps], "gradient_clip": [t.gradient_clip, ours.grad_clip], "warmup": [t.warmup_steps, ours.warmup],
        "schedule": [t.scheduler, {"linear_warmup": "linear"}.get(ours.schedule, ours.schedule)], "steps": [t.steps_budget, ours.steps],
        "batch_size": [t.micro_batch_size, ours.batch_size], "context_len": [d.sequence_length, ours.context_len],
        "lengths": [[d.min_length, d.max_length], [ours.min_len, ours.max_len]], "alphabet": [d.vocab_size, ours.alphabet],
    }  # fmt: skip
    different = {name: pair for name, pair in pairs.items() if pair[0] != pair[1]}
    if different:
        raise SystemExit(f"the release's settings and our preset's differ: {different}")
    return pairs


def check_tokens(release_tokens: dict, alphabet: int) -> None:
    """Exits unless the release's token ids (``TO_TOKEN``, data_utils.py:284-300) are ours."""
    from srope.lab.tasks import copying

    ours = {**{chr(ord("a") + i): i for i in range(alphabet)}, **copying.SYMBOLS}
    if release_tokens != ours:
        raise SystemExit(f"the release's token ids {release_tokens} are not ours {ours}")


# ---------------------------------------------------------------- the release


class _TrainingDone(Exception):
    """Raised after the last scheduler step: the release's evaluation (main.py:258-309) is skipped."""


class _Float64Cumsum:
    """The release's rotary module's ``torch``, with ``cumsum`` in float64 (``--phase64``)."""

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    @staticmethod
    def cumsum(x, dim):
        import torch

        return torch.cumsum(x.double(), dim=dim)


@contextlib.contextmanager
def release_on_cpu(phase64: bool):
    """``st_crossover.release_cpu_kernels`` for the run's length (what it replaced is put back
    after), with ``--phase64``'s float64 phase; yields the description of the stand-ins."""
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.modules.mlp import SwiGLULinear

    import selective_rope.layers.gla as release_gla
    import selective_rope.modules.rotary as release_rotary

    replaced = ((release_gla, "chunk_gla"), (release_gla, "fused_recurrent_gla"), (RMSNorm, "forward"), (FusedRMSNormGated, "forward"),
                (ShortConvolution, "forward"), (SwiGLULinear, "forward"), (release_rotary, "l2_norm"))  # fmt: skip
    with contextlib.ExitStack() as stack:
        for owner, name in replaced:  # patched with itself: the exit restores it
            stack.enter_context(mock.patch.object(owner, name, getattr(owner, name)))
        kernels = st_crossover.release_cpu_kernels()
        if phase64:
            stack.enter_context(mock.patch.object(release_rotary, "torch", _Float64Cumsum()))
            kernels["phase64"] = "the release's torch.cumsum of the phase (rotary.py:298) in float64"
        yield kernels


def run_release(main, cfg, steps: int) -> dict:
    """``main.main(cfg)`` for ``steps`` steps, recorded by hooks on its own functions."""
    import accelerate
    from omegaconf import OmegaConf

    import selective_rope.modules.rotary as release_rotary

    side = {"batches": [], "losses": [], "lrs": [], "params": [], "grads": [], "grad_norms": []}
    build, move, loss_fn, clip, scheduler = (main.AutoModelForCausalLM.from_config, main._move_to_device, main._masked_cross_entropy,
                                             accelerate.Accelerator.clip_grad_norm_, main._init_scheduler)  # fmt: skip

    def from_config(config):  # main.py:179-181
        model = build(config)
        side["model"], side["init"] = model, {k: v.detach().clone() for k, v in model.named_parameters()}
        return model

    def move_to_device(batch, seq_len, device):  # main.py:214-216
        inputs, targets, masks = move(batch, seq_len, device)
        side["batches"].append((inputs.numpy().copy(), targets.numpy().copy(), masks.numpy().copy()))
        return inputs, targets, masks

    def masked_cross_entropy(*args, **kwargs):  # main.py:225-227
        loss = loss_fn(*args, **kwargs)
        side["losses"].append(float(loss.detach()))
        return loss

    def clip_grad_norm(self, parameters, max_norm, norm_type=2):  # main.py:230-233
        norm = clip(self, parameters, max_norm, norm_type)
        side["grad_norms"].append(float(norm))
        side["grads"].append({k: None if p.grad is None else p.grad.detach().clone() for k, p in side["model"].named_parameters()})
        return norm

    def init_scheduler(optimizer, cfg_, total):  # main.py:196; its step at :236-237, after the update
        real = scheduler(optimizer, cfg_, total)

        class Recording:
            def step(self):
                side["lrs"].append(optimizer.param_groups[0]["lr"])  # the rate of the update just made
                side["params"].append({k: v.detach().clone() for k, v in side["model"].named_parameters()})
                real.step()
                if len(side["params"]) == steps:
                    raise _TrainingDone

        return Recording()

    hooks = {"AutoModelForCausalLM": types.SimpleNamespace(from_config=from_config), "_move_to_device": move_to_device,
             "_masked_cross_entropy": masked_cross_entropy, "_init_scheduler": init_scheduler}  # fmt: skip
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        for name, hook in hooks.items():
            stack.enter_context(mock.patch.object(main, name, hook))
        stack.enter_context(mock.patch.object(accelerate.Accelerator, "clip_grad_norm_", clip_grad_norm))
        path = Path(folder) / "model_config.json"
        path.write_text(json.dumps(OmegaConf.to_container(cfg.model, resolve=True)))
        cfg.trainer.model_name_or_path = str(path)
        try:
            main.main(cfg)
        except _TrainingDone:
            pass
    if len(side["losses"]) != steps:
        raise RuntimeError(f"the release ran {len(side['losses'])} steps, not {steps}")
    side["temperatures"] = [m.temperature.detach().flatten().double() for m in side["model"].modules() if isinstance(m, release_rotary.SelectiveRoPE)]
    return side


# ---------------------------------------------------------------- names and weights


def release_state_to_ours(state: dict, model) -> dict:
    """The release's tensors (``state``, its parameter names) under our names and shapes, each
    checked to map onto exactly one of ``model``'s parameters, all of which get one; only the
    release's fixed temperatures are left out."""
    names = {name: st_crossover.release_to_ours(name) for name in state}
    left_out = sorted(name for name, ours in names.items() if ours is None)
    if any(not name.endswith(".rotary.temperature") for name in left_out):
        raise RuntimeError(f"release tensors without a place in our model: {left_out}")
    targets = [ours for ours in names.values() if ours is not None]
    if len(set(targets)) != len(targets):
        raise RuntimeError(f"two release tensors map onto one of ours: {sorted({t for t in targets if targets.count(t) > 1})}")
    own = dict(model.named_parameters())
    if set(targets) != set(own):
        raise RuntimeError(f"the mapping misses {sorted(set(own) - set(targets))} of ours and names {sorted(set(targets) - set(own))} we lack")

    def fits(name: str, ours: str) -> bool:  # the release's phi_bias is [1, 1, H, P], ours [H, P]
        shape = tuple(own[ours].shape)
        return tuple(state[name].shape) in (shape, (1, 1, *shape) if ours.endswith(".position.bias") else shape)

    bad = {name: (tuple(state[name].shape), tuple(own[ours].shape)) for name, ours in names.items() if ours is not None and not fits(name, ours)}
    if bad:
        raise RuntimeError(f"shapes differ (release, ours): {bad}")
    vocab = state["model.embeddings.weight"].shape[0]  # the same token ids on both sides: no permutation
    return st_crossover.release_state_to_ours(state, np.arange(vocab))


def load_release_state(model, state: dict):
    """``model`` with the release's ``state`` copied into its parameters."""
    import torch

    converted = release_state_to_ours(state, model)
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in converted.items():
            own[name].copy_(value)
    return model


def max_rel_diff(release: dict, ours: dict) -> tuple[float, str | None]:
    """The largest over tensors of ``max|a - b| / max|a|`` (release ``a``, ours ``b``), and its release name."""
    worst, where = 0.0, None
    for name, a in release.items():
        ours_name = st_crossover.release_to_ours(name)
        if ours_name is None or a is None:
            continue
        b = ours[ours_name]
        if b is None:
            return float("inf"), f"{name} (no gradient on ours)"
        d = float((a.reshape(b.shape).double() - b.double()).abs().max() / a.abs().max().double().clamp_min(1e-30))
        if d > worst:
            worst, where = d, name
    return worst, where


# ---------------------------------------------------------------- ours


def run_ours(cfg, release_side: dict, seed: int) -> dict:
    """``train_run`` of our preset from the release's initial weights on the release's batches."""
    import torch

    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import copying, training
    from srope.lab.tasks.common import IGNORE, ArrayStream, Prepared
    from srope.modules.selective_rope import SelectiveRoPE

    setting = copying.settings(cfg)[0]
    inputs = np.concatenate([x for x, _, _ in release_side["batches"]])
    targets = np.concatenate([np.where(m > 0, y, IGNORE) for _, y, m in release_side["batches"]])
    side = {"losses": [], "lrs": [], "params": [], "grads": [], "batches": []}
    after_step, batches = training.TaskTrainer.after_step, training.TaskTrainer.batches

    def wrap(model):
        side["model"] = load_release_state(model, release_side["init"])
        return side["model"]

    def recording_after_step(self, step, loss):
        side["losses"].append(float(loss))
        side["lrs"].append(self.lr_at(step))
        side["params"].append({k: v.detach().clone() for k, v in self.model.named_parameters()})
        side["grads"].append({k: None if v.grad is None else v.grad.detach().clone() for k, v in self.model.named_parameters()})
        return after_step(self, step, loss)

    def recording_batches(self):
        for step, x, y, *rest in batches(self):
            side["batches"].append((x.cpu().numpy().copy(), y.cpu().numpy().copy()))
            yield (step, x, y, *rest)

    prepared = Prepared(train=ArrayStream(inputs, targets, cfg.batch_size, shuffle=False), evaluate=lambda predict: {"score": 0.0}, wrap_model=wrap,
                        total_steps=cfg.steps)  # fmt: skip
    with mock.patch.object(training.TaskTrainer, "after_step", recording_after_step), mock.patch.object(training.TaskTrainer, "batches", recording_batches):
        side["record"] = training.train_run("copying", cfg, setting, prepared, srope_model_factory, lr=cfg.lrs[0], weight_decay=cfg.weight_decays[0],
                                            seed=seed, device=torch.device("cpu"), progress=False)  # fmt: skip
    side["same_batches"] = len(side["batches"]) == len(release_side["batches"]) and all(
        np.array_equal(x, rx) and np.array_equal(y, np.where(rm > 0, ry, IGNORE)) for (x, y), (rx, ry, rm) in zip(side["batches"], release_side["batches"]))
    side["temperatures"] = [m.temperature(torch.float32).double() for m in side["model"].modules() if isinstance(m, SelectiveRoPE)]
    return side


# ---------------------------------------------------------------- the comparison


def same_weights(main, release_side: dict, ours_side: dict, cfg, step: int) -> dict:
    """Both models at the release's weights before ``step`` (1-based) on that step's batch: the
    logits, the loss and every gradient (before clipping): what the two computations differ by at
    one point, without what the trajectories have parted by before it."""
    import torch

    from srope.lab.tasks import copying
    from srope.lab.tasks.common import IGNORE
    from srope.lab.tasks.training import task_loss

    weights = release_side["init"] if step == 1 else release_side["params"][step - 2]
    release_model, ours_model = release_side["model"], load_release_state(ours_side["model"], weights)
    with torch.no_grad():
        for name, p in release_model.named_parameters():
            p.copy_(weights[name])
    x, targets, mask = (torch.as_tensor(a) for a in release_side["batches"][step - 1])
    release_model.zero_grad(set_to_none=True)
    ours_model.zero_grad(set_to_none=True)
    a = release_model(x).logits
    release_loss = main._masked_cross_entropy(a, targets, mask, copying.PAD)  # main.py:223-227 (pad: TO_TOKEN["*"], checked ours)
    release_loss.backward()
    ours_loss = task_loss(ours_model, copying.settings(cfg)[0].vocab_size, torch.device("cpu"), cfg.precision)(x, torch.where(mask > 0, targets, IGNORE))
    ours_loss.backward()
    with torch.no_grad():
        b = ours_model(x).logits
    a, release_loss, ours_loss = a.detach(), float(release_loss.detach()), float(ours_loss.detach())
    own = dict(ours_model.named_parameters())
    grads = {name: st_crossover.rel_err(own[ours].grad.reshape(p.grad.shape), p.grad) for name, p in release_model.named_parameters()
             if (ours := st_crossover.release_to_ours(name)) is not None}  # fmt: skip
    worst = max(grads, key=grads.get)
    return {"step": step, "logits_max_abs": float((a - b).abs().max()), "max_logit": float(a.abs().max()), "logits_rel_err": st_crossover.rel_err(b, a),
            "loss_release": release_loss, "loss_ours": ours_loss, "grad_rel_err": grads[worst], "grad_worst": worst}  # fmt: skip


def compare(release_side: dict, ours_side: dict) -> list[dict]:
    rows = []
    for i in range(len(release_side["losses"])):
        dp, wp = max_rel_diff(release_side["params"][i], ours_side["params"][i])
        dg, wg = max_rel_diff(release_side["grads"][i], ours_side["grads"][i])
        rows.append({"step": i + 1, "lr_release": release_side["lrs"][i], "lr_ours": ours_side["lrs"][i], "loss_release": release_side["losses"][i],
                     "loss_ours": ours_side["losses"][i], "abs_diff": abs(release_side["losses"][i] - ours_side["losses"][i]),
                     "param_rel": dp, "param_where": wp, "grad_rel": dg, "grad_where": wg})  # fmt: skip
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'step':>4} {'lr release':>11} {'lr ours':>11} {'loss release':>13} {'loss ours':>13} {'|dloss|':>9} {'max rel dparam':>15}  "
          f"{'(tensor)':<40} {'max rel dgrad':>14}")  # fmt: skip
    for r in rows:
        print(f"{r['step']:>4} {r['lr_release']:11.3e} {r['lr_ours']:11.3e} {r['loss_release']:13.8f} {r['loss_ours']:13.8f} {r['abs_diff']:9.2e} "
              f"{r['param_rel']:15.2e}  {str(r['param_where']):<40} {r['grad_rel']:14.2e}", flush=True)  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    import torch

    from srope.lab import provenance

    source = provenance.commit()
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.time()
    release_cfg, changes = release_config(args)
    overrides, ours_cfg = our_config(args)
    settings = check_settings(release_cfg, ours_cfg)
    main_module = vs_authors.import_release_copying(args.release)
    check_tokens(main_module.get_tokenizer(release_cfg.data)[1], ours_cfg.alphabet)
    with release_on_cpu(args.phase64) as kernels:
        release_side = run_release(main_module, release_cfg, args.steps)
        ours_side = run_ours(ours_cfg, release_side, args.seed)
        checks = [same_weights(main_module, release_side, ours_side, ours_cfg, step) for step in sorted({1, args.steps})]
    if not ours_side["same_batches"]:
        raise RuntimeError("our trainer did not get the release's batches")
    if len(release_side["temperatures"]) != len(ours_side["temperatures"]) or not release_side["temperatures"]:
        raise RuntimeError("the two models do not have one Selective RoPE each per layer")
    temperature = max(float((a - b).abs().max()) for a, b in zip(release_side["temperatures"], ours_side["temperatures"]))
    rows = compare(release_side, ours_side)
    d = np.array([r["abs_diff"] for r in rows])
    first = {str(t): st_crossover.first_above(d, t) for t in THRESHOLDS}
    scored = float(np.mean([(m > 0).sum(1).mean() for _, _, m in release_side["batches"]]))
    parameters = {"release": sum(p.numel() for p in release_side["model"].parameters()), "ours": ours_side["record"]["parameters"]}
    print(f"{args.size}: {args.steps} steps of batch {args.batch_size}, context {release_cfg.data.sequence_length}; parameters release "
          f"{parameters['release']}, ours {parameters['ours']}; spectrum "
          f"{ours_cfg.position['selective_rope']['spectrum']}, max |temperature release - ours| {temperature:.2e}; phase64 {args.phase64}; "
          f"same batches {ours_side['same_batches']} ({scored:.1f} scored targets a row)", flush=True)  # fmt: skip
    print_rows(rows)
    print(f"max |dloss| {d.max():.2e}, max rel dparam {max(r['param_rel'] for r in rows):.2e}; first step |dloss| > 1e-6: {first['1e-06']}, "
          f"> 1e-3: {first['0.001']}", flush=True)  # fmt: skip
    for c in checks:
        print(f"at the release's weights before step {c['step']}, its batch: max |logits release - ours| {c['logits_max_abs']:.2e} (max |logit| "
              f"{c['max_logit']:.2e}, rel err {c['logits_rel_err']:.2e}), |dloss| {abs(c['loss_release'] - c['loss_ours']):.2e}, largest gradient "
              f"rel err {c['grad_rel_err']:.2e} ({c['grad_worst']})", flush=True)  # fmt: skip
    print(f"({time.time() - began:.0f}s)", flush=True)
    out = {"size": args.size, "steps": args.steps, "batch_size": args.batch_size, "seed": args.seed, "spectrum": ours_cfg.position["selective_rope"]["spectrum"],
           "phase64": args.phase64, "release": str(args.release), "release_commit": st_crossover.vs_authors_commit(args.release),
           "release_changes": changes, "ours_overrides": overrides, "settings": settings, "cpu_kernels": kernels,
           "parameters": parameters,
           "temperature_max_abs": temperature, "same_batches": ours_side["same_batches"], "scored_per_row": scored,
           "release_grad_norms": release_side["grad_norms"], "rows": rows, "max_abs_diff": float(d.max()), "first_above": first,
           "same_weights": checks, "seconds": time.time() - began,
           "provenance": provenance.record(source=source, device="cpu", seeds=[args.seed])}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "copying_crossover.json").write_text(json.dumps(out, indent=1))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of the authors' release (d12e825)")
    parser.add_argument("--size", choices=tuple(SIZES), default="small",
                        help="small: 2 layers of width 64, 4 heads, 80-token contexts of 2-16 letters (batch 8, 20 steps); "
                             "release: the released model and data (batch 4, 10 steps)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=None, help="both sides' batch (default: the size's)")
    parser.add_argument("--steps", type=int, default=None, help="both sides' steps_budget, run in full (default: the size's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spectrum", choices=SPECTRA, default=None, help="our temperature spectrum (default: the preset's, rfa-float32)")
    parser.add_argument("--phase64", action="store_true", help="diagnostic: the release's cumulative phase in float64")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--out", type=Path, required=True, help="folder for copying_crossover.json")
    args = parser.parse_args(argv)
    args.batch_size = SIZES[args.size]["batch_size"] if args.batch_size is None else args.batch_size
    args.steps = SIZES[args.size]["steps"] if args.steps is None else args.steps
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    vs_authors.check_release(args.release, "copying")
    run(args)


if __name__ == "__main__":
    main()
