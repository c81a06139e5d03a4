"""The MQAR crossover of issue 72: Zoology's trainer against our ``train_run`` on the same draws.

Zoology's ``train.train`` (Zoology as vendored in the authors' release, configured by
``vs_authors.zoology_config``) and our ``train_run`` run from the same initial weights (our
``ZoologyLM`` loaded with the state dict of Zoology's model for the seed), on the same data
(Zoology's own arrays, made once by its ``prepare_data``: they do not depend on the training
seed, ``DataConfig.seed`` is 123) and with the same RNG state: the model is built after the
draws Zoology's ``train`` makes, and Zoology's DataLoaders draw a base seed from torch's CPU RNG
each time an iterator is made, which :class:`ZStream` reproduces. The per-step losses and the
per-epoch test accuracy of each variant are compared:

- ``zoo``: Zoology's pipeline;
- ``ours``: our ``release`` preset (the side-by-side protocol of ``vs_authors.PROTOCOL``);
- ``ours:key=val,key=val``: the same with preset overrides, e.g. ``ours:cuda_graph=off`` (eager
  on CUDA: the dropout masks are then Zoology's, both CUDA generators seeded alike) or
  ``ours:head_at_targets=on``.

    python experiments/mqar_crossover.py --release ../selective-rope --device cuda --train-examples 100000 \\
        --test-examples 3000 --seeds 0,1,2 --variants zoo ours:cuda_graph=off ours --out out/mqar_crossover

On the CPU (``--device cpu``) fla's kernels in Zoology's model are replaced by torch references
(``fused_recurrent_gla`` by fla's ``naive_recurrent_gla``, ``FusedRMSNormGated`` by
``rms_norm(x) * silu(g)``), so that Zoology runs without a GPU; fla 0.6.0 and einops must still
be importable (e.g. ``PYTHONPATH=DIR`` with them unpacked in DIR). Zoology needs ``pydantic``;
``torchvision`` (for ``StochasticDepth``, whose ``p`` is 0 here) and ``wandb`` are stood in for
where they are missing. The JSON (``OUT/mqar_crossover.json``, rewritten after every seed)
holds every run (variant, seed, per-step losses, evaluations, graph_steps, head_at_targets,
seconds) and the provenance. ``evals`` is ``[accuracy, test loss]`` per epoch for ``zoo`` and
``[accuracy, mean training loss of the epoch]`` for ours (as the first crossover script wrote).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VARIANT_KINDS = ("zoo", "ours")
WINDOW_ENDS = (50, 100, 150, 200, 250, 300, 350)  # the summary's 10-step loss means end here (and at the last step)


def _load_vs_authors():
    """experiments/vs_authors.py as a module, by path (as tests/experiments' ``experiment`` fixture loads it)."""
    spec = importlib.util.spec_from_file_location("vs_authors", HERE / "vs_authors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vs_authors = _load_vs_authors()


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``"ours:key=val,key=val"`` -> ``("ours", {key: val, ...})``; ``"zoo"`` -> ``("zoo", {})``."""
    kind, _, rest = text.partition(":")
    if kind not in VARIANT_KINDS:
        raise ValueError(f"a variant is 'zoo', 'ours' or 'ours:key=val,...', got {text!r}")
    overrides = {}
    for item in (part for part in rest.split(",") if part):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"variant {text!r}: overrides are key=val, got {item!r}")
        overrides[key] = value
    if kind == "zoo" and overrides:
        raise ValueError(f"variant {text!r}: Zoology's pipeline takes no overrides")
    return kind, overrides


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are a comma list of integers, got {text!r}") from None


def first_above(differences: np.ndarray, threshold: float) -> int | None:
    """The first step (1-based) whose difference exceeds ``threshold``, or None."""
    above = differences > threshold
    return int(np.argmax(above)) + 1 if above.any() else None


def summary_lines(rows: list[dict]) -> list[str]:
    """The per-seed summary of one seed's runs: each variant's first 4 losses and its 10-step means
    ending at steps 50..350 and at its last step; each variant against ``zoo`` (the largest
    |loss difference| over the first 4 and 50 steps, the first step where it exceeds 1e-3 and
    1e-2); and which pairs of variants have bitwise equal losses."""
    lines = []
    for r in rows:
        losses = np.array(r["losses"])
        ends = [s for s in (*WINDOW_ENDS, len(losses)) if s <= len(losses)]
        means = " ".join(f"@{s}:{losses[s - 10 : s].mean():.3f}" for s in ends)
        lines.append(f"  {r['variant']:40s} first {np.round(losses[:4], 5).tolist()}  {means}")
    base = next((r for r in rows if r["variant"] == "zoo"), None)
    for r in rows:
        if base is None or r is base:
            continue
        n = min(len(base["losses"]), len(r["losses"]))
        d = np.abs(np.array(base["losses"][:n]) - np.array(r["losses"][:n]))
        lines.append(f"  {r['variant']} vs zoo: max|dloss| first 4 {d[:4].max():.2e}, first 50 {d[:50].max():.2e}, "
                     f"first step >1e-3: {first_above(d, 1e-3)}, >1e-2: {first_above(d, 1e-2)}")  # fmt: skip
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            lines.append(f"  {a['variant']} and {b['variant']}: losses bitwise {'equal' if a['losses'] == b['losses'] else 'different'}")
    return lines


def stub_torchvision() -> None:
    """Zoology's ``model.py`` imports ``torchvision.ops.StochasticDepth``; its ``p`` is 0 here (the
    identity). An identity stands in where torchvision is not installed."""
    try:
        import torchvision.ops  # noqa: F401
    except ImportError:
        from torch import nn

        class StochasticDepth(nn.Module):
            def __init__(self, p: float, mode: str):
                super().__init__()
                if p != 0.0:
                    raise ValueError(f"the stand-in StochasticDepth is the identity, for p = 0 only (got {p})")

            def forward(self, x):
                return x

        ops = vs_authors.stand_in("torchvision.ops", StochasticDepth=StochasticDepth)
        sys.modules["torchvision"] = vs_authors.stand_in("torchvision", ops=ops)
        sys.modules["torchvision.ops"] = ops


def use_torch_kernels() -> None:
    """The CPU path: fla's kernels in Zoology's GLA layer replaced by torch references."""
    import torch.nn.functional as F

    try:
        import fla.layers.gla as fla_gla
        from fla.modules.norm.fused_norm_gate import FusedRMSNormGated
        from fla.ops.gla.naive import naive_recurrent_gla
    except ImportError as error:
        raise SystemExit(f"--device cpu needs fla 0.6.0 and einops importable (Zoology's GLA layer imports fla): {error}") from None

    def fused_recurrent_gla(q, k, v, gk, initial_state=None, output_final_state=False, state_v_first=False, cu_seqlens=None, scale=None):
        if scale is not None or cu_seqlens is not None:
            raise NotImplementedError("the CPU stand-in of fused_recurrent_gla takes no scale or cu_seqlens")
        return naive_recurrent_gla(q, k, v, gk, initial_state, output_final_state)

    def gated_norm(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps) * F.silu(g)

    fla_gla.fused_recurrent_gla = fused_recurrent_gla
    FusedRMSNormGated.forward = gated_norm


def zoology_to_ours(name: str) -> str:
    """A parameter name of Zoology's ``LanguageModel`` as our ``ZoologyLM`` names it."""
    name = name.replace("backbone.embeddings.word_embeddings", "model.embeddings").replace("backbone.", "model.")
    name = name.replace("sequence_mixer.mixer.conv.conv", "mixer.conv").replace("sequence_mixer.mixer.", "mixer.")
    return name.replace("g_norm_swish_gate.weight", "g_norm.norm.weight")


def load_zoology_state(model, state: dict) -> None:
    """Zoology's initial ``state`` into our ``model`` (the head is tied to the embedding in both)."""
    missing, unexpected = model.load_state_dict({zoology_to_ours(k): v for k, v in state.items()}, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise RuntimeError(f"Zoology's state does not map onto ours: missing {missing}, unexpected {unexpected}")
    if model.lm_head.weight is not model.model.embeddings.weight:
        raise RuntimeError("our head is not tied to the embedding")


def release_commit(release: Path) -> str:
    done = subprocess.run(["git", "-C", str(release), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    from srope.lab import provenance

    source = provenance.commit()  # the code this run began with
    device = torch.device(args.device)
    if device.type == "cpu":
        use_torch_kernels()
    if args.fused_adamw:  # fused AdamW on the CPU too (as the GPU's step uses it)
        import srope.lab.trainer as trainer_module
        from srope.lab.train import optim

        def fused_adamw(*a, fused=None, **k):
            return optim.adamw(*a, fused=True, **k)

        trainer_module.adamw = fused_adamw
    stub_torchvision()
    protocol = vs_authors.PROTOCOL["mqar"]

    def config(seed: int):
        cfg, _ = vs_authors.zoology_config(args.release, seed)
        cfg.data.train_configs[0].num_examples, cfg.data.test_configs[0].num_examples = args.train_examples, args.test_examples
        return cfg

    first = config(0)  # puts Zoology on the path
    changes = {"max_epochs": protocol["epochs"], "logger": "a recorder instead of wandb",
               "num_examples": f"train {args.train_examples}, test {args.test_examples}"}  # fmt: skip
    if sys.version_info < (3, 14):
        changes["annotations"] = vs_authors.annotations_for_zoology_gla()
    if device.type == "cpu":
        changes["cpu_kernels"] = "fla's fused_recurrent_gla -> naive_recurrent_gla, FusedRMSNormGated -> rms_norm(x) * silu(g)"
    import zoology.train as zoology_train
    from zoology.data.utils import prepare_data
    from zoology.model import LanguageModel

    from srope.lab.cli import srope_model_factory
    from srope.lab.tasks import mqar
    from srope.lab.tasks.common import IGNORE, ArrayStream, Prepared
    from srope.lab.tasks.runner import resolve_preset, train_run

    began = time.time()
    train_loader, test_loader = prepare_data(first.data)  # the data do not depend on the training seed (DataConfig.seed = 123)

    def arrays(loader):
        xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y, _ in loader])
        return np.concatenate(xs), np.concatenate(ys)

    zx, zy = arrays(train_loader)
    tx, ty = arrays(test_loader)
    print(f"data {zx.shape} {tx.shape} {time.time() - began:.0f}s", flush=True)
    zoology_train.prepare_data = lambda c: iter([train_loader, test_loader])

    class Recorder:  # Zoology's WandbLogger: the losses, the evaluations and the initial weights
        init, losses, evals = None, [], []

        def __init__(self, config=None):
            pass

        def log_config(self, config):
            pass

        def log_model(self, model, config):
            Recorder.init = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def log(self, metrics):
            if "train/loss" in metrics:
                Recorder.losses.append(float(metrics["train/loss"]))
            elif "valid/accuracy" in metrics:
                Recorder.evals.append([float(metrics["valid/accuracy"]), float(metrics["valid/loss"])])

        def finish(self):
            pass

    zoology_train.WandbLogger = Recorder

    class ZStream(ArrayStream):
        """Zoology's DataLoaders draw a base seed from torch's global (CPU) RNG whenever an iterator
        is made: the train loader's each epoch, after the test loader's of the epoch before."""

        def epoch(self, epoch, *a, **k):
            for _ in range(1 if epoch == 0 else 2):
                torch.empty((), dtype=torch.int64).random_()
            yield from super().epoch(epoch, *a, **k)

    def evaluate(predict):
        hits = total = 0
        for s in range(0, len(tx), 256):
            y = torch.as_tensor(ty[s : s + 256])
            pred = predict(torch.as_tensor(tx[s : s + 256]))
            scored = y != IGNORE
            hits += int((pred[scored] == y[scored]).sum())
            total += int(scored.sum())
        return {"score": hits / total, "accuracy": hits / total}

    out = {"protocol": protocol, "train_examples": args.train_examples, "test_examples": args.test_examples, "seeds": args.seeds,
           "variants": args.variants, "release": str(args.release), "release_commit": release_commit(args.release),
           "authors_changes": changes, "device": provenance.environment(device), "runs": []}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        cfg = config(seed)
        Recorder.losses, Recorder.evals = [], []
        if "zoo" in args.variants:
            began = time.time()
            zoology_train.train(cfg)
            zoo = {"variant": "zoo", "seed": seed, "losses": Recorder.losses, "evals": Recorder.evals, "seconds": time.time() - began}
            out["runs"].append(zoo)
            print(f"seed {seed} zoo: {zoo['seconds']:.0f}s evals {zoo['evals']}", flush=True)
        else:
            torch.manual_seed(seed)
            Recorder().log_model(LanguageModel(cfg.model.model_copy(deep=True)), None)
        init = Recorder.init
        for variant in args.variants:
            kind, extra = parse_variant(variant)
            if kind != "ours":
                continue
            overrides = {"configs": f"{protocol['seq_len']}x{protocol['kv_pairs']}", "d_models": str(protocol["d_model"]), "lrs": str(protocol["lr"]),
                         "seeds": str(seed), "epochs": protocol["epochs"], "loss_every": 1, "position_type": "nope",
                         "train_examples": args.train_examples, "test_examples": args.test_examples, **extra}  # fmt: skip
            ours_cfg = resolve_preset("mqar", "release", overrides)
            setting = mqar.settings(ours_cfg)[0]

            def factory(request, seed=seed, cfg=cfg, init=init):
                torch.manual_seed(seed)
                LanguageModel(cfg.model.model_copy(deep=True))  # the CPU RNG as Zoology's train() leaves it
                with torch.random.fork_rng(devices=[]):
                    model = srope_model_factory(request)
                load_zoology_state(model, init)
                return model

            began = time.time()
            prepared = Prepared(train=ZStream(zx, zy, cfg.data.batch_size, shuffle=False), evaluate=evaluate)
            record = train_run("mqar", ours_cfg, setting, prepared, factory, lr=protocol["lr"], weight_decay=cfg.weight_decay, seed=seed,
                               device=device, progress=False)  # fmt: skip
            r = {"variant": variant, "seed": seed, "losses": [loss for _, loss in record["loss_curve"]],
                 "evals": [[h["score"], h.get("train_loss")] for h in record["history"]], "graph_steps": record["graph_steps"],
                 "head_at_targets": record["head_at_targets"], "seconds": time.time() - began}  # fmt: skip
            out["runs"].append(r)
            print(f"seed {seed} {variant}: {r['seconds']:.0f}s graph_steps {r['graph_steps']} head_at_targets {r['head_at_targets']} "
                  f"evals {r['evals']}", flush=True)  # fmt: skip
        for line in summary_lines([r for r in out["runs"] if r["seed"] == seed]):
            print(line, flush=True)
        out["provenance"] = provenance.record(source=source, device=str(device), seeds=args.seeds)
        (args.out / "mqar_crossover.json").write_text(json.dumps(out, indent=1))
    return out["runs"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of timurcarstensen/selective-rope")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--train-examples", type=int, default=vs_authors.PROTOCOL["mqar"]["train_examples"])
    parser.add_argument("--test-examples", type=int, default=vs_authors.PROTOCOL["mqar"]["test_examples"])
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="a comma list (default 0,1,2)")
    parser.add_argument("--variants", nargs="+", default=["zoo", "ours"], help="zoo, ours, or ours:key=val,... (preset overrides)")
    parser.add_argument("--fused-adamw", action="store_true", help="force our fused AdamW (on the CPU too)")
    parser.add_argument("--out", type=Path, required=True, help="folder for mqar_crossover.json")
    args = parser.parse_args(argv)
    for variant in args.variants:
        try:
            parse_variant(variant)
        except ValueError as error:
            parser.error(str(error))
    return args


def main() -> None:
    args = parse_args()
    vs_authors.check_release(args.release, "zoology")
    run(args)


if __name__ == "__main__":
    main()
