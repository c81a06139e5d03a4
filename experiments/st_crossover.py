"""The state-tracking crossover of issue 72 (item 2): the release's S2 step against ours, from the same draws.

For a seed, the release's ``state_tracking.main.train(cfg)`` setup is built as it builds it
(synthetic_tasks/state_tracking/src/state_tracking/main.py at d12e825): ``set_seed`` (:345),
``Accelerator()`` (:347-348), ``get_dataset`` on our S2 data written as its CSV files (:355-381,
through ``vs_authors``), the model from its config (:427-434), ``model.to(torch.bfloat16)``
(:436; skipped with ``--precision float32``), AdamW over every parameter (:452-458), the
shuffled ``DataLoader`` (:463-472, ``num_workers`` 0), ``CosineAnnealingLR(T_max = epochs x
batches)`` (:485-487) and ``accelerator.prepare`` (:489-491). The first ``--steps`` batches of
its prepared loader (the release's order, drawn from its RNG) are kept. The release's step is
main.py:523-572 (zero_grad, forward, ``F.cross_entropy`` over every position since
``curriculum`` is off (:506, :547-553), ``accelerator.backward``, no clipping, ``step``,
``scheduler.step``); ``compute_metrics`` (:534-545) is left out: it changes nothing trained.

Ours is ``train_run`` of the ``release`` preset (``vs_authors.our_state_tracking``), with
``init=model`` so that the factory's weights stay: the factory builds our model and loads the
release model's initial weights into it (:func:`release_to_ours`; the token ids of the two
tokenizers differ in BOS and PAD, so the embedding and head rows are permuted with them, and
the batches are relabelled). Its stream yields the same batches, with 100 batches an epoch so
that both cosines are planned over the protocol's 300 steps, and a control stops it after
``--steps``.

Before training, one batch checks the mapping: the logits, the loss and every gradient of the
two models (the release's gradient per our parameter name), and, after one optimiser step of
each side, the parameters. Then both train for ``--steps`` steps; the per-step losses and the
first step where they differ by > 1e-6 and > 1e-3 are printed and written to ``OUT/st_crossover.json``.

On the CPU fla's Triton kernels cannot run. :func:`release_cpu_kernels` replaces them in the
release's model by torch references, each computing in float32 and returning the input's dtype
as the kernels do: ``chunk_gla`` / ``fused_recurrent_gla`` by fla's ``naive_recurrent_gla`` in chunks
(:func:`chunk_gla_reference`, checked against it),
``RMSNorm`` (with its residual), ``FusedRMSNormGated``, ``ShortConvolution``, the fused SwiGLU
linear and ``l2_norm``. The release's Selective RoPE runs its PyTorch path anyway
(``use_triton`` is False, src/selective_rope/modules/rotary.py:82, and selective_rope.yaml sets
none). ``--loss-float32`` (default on) computes the release's ``F.cross_entropy`` on float32
logits: on CUDA the release's loss runs under bf16 autocast (main.py:527-531), whose float32
list holds ``cross_entropy``; on the CPU the ``cuda`` autocast is off and the loss would be
taken in bf16.

    PYTHONPATH=DIR python experiments/st_crossover.py --release ../selective-rope --seeds 0 \\
        --arms nope selective_rope --precision float32 bf16 --steps 10 --out out/st_crossover
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ARMS = ("nope", "selective_rope")
PRECISIONS = ("float32", "bf16")
THRESHOLDS = (1e-6, 1e-3)


def _load_vs_authors():
    """experiments/vs_authors.py as a module, by path (as experiments/mqar_crossover.py loads it)."""
    spec = importlib.util.spec_from_file_location("vs_authors", HERE / "vs_authors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vs_authors = _load_vs_authors()


# ---------------------------------------------------------------- names and token ids

# The release's parameter names (src/selective_rope/models/gla/modeling.py, layers/gla.py,
# modules/rotary.py) as our SRopeForCausalLM names them.
_RENAMES = (
    (".attn_norm.", ".mixer_norm."),
    (".attn.q_conv1d.", ".mixer.convs.convs.0."),
    (".attn.k_conv1d.", ".mixer.convs.convs.1."),
    (".attn.v_conv1d.", ".mixer.convs.convs.2."),
    (".attn.g_norm_swish_gate.", ".mixer.g_norm.norm."),
    (".attn.rotary.phi_bias", ".mixer.position.bias"),
    (".attn.rotary.phi_proj.", ".mixer.position.proj."),
    (".attn.rotary.phi_conv1d.", ".mixer.position.conv."),
    (".attn.", ".mixer."),
)
# the release's temperature: a parameter with requires_grad False (rotary.py:130-133), all ones
# here (temp_type rope, temp_theta 1.0, temp_max 1.0); ours is the fixed "uniform" spectrum
RELEASE_ONLY = ("rotary.temperature",)


def release_to_ours(name: str) -> str | None:
    """A parameter name of the release's ``GLAForCausalLM`` as ours names it (None: no counterpart)."""
    if any(name.endswith(suffix) for suffix in RELEASE_ONLY):
        return None
    for old, new in _RENAMES:
        if old in name:
            return name.replace(old, new, 1)
    return name


def token_permutation(order: int, vocab: int) -> np.ndarray:
    """``perm[release id] = our id``: the elements keep theirs; the release's ``[PAD]`` (order)
    and ``[BOS]`` (order + 1) (main.py:88-97, :233-236) are our PAD (order + 1) and BOS (order);
    its other specials keep their ids among our unused entries."""
    perm = np.arange(vocab)
    perm[order], perm[order + 1] = order + 1, order
    return perm


def release_state_to_ours(state: dict, perm: np.ndarray) -> dict:
    """The release model's state dict in our names and shapes: ``phi_bias [1, 1, H, P]`` ->
    ``[H, P]``; the embedding's and the head's rows moved to our token ids."""
    import torch

    out = {}
    index = torch.as_tensor(np.argsort(perm))  # our id -> release id
    for name, value in state.items():
        ours = release_to_ours(name)
        if ours is None:
            continue
        if ours.endswith("position.bias"):
            value = value.reshape(value.shape[-2:])
        if ours in ("model.embeddings.weight", "lm_head.weight"):
            value = value.index_select(0, index)
        out[ours] = value
    return out


def first_above(differences, threshold: float) -> int | None:
    """The first step (1-based) whose difference exceeds ``threshold``, or None."""
    d = np.asarray(differences, dtype=np.float64)
    above = d > threshold
    return int(np.argmax(above)) + 1 if above.any() else None


def rel_err(a, b) -> float:
    """``||a - b|| / ||b||`` in float64 (fla's ``get_err_ratio``)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


# ---------------------------------------------------------------- the release on the CPU


def chunk_gla_reference(q, k, v, g, output_final_state: bool = False, chunk: int = 16):
    """GLA (fla's ``naive_recurrent_gla``: ``h_t = h_{t-1} * exp(g_t) + k_t v_t^T``,
    ``o_t = K^-0.5 q_t h_t``) in chunks of ``chunk`` steps, in float32 (float64 stays), the
    output in ``q``'s dtype; ``[B, T, H, K]`` inputs. The recurrence at the protocol's batch
    (1,024 x 129 steps x 12 heads) keeps ~26 GB for its backward; this keeps a chunk's."""
    import torch

    dtype = q.dtype
    q, k, v, g = (x.to(torch.promote_types(x.dtype, torch.float32)) for x in (q, k, v, g))
    B, T, H, K = q.shape
    scale = K**-0.5
    h = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for start in range(0, T, chunk):
        qc, kc, vc, gc = (x[:, start : start + chunk] for x in (q, k, v, g))
        G = gc.cumsum(1)  # inclusive: the decay up to and including each step of the chunk
        qg, kg = qc * G.exp() * scale, kc * (-G).exp()
        if not (torch.isfinite(qg).all() and torch.isfinite(kg).all()):
            raise FloatingPointError("the chunked GLA reference overflowed (decays too strong for its chunk)")
        A = torch.einsum("bthk,bshk->bhts", qg, kg).tril()
        out.append(torch.einsum("bhts,bshv->bthv", A, vc) + torch.einsum("bthk,bhkv->bthv", qg, h))
        last = G[:, -1]  # [B, H, K]
        h = h * last.exp()[..., None] + torch.einsum("bshk,bshv->bhkv", kc * (last[:, None] - G).exp(), vc)
    return torch.cat(out, 1).to(dtype), (h if output_final_state else None)


def release_cpu_kernels() -> dict:
    """Replace the fla Triton kernels the release's GLA model calls by torch references
    (float32 compute, the input's dtype out, as the kernels do); returns what was replaced."""
    import torch
    import torch.nn.functional as F
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.modules.mlp import SwiGLULinear
    from fla.ops.gla.naive import naive_recurrent_gla

    import selective_rope.layers.gla as release_gla
    import selective_rope.modules.rotary as release_rotary

    def gla(q, k, v, gk=None, g=None, initial_state=None, output_final_state=False, cu_seqlens=None, scale=None, **_):
        if cu_seqlens is not None or scale is not None or initial_state is not None:
            raise NotImplementedError("the CPU stand-in of fla's GLA takes no cu_seqlens, scale or initial state")
        return chunk_gla_reference(q, k, v, gk if gk is not None else g, output_final_state)

    # the chunked form is checked against fla's recurrence (float64) before it is used
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 37, 3, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    g = F.logsigmoid(torch.randn(2, 37, 3, 8, generator=gen, dtype=torch.float64)) / 16
    want, want_state = naive_recurrent_gla(q, k, v, g, None, True)
    got, got_state = chunk_gla_reference(q, k, v, g, True, chunk=16)
    if rel_err(got, want.to(got.dtype)) > 1e-5 or rel_err(got_state, want_state.to(got_state.dtype)) > 1e-5:
        raise RuntimeError("the chunked GLA reference does not match fla's naive_recurrent_gla")

    def rms_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        if residual is not None:
            x = x + residual
        y = F.rms_norm(x.float(), x.shape[-1:], None if self.weight is None else self.weight.float(), self.eps).to(x.dtype)
        return (y, x) if prenorm else y

    def gated_norm(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        y = F.rms_norm(x.float(), x.shape[-1:], self.weight.float(), self.eps) * F.silu(g.float())
        return y.to(x.dtype)

    def short_conv(self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None, **_):
        if cu_seqlens is not None or cache is not None or mask is not None or residual is not None:
            raise NotImplementedError("the CPU stand-in of ShortConvolution takes no cu_seqlens, cache, mask or residual")
        width = self.kernel_size[0]
        y = F.conv1d(F.pad(x.float().transpose(1, 2), (width - 1, 0)), self.weight.float(),
                     None if self.bias is None else self.bias.float(), groups=self.hidden_size).transpose(1, 2)
        if self.activation is not None:
            y = F.silu(y)
        return y.to(x.dtype), None

    def swiglu_linear(self, x, y, weight, bias):
        return F.linear((F.silu(x.float()) * y.float()).to(x.dtype), weight, bias)

    def l2_norm(x, eps=1e-6, output_dtype=None):
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(output_dtype or x.dtype)

    release_gla.chunk_gla = release_gla.fused_recurrent_gla = gla
    RMSNorm.forward, FusedRMSNormGated.forward, ShortConvolution.forward = rms_norm, gated_norm, short_conv
    SwiGLULinear.forward = swiglu_linear
    release_rotary.l2_norm = l2_norm
    return {
        "chunk_gla, fused_recurrent_gla": "chunk_gla_reference: fla's naive_recurrent_gla in chunks of 16 (float32, scale K^-0.5), checked against it in float64",
        "RMSNorm": "F.rms_norm in float32 (residual added first, prenorm returns it)",
        "FusedRMSNormGated": "F.rms_norm(x) * silu(g) in float32",
        "ShortConvolution": "causal depthwise F.conv1d in float32, then silu where set",
        "SwiGLULinear": "linear(silu(x) * y)",
        "l2_norm": "x / sqrt(sum x^2 + 1e-6) in float32",
    }


def build_release(release: Path, seed: int, arm: str, precision: str, data_dir: Path, steps: int, batch_size: int | None = None) -> dict:
    """The release's train(cfg) setup (main.py:345-491) on the CPU; its model, optimiser,
    scheduler, initial state and first ``steps`` batches."""
    import accelerate
    import torch
    from omegaconf import OmegaConf

    main = vs_authors.import_state_tracking_main(release)
    cfg, changes = vs_authors.authors_state_tracking_config(release, seed, data_dir, 0)
    if batch_size is not None:
        changes["trainer.batch_size"] = cfg.trainer.batch_size = batch_size
    if arm == "nope":
        cfg.model.position_embedding = {"type": "nope"}  # configs/state_tracking/model/position_embedding/nope.yaml
    main.set_seed(cfg.trainer.seed)  # main.py:345
    accelerator = accelerate.Accelerator()  # main.py:347-348 (logging off)

    def dataset(k):
        built, _ = vs_authors.release_get_dataset(main.get_dataset, main.PreTrainedTokenizerFast, group=cfg.data.group, k=k,
                                                  strict_len=cfg.data.strict_len, train_size=cfg.data.train_size, data_dir=Path(cfg.data.data_dir),
                                                  supervised=cfg.data.tagging, max_samples=cfg.data.max_samples)  # fmt: skip
        return built

    built = dataset(cfg.data.k)  # main.py:355-368
    train_set, n_vocab, tokenizer = built["dataset"], built["n_vocab"], built["tokenizer"]
    collate = main.partial(main.pad_collate, pad_token_id=tokenizer.pad_token_id)
    test_set = dataset(cfg.data.k_test)["dataset"]  # main.py:372-381
    with tempfile.TemporaryDirectory() as tmpdir:  # main.py:427-434
        cfg.model.vocab_size = n_vocab
        with open(os.path.join(tmpdir, "config.json"), "w") as f:
            json.dump(OmegaConf.to_container(cfg.model, resolve=True), f, indent=0)
        model = main.AutoModelForCausalLM.from_config(main.AutoConfig.from_pretrained(tmpdir + "/config.json"))
    if precision == "bf16":
        model.to(torch.bfloat16)  # main.py:436 (model.to("cuda"), :437, is the CPU here)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr, betas=(cfg.trainer.beta1, cfg.trainer.beta2), eps=cfg.trainer.op_eps,
                                  weight_decay=cfg.trainer.weight_decay)  # main.py:452-458  # fmt: skip
    loader = torch.utils.data.DataLoader(train_set, shuffle=True, batch_size=cfg.trainer.batch_size, num_workers=0, collate_fn=collate)  # :463-472
    eval_loader = torch.utils.data.DataLoader(test_set, shuffle=False, batch_size=cfg.trainer.batch_size, num_workers=0, collate_fn=collate)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.trainer.epochs * len(loader))  # main.py:485-487
    model, optimizer, loader, eval_loader = accelerator.prepare(model, optimizer, loader, eval_loader)  # main.py:489-491
    batches = []
    for batch in loader:  # the first epoch's order, as the release's loop draws it (main.py:520-522)
        batches.append((batch["input_ids"].clone(), batch["labels"].clone()))
        if len(batches) == steps:
            break
    curriculum_idx = min(2, cfg.data.k + 1) if cfg.data.curriculum else cfg.data.k + 1  # main.py:506
    return {"main": main, "cfg": cfg, "changes": changes, "model": model, "optimizer": optimizer, "scheduler": scheduler, "accelerator": accelerator,
            "init": init, "batches": batches, "n_vocab": n_vocab, "curriculum_idx": curriculum_idx, "t_max": scheduler.T_max,
            "order": len(tokenizer.get_vocab()) - len(main.SpecialTokens.values())}  # fmt: skip


def cuda_autocast_float32(counts: dict):
    """A torch function mode that gives the release's forward on the CPU what bf16 autocast on
    CUDA gives it (main.py:527-531) for the ops of its forward on CUDA's float32 list (torch's
    "autocast op reference": ``exp``, ``cumsum``, ``cross_entropy``, among others): their bf16
    inputs are cast to float32. On the CPU the ``cuda`` autocast is off, so without this the
    release's Selective RoPE would add ``exp(phi_bias)`` and take the cumulative phase in bf16
    (src/selective_rope/modules/rotary.py:240-241, :298), which it does not on the GPU. Counts
    the calls it cast in ``counts``. The matmul-list ops get bf16 weights and inputs already."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    ops = {torch.exp: "exp", torch.Tensor.exp: "exp", torch.cumsum: "cumsum", torch.Tensor.cumsum: "cumsum", F.cross_entropy: "cross_entropy",
           torch.log_softmax: "log_softmax", torch.Tensor.log_softmax: "log_softmax", F.log_softmax: "log_softmax", F.softplus: "softplus"}  # fmt: skip

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = ops.get(func)
            if name is not None and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in (*args, *kwargs.values())):
                counts[name] = counts.get(name, 0) + 1
                args, kwargs = tuple(up(a) for a in args), {k: up(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return Mode()


def release_loss(side: dict, source, target, loss_float32: bool):
    """main.py:533-553: the forward and the mean cross-entropy over positions ``:curriculum_idx``
    (with bf16 weights, under :func:`cuda_autocast_float32` unless ``side["autocast"]`` is off)."""
    import contextlib

    import torch.nn.functional as F

    mode = cuda_autocast_float32(side["autocast_counts"]) if side.get("autocast") else contextlib.nullcontext()
    with mode:
        output = side["model"](source)
        logits = output.logits[:, : side["curriculum_idx"], :].flatten(end_dim=-2)
        target = target[:, : side["curriculum_idx"]].flatten()
        return F.cross_entropy(logits.float() if loss_float32 else logits, target), output.logits


def release_step(side: dict, source, target, loss_float32: bool) -> float:
    """One step of main.py:523-572."""
    side["optimizer"].zero_grad()
    loss, _ = release_loss(side, source, target, loss_float32)
    side["accelerator"].backward(loss)
    side["optimizer"].step()  # gradient_clip is None (trainer.yaml:18): no clipping, :563-566
    side["scheduler"].step()  # use_scheduler true, :571-572
    return float(loss)


# ---------------------------------------------------------------- ours


def our_config(seed: int, arm: str, precision: str, batch_size: int | None = None):
    """Our ``release`` preset at the protocol (vs_authors.our_state_tracking), with ``arm``, our
    initialisation left to the factory (``init=model``) and ``precision``."""
    from srope.lab.tasks.runner import resolve_preset

    overrides, _ = vs_authors.our_state_tracking(seed)
    overrides = {**overrides, "position_type": arm, "init": "model", "precision": precision, "loss_every": 1, "cuda_graph": "off",
                 **({} if batch_size is None else {"batch_size": batch_size})}
    return overrides, resolve_preset("state_tracking", "release", overrides)


class BatchStream:
    """Given batches (our token ids) in order, ``steps_per_epoch`` planned per epoch."""

    replays_epoch_start = True

    def __init__(self, batches: list[tuple[np.ndarray, np.ndarray]], steps_per_epoch: int):
        self.batches, self.steps_per_epoch = batches, steps_per_epoch

    def epoch(self, epoch, rng, start: int = 0):
        if epoch:
            raise RuntimeError("the crossover stream holds the first epoch's batches only")
        yield from self.batches[start:]


class StopAfter:
    """A ``control`` that stops the run after ``steps`` steps."""

    def __init__(self, steps: int):
        self.steps, self.done = steps, 0

    def step_done(self) -> bool:
        self.done += 1
        return self.done >= self.steps

    def should_stop(self, *args, **kwargs) -> bool:
        return False


def build_ours(seed: int, arm: str, precision: str, state: dict, vocab: int):
    """Our model as ``train_run`` builds it (manual_seed, factory, ``numerics.store``), with ``state`` loaded."""
    import torch

    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import numerics, state_tracking
    from srope.lab.tasks.training import model_request

    _, cfg = our_config(seed, arm, precision)
    setting = state_tracking.settings(cfg)[0]
    if setting.vocab_size != vocab:
        raise RuntimeError(f"our vocabulary has {setting.vocab_size} entries, the release's {vocab}")

    def factory(request):
        model = srope_model_factory(request)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"the release's state does not map onto ours: missing {missing}, unexpected {unexpected}")
        return model

    torch.manual_seed(seed)
    model = factory(model_request("state_tracking", cfg, setting))
    numerics.initialise(model, cfg.init)
    return numerics.store(model, cfg.precision), cfg, setting, factory


def train_ours(seed: int, arm: str, precision: str, state: dict, vocab: int, batches, steps_per_epoch: int) -> list[float]:
    """``train_run`` of our preset on ``batches`` for ``len(batches)`` steps; the per-step losses."""
    import torch

    from srope.lab.tasks import training
    from srope.lab.tasks.common import Prepared

    _, cfg, setting, factory = build_ours(seed, arm, precision, state, vocab)
    losses = []
    after_step = training.TaskTrainer.after_step

    def recording(self, step, loss):
        losses.append(float(loss))
        return after_step(self, step, loss)

    training.TaskTrainer.after_step = recording
    try:
        prepared = Prepared(train=BatchStream(batches, steps_per_epoch), evaluate=lambda predict: {"score": 0.0})
        training.train_run("state_tracking", cfg, setting, prepared, factory, lr=cfg.lrs[0], weight_decay=cfg.weight_decays[0], seed=seed,
                           device=torch.device("cpu"), progress=False, control=StopAfter(len(batches)))  # fmt: skip
    finally:
        training.TaskTrainer.after_step = after_step
    return losses


# ---------------------------------------------------------------- the comparison


def init_statistics(seed: int, arm: str, release_state: dict) -> dict:
    """Our preset's own initialisation (``init=release``, srope.lab.tasks.numerics.initialise)
    beside the release model's (its ``_init_weights``, src/selective_rope/models/gla/modeling.py:131-146),
    per parameter: mean and standard deviation of each, in float32 before any bf16 cast. The
    crossover loads the release's values; this says whether our own draws come from the same law."""
    import torch

    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import numerics, state_tracking
    from srope.lab.tasks.training import model_request

    _, cfg = our_config(seed, arm, "float32")
    cfg.init = "release"
    setting = state_tracking.settings(cfg)[0]
    torch.manual_seed(seed)
    model = srope_model_factory(model_request("state_tracking", cfg, setting))
    numerics.initialise(model, cfg.init)
    ours = model.state_dict()
    out = {}
    for name, value in release_state.items():
        theirs = value.float()
        mine = ours[name].float()
        out[name] = {"release": [float(theirs.mean()), float(theirs.std()) if theirs.numel() > 1 else 0.0],
                     "ours": [float(mine.mean()), float(mine.std()) if mine.numel() > 1 else 0.0]}  # fmt: skip
    return out


def first_batch_check(side: dict, ours_model, cfg, vocab: int, perm: np.ndarray, loss_float32: bool) -> dict:
    """Logits, loss, gradients and one optimiser step of both models on the first batch."""
    import torch

    from srope.lab.tasks.training import task_loss
    from srope.lab.train.optim import adamw

    source, target = side["batches"][0]
    ours_x, ours_y = (torch.as_tensor(perm)[t] for t in (source, target))
    model = side["model"]
    model.zero_grad()
    r_loss, r_logits = release_loss(side, source, target, loss_float32)
    r_loss.backward()
    ours_model.zero_grad()
    o_logits = ours_model(ours_x).logits
    o_loss = task_loss(ours_model, vocab, torch.device("cpu"), cfg.precision)(ours_x, ours_y)
    o_loss.backward()
    index = torch.as_tensor(np.argsort(perm))
    out = {"loss_release": float(r_loss), "loss_ours": float(o_loss), "logits_rel_err": rel_err(o_logits.float(), r_logits.float().index_select(-1, index)),
           "logits_max_abs": float((o_logits.float() - r_logits.float().index_select(-1, index)).abs().max())}  # fmt: skip
    ours_params = dict(ours_model.named_parameters())
    grads = {}
    for name, p in model.named_parameters():
        ours_name = release_to_ours(name)
        if ours_name is None or p.grad is None:
            continue
        g = p.grad.reshape(ours_params[ours_name].shape) if ours_name.endswith("position.bias") else p.grad
        if ours_name in ("model.embeddings.weight", "lm_head.weight"):
            g = g.index_select(0, index)
        grads[ours_name] = rel_err(ours_params[ours_name].grad.float(), g.float())
    out["grad_rel_err"] = grads
    # one AdamW step on each side from these gradients (ours: srope.lab.train.optim.adamw as our Trainer makes it)
    opt = adamw([p for p in ours_model.parameters() if p.requires_grad], lr=cfg.lrs[0], betas=tuple(cfg.betas), eps=cfg.eps,
                weight_decay=cfg.weight_decays[0])  # fmt: skip
    ref = torch.optim.AdamW([p for p in model.parameters()], lr=side["cfg"].trainer.lr, betas=(side["cfg"].trainer.beta1, side["cfg"].trainer.beta2),
                            eps=side["cfg"].trainer.op_eps, weight_decay=side["cfg"].trainer.weight_decay)  # fmt: skip
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ours_before = {k: v.detach().clone() for k, v in ours_model.state_dict().items()}
    opt.step()
    ref.step()
    mapped = release_state_to_ours({k: v.detach() for k, v in model.state_dict().items()}, perm)
    mapped_before = release_state_to_ours(before, perm)
    out["update_rel_err"] = {k: rel_err((ours_model.state_dict()[k] - ours_before[k]).float(), (mapped[k] - mapped_before[k]).float())
                             for k in mapped if (mapped[k] - mapped_before[k]).abs().max() > 0}  # fmt: skip
    out["optimizer"] = {"ours": {k: v for k, v in opt.defaults.items() if k in ("fused", "foreach", "eps", "betas", "weight_decay", "lr")},
                        "release": {k: v for k, v in ref.defaults.items() if k in ("fused", "foreach", "eps", "betas", "weight_decay", "lr")}}  # fmt: skip
    model.load_state_dict(before)  # both back to the initial weights
    ours_model.load_state_dict(ours_before)
    model.zero_grad()
    return out


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    from srope.lab import provenance
    from srope.lab.tasks import state_tracking

    source = provenance.commit()
    torch.set_num_threads(args.threads) if args.threads else None
    folder = Path(tempfile.mkdtemp(prefix="st-crossover-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(folder / "hf-datasets"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    (folder / "data").mkdir()
    _, ours_cfg = vs_authors.our_state_tracking(args.seeds[0])
    data = state_tracking.datasets(ours_cfg, None)
    for split, length in (("train", ours_cfg.train_len), ("eval", ours_cfg.eval_len)):
        vs_authors.write_release_csv(folder / "data" / f"{ours_cfg.group}={length}.csv", data[f"{split}_inputs"], data[f"{split}_targets"],
                                     ours_cfg.data_seed)  # fmt: skip
    kernels = None
    out = {"steps": args.steps, "batch_size": args.batch_size, "seeds": args.seeds, "arms": args.arms, "precisions": args.precision, "loss_float32": args.loss_float32,
           "release": str(args.release), "release_commit": vs_authors_commit(args.release), "runs": []}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    for seed in args.seeds:
        for arm in args.arms:
            for precision in args.precision:
                began = time.time()
                os.chdir(folder)
                try:
                    side = build_release(args.release, seed, arm, precision, folder / "data", args.steps, args.batch_size)
                finally:
                    os.chdir(here)
                if kernels is None:
                    kernels = out["cpu_kernels"] = release_cpu_kernels()
                side["autocast"], side["autocast_counts"] = precision == "bf16" and args.cuda_autocast, {}
                perm = token_permutation(side["order"], side["n_vocab"])
                state = release_state_to_ours(side["init"], perm)
                ours_model, cfg, _, _ = build_ours(seed, arm, precision, state, side["n_vocab"])
                init_stats = init_statistics(seed, arm, state)
                check = first_batch_check(side, ours_model, cfg, side["n_vocab"], perm, args.loss_float32)
                print(f"seed {seed} {arm} {precision}: first batch loss release {check['loss_release']:.7f} ours {check['loss_ours']:.7f} "
                      f"logits rel err {check['logits_rel_err']:.2e}, max grad rel err {max(check['grad_rel_err'].values()):.2e}, "
                      f"max update rel err {max(check['update_rel_err'].values()):.2e}", flush=True)  # fmt: skip
                ours_batches = [(perm[x.numpy()], perm[y.numpy()]) for x, y in side["batches"]]
                release_losses = [release_step(side, x, y, args.loss_float32) for x, y in side["batches"]]
                ours_losses = train_ours(seed, arm, precision, state, side["n_vocab"], ours_batches, side["t_max"] // side["cfg"].trainer.epochs)
                d = np.abs(np.array(release_losses) - np.array(ours_losses))
                r = {"seed": seed, "arm": arm, "precision": precision, "release_losses": release_losses, "ours_losses": ours_losses,
                     "abs_diff": d.tolist(), "first_above": {str(t): first_above(d, t) for t in THRESHOLDS}, "first_batch": check, "init_stats": init_stats,
                     "t_max": side["t_max"], "cuda_autocast": side["autocast"], "autocast_casts": side["autocast_counts"], "release_lr_after": side["scheduler"].get_last_lr()[0], "seconds": time.time() - began}  # fmt: skip
                out["runs"].append(r)
                for i, (a, b) in enumerate(zip(release_losses, ours_losses)):
                    print(f"  step {i + 1:3d}  release {a:.7f}  ours {b:.7f}  |d| {abs(a - b):.2e}", flush=True)
                print(f"  first step |d| > 1e-6: {r['first_above']['1e-06']}, > 1e-3: {r['first_above']['0.001']}  ({r['seconds']:.0f}s)", flush=True)
                out["release_changes"] = side["changes"]
                out["provenance"] = provenance.record(source=source, device="cpu", seeds=args.seeds)
                (args.out / "st_crossover.json").write_text(json.dumps(out, indent=1))
    return out["runs"]


def vs_authors_commit(release: Path) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(release), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of the authors' release (d12e825)")
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",") if v.strip()], default=[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                        help="float32: neither side casts to bf16; bf16: both (the release's main.py:436, our preset's precision=bf16)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--loss-float32", action=argparse.BooleanOptionalAction, default=True,
                        help="the release's cross-entropy on float32 logits, as CUDA autocast computes it (default on)")
    parser.add_argument("--cuda-autocast", action=argparse.BooleanOptionalAction, default=True,
                        help="with bf16: the release's forward gets CUDA autocast's float32 ops (exp, cumsum, cross_entropy) as on the GPU (default on)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="both sides' batch (default: the protocol's 1,024; the cosine is then planned over epochs x batches of it)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    vs_authors.check_release(args.release, "state_tracking")
    run(args)


if __name__ == "__main__":
    main()
