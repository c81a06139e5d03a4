"""The GPU checks of whole models and of srope train's step, for every host x position encoding:

* ``models``: the model on CUDA against the same model on the CPU in float32 (a 2-layer model
  at the 370M layer geometry: GLA hidden 1024 x 4 heads, GDN 8 heads of 128, FoX/attention
  16 heads of 64; relative RMS errors as fla's get_err_ratio): forward logits and all
  parameters' gradients together, float32 (fla's kernels use TF32: about 5e-3 is expected)
  and under bf16 autocast, with the three parameters of largest error (under bf16 mostly the
  first token's, through GLA's output norm: docs/kernels.md, "Mixers"); a packed batch
  (``cu_seqlens``, 3 documents, one of a single token) against the documents one by one;
  prefill + cached token-by-token decoding against the full forward. The bf16 errors are
  bounded by the larger of 3e-2 and twice the error of the CPU's own bf16 autocast run
  (``cpu_bf16_*``) against the same float32 reference: bf16 rounding alone exceeds 3e-2
  in the gradients of some models;
* the graph step equals the eager step (``cuda_graph=off``): losses and final weights of a
  few steps of ``train()`` on the same data;
* a graph-mode run stopped after step 3 and resumed (warm-ups, capture and replays again)
  equals the uninterrupted graph-mode run (bitwise); ``graph_passed`` sums these up;
* the eager forward + backward of a fixed-shape batch does not synchronise with the host
  (``torch.cuda.set_sync_debug_mode("error")``), nor does a one-token decode step;
* ``generate`` with decoding replayed from CUDA graphs equals eager ``generate`` on a
  left-padded batch.

* srope.ops.loss's fused cross-entropy against float64.

    python benchmarks/check_cuda.py --data STORE --out out/bench/check_cuda.json [--only models,graph_vs_eager,...]

The op-level checks (the rotation kernels, the mixers, the decode kernel) are GPU tests:
``pytest -m "gpu or kernels" tests`` on the GPU machine (``benchmarks/run.sh gpu-tests``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from common import environment, position_configs, write_json
from safetensors.torch import load_file

from srope.models import SRopeConfig, SRopeForCausalLM, preset_config
from srope.registry import positions
from srope.models.cache import CACHE_FIELD
from srope.lab.train.train_config import TrainConfig
from srope.lab.train.trainer import train

MIXERS = {"gla": "gla-tiny", "gated_deltanet": "gdn-tiny", "forgetting_attn": "fox-tiny", "attention": "transformer-tiny"}
POSITIONS = tuple(positions)
SIZE = {"hidden_size": 256, "num_heads": 2}


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


TOL_GRAPH = 1e-4  # the captured step launches the eager step's kernels: only reduction order may differ


def graph_vs_eager(data: str, mixer: str, position: str, steps: int) -> dict:
    """``steps`` (at least 6) of eager and captured training; the resumed run stops after step 3,
    so that its second half warms up, captures and replays again."""
    if steps < 6:
        raise ValueError(f"graph_vs_eager needs at least 6 steps (two warm-ups and replays on both sides of a resume), got {steps}")
    base = dict(preset=MIXERS[mixer], position=position, data=data, max_steps=steps, seq_len=256, global_batch_size=8,
                eval_rows=8, tensorboard=False, checkpoint_every=1000, model=dict(SIZE))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train(TrainConfig(**base, cuda_graph="off"), root / "eager")
        train(TrainConfig(**base, cuda_graph="on"), root / "graph")
        train(TrainConfig(**base, cuda_graph="on"), root / "split", stop_after=3)
        train(TrainConfig(**base, cuda_graph="on"), root / "split", resume=True)
        eager, graph, split = (_losses(root / name) for name in ("eager", "graph", "split"))
        weights = {name: load_file(root / name / "model" / "model.safetensors") for name in ("eager", "graph", "split")}
    record = {
        "loss_eager": eager,
        "loss_graph": graph,
        "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(graph, eager)),
        "worst_weight_rel_diff": max(_rel(weights["graph"][k], weights["eager"][k]) for k in weights["eager"]),
        "resume_bitwise": split == graph and all(torch.equal(weights["split"][k], weights["graph"][k]) for k in weights["graph"]),
    }
    record["graph_passed"] = (len(graph) == len(eager) == steps and record["max_loss_rel_diff"] <= TOL_GRAPH
                              and record["worst_weight_rel_diff"] <= TOL_GRAPH and record["resume_bitwise"])  # fmt: skip
    return record


def no_host_sync(mixer: str, position: str) -> dict:
    """Forward + backward, then a prefill and one decode step, under sync-debug 'error'."""
    torch.manual_seed(0)
    model = SRopeForCausalLM(preset_config(MIXERS[mixer], position=position, vocab_size=1000, **SIZE)).cuda()
    ids = torch.randint(0, 1000, (4, 256), device="cuda")
    record = {}
    for name in ("train", "decode"):
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if name == "train":
                    model(ids, labels=ids).loss.backward()
                else:
                    with torch.no_grad():
                        out = model(ids[:, :255], use_cache=True)
                        model(ids[:, 255:], cache=getattr(out, CACHE_FIELD), use_cache=True)

        step()  # warm-up: autotuning and lazy initialisation may synchronise once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            record[f"{name}_sync_free"] = True
        except RuntimeError as error:
            record[f"{name}_sync_free"] = False
            record[f"{name}_sync"] = "".join(traceback.format_exception(error))[-1500:]
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
    return record


def graphed_generate(mixer: str, position: str) -> dict:
    """generate with decoding replayed from CUDA graphs equals eager generate: a left-padded
    batch of 3, greedy, float32 and bf16 autocast (recurrent hosts only; others run eagerly)."""
    torch.manual_seed(0)
    model = SRopeForCausalLM(preset_config(MIXERS[mixer], position=position, vocab_size=1000, **SIZE)).cuda().eval()
    ids = torch.randint(3, 1000, (3, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :7], mask[2, :19] = 0, 0  # left padding
    record = {}
    for dtype in (None, torch.bfloat16):
        runs = {}
        for graphs in (False, True):
            model.decode_graphs = graphs
            with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None,
                                     output_scores=True, return_dict_in_generate=True)  # fmt: skip
            runs[graphs] = (out.sequences, torch.stack(out.scores, 1).float())
        name = "float32" if dtype is None else "bf16"
        record[f"{name}_graphs_used"] = len(model._decode_graphs.graphs) > 0
        record[f"{name}_tokens_equal"] = bool(torch.equal(runs[True][0], runs[False][0]))
        record[f"{name}_logits_rel_diff"] = _rel(runs[True][1], runs[False][1])
        model._decode_graphs.graphs.clear()
    return record


GEOMETRY = {
    "gla": dict(hidden_size=1024, num_heads=4, use_short_conv=True),
    "gated_deltanet": dict(hidden_size=1024, num_heads=8, head_dim=128),
    "forgetting_attn": dict(hidden_size=1024, num_heads=16),
    "attention": dict(hidden_size=1024, num_heads=16),
}
MODEL_POSITIONS = position_configs(rope={"theta": 500000.0}, selective_rope={"bias": True})
TOL_FP32, TOL_BF16 = 5e-3, 3e-2  # relative RMS errors against the CPU
BF16_VS_CPU = 2.0  # the GPU's bf16 error may be this many times the CPU's own bf16 error


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if torch.isnan(a).any():
        return float("nan")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def forward_backward(model, ids, autocast=None):
    model.zero_grad(set_to_none=True)
    with autocast or torch.autocast("cpu", enabled=False):
        logits = model(ids, use_cache=False).logits
    logits.float().square().mean().backward()
    return logits, grads(model)


def models(mixer: str, position: str) -> dict:
    """The model on CUDA against the CPU in float32 (see the module's docstring)."""
    device, geometry, position = torch.device("cuda"), GEOMETRY[mixer], MODEL_POSITIONS[position]
    config = SRopeConfig(mixer=mixer, position=position, vocab_size=512, num_hidden_layers=2, initializer_range=0.05, **geometry)
    torch.manual_seed(0)
    cpu_model = SRopeForCausalLM(config).float()
    with torch.no_grad():  # trained-like position-encoding weights
        for name, param in cpu_model.named_parameters():
            if ".position." in name:
                param.add_(0.3 * torch.randn_like(param))
    gpu_model = copy.deepcopy(cpu_model).to(device)
    length = 300
    ids = torch.randint(0, 512, (2, length))
    out = {}
    ref_logits, ref_grads = forward_backward(cpu_model, ids)
    runs = [("fp32", None)] + ([("bf16", torch.autocast("cuda", dtype=torch.bfloat16))] if device.type == "cuda" else [])
    for label, autocast in runs:
        logits, got = forward_backward(gpu_model, ids.to(device), autocast)
        out[f"{label}_logits"] = err(logits, ref_logits)
        out[f"{label}_grads"] = err(torch.cat([got[n].flatten() for n in ref_grads]), torch.cat([ref_grads[n].flatten() for n in ref_grads]))
        per_param = sorted(((err(got[n], ref_grads[n]), n) for n in ref_grads), reverse=True)
        out[f"{label}_worst_params"] = [[name, e] for e, name in per_param[:3]]
    with torch.no_grad():
        bounds = [0, length // 3, length // 3 + 1, length]  # includes a one-token document
        packed = gpu_model(ids[:1].to(device), cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=device), use_cache=False).logits
        alone = torch.cat([gpu_model(ids[:1, s:e].to(device), use_cache=False).logits for s, e in zip(bounds[:-1], bounds[1:])], 1)
        out["packed_vs_separate"] = err(packed, alone)
        full = gpu_model(ids.to(device), use_cache=False).logits
        step = gpu_model(ids[:, : length - 8].to(device), use_cache=True)
        cache, parts = getattr(step, CACHE_FIELD), [step.logits]
        for t in range(length - 8, length):
            step = gpu_model(ids[:, t : t + 1].to(device), cache=cache, use_cache=True)
            cache = getattr(step, CACHE_FIELD)
            parts.append(step.logits)
        out["decode_vs_full"] = err(torch.cat(parts, 1), full)
    # bf16's own rounding: the CPU's PyTorch paths under bf16 autocast against the same float32
    # reference; the GPU's bf16 may be up to twice as far off (its kernels round elsewhere)
    cpu_logits, cpu_grads = forward_backward(cpu_model, ids, torch.autocast("cpu", dtype=torch.bfloat16))
    out["cpu_bf16_logits"] = err(cpu_logits, ref_logits)
    out["cpu_bf16_grads"] = err(torch.cat([cpu_grads[n].flatten() for n in ref_grads]), torch.cat([ref_grads[n].flatten() for n in ref_grads]))
    bf16_logits = max(TOL_BF16, BF16_VS_CPU * out["cpu_bf16_logits"])
    bf16_grads = max(TOL_BF16, BF16_VS_CPU * out["cpu_bf16_grads"])
    limits = {"fp32_logits": TOL_FP32, "fp32_grads": TOL_FP32, "bf16_logits": bf16_logits, "bf16_grads": bf16_grads, "packed_vs_separate": TOL_FP32,
              "decode_vs_full": TOL_FP32}  # fmt: skip
    out["bounds"] = limits
    out["models_passed"] = all(out[k] <= v for k, v in limits.items() if k in out)  # NaN fails
    return out


def fused_loss() -> dict:
    """The CUDA route of srope.ops.loss (fla's fused cross-entropy) against the float64
    reference: the summed loss and the hidden-state and head gradients, float32 and bf16."""
    from srope.ops.loss import summed_cross_entropy

    torch.manual_seed(0)
    record = {}
    for dtype in (torch.float32, torch.bfloat16):
        hidden = torch.randn(4, 1000, 256, device="cuda", dtype=dtype).requires_grad_()
        weight = (0.05 * torch.randn(32000, 256, device="cuda")).requires_grad_()
        targets = torch.randint(0, 32000, (4, 1000), device="cuda")
        targets[1, 100:300] = -100
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            loss = summed_cross_entropy(hidden, weight, targets, fused=True)
        loss.backward()
        h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().to(dtype).double().requires_grad_()
        ref = torch.nn.functional.cross_entropy((h64 @ w64.T).flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
        ref.backward()
        name = str(dtype).split(".")[1]
        record[f"{name}_loss_rel"] = abs(loss.item() - ref.item()) / abs(ref.item())
        record[f"{name}_dhidden_rel"] = _rel(hidden.grad, h64.grad)
        record[f"{name}_dweight_rel"] = _rel(weight.grad, w64.grad)
    return record


CHECKS = {"models": models, "graph_vs_eager": graph_vs_eager, "no_host_sync": no_host_sync, "graphed_generate": graphed_generate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--positions", default=",".join(POSITIONS))
    parser.add_argument("--only", default=",".join(CHECKS), help=f"checks to run per pair, of {','.join(CHECKS)}")
    parser.add_argument("--only-loss", action="store_true", help="only the fused loss against float64")
    parser.add_argument("--out", default="out/bench/check_cuda.json")
    args = parser.parse_args()
    checks = [CHECKS[name] for name in args.only.split(",")]
    report = {"environment": environment(), "command": " ".join(sys.argv), "results": []}
    try:
        report["fused_loss"] = fused_loss()
    except Exception as error:
        report["fused_loss"] = {"error": "".join(traceback.format_exception(error))[-2000:]}
    print(json.dumps({"fused_loss": report["fused_loss"]})[:800], flush=True)
    write_json(args.out, report)
    if args.only_loss:
        return 0
    for mixer in args.mixers.split(","):
        for position in args.positions.split(","):
            record = {"mixer": mixer, "position": position}
            for check in checks:
                try:
                    record |= check(args.data, mixer, position, args.steps) if check is graph_vs_eager else check(mixer, position)
                except Exception as error:
                    torch.cuda.synchronize()
                    record[f"{check.__name__}_error"] = "".join(traceback.format_exception(error))[-2000:]
            report["results"].append(record)
            print(json.dumps({k: v for k, v in record.items() if not k.startswith("loss_") and not k.endswith("_sync")})[:600], flush=True)
            write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
