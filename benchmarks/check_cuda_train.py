"""GPU checks of srope train's CUDA-graph step, for every host x position encoding:

* the graph step equals the eager step (``cuda_graph=off``): losses and final weights of a
  few steps of ``train()`` on the same data;
* a graph-mode run stopped and resumed equals the uninterrupted graph-mode run (bitwise);
* the eager forward + backward of a fixed-shape batch does not synchronise with the host
  (``torch.cuda.set_sync_debug_mode("error")``), nor does a one-token decode step;
* ``generate`` with decoding replayed from CUDA graphs equals eager ``generate`` on a
  left-padded batch.

    python benchmarks/check_cuda_train.py --data STORE --out out/bench/check_train.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from common import environment, write_json
from safetensors.torch import load_file

from srope.models import SRopeForCausalLM, preset_config
from srope.models.cache import CACHE_FIELD
from srope.train.trainer import TrainConfig, train

MIXERS = {"gla": "gla-tiny", "gated_deltanet": "gdn-tiny", "forgetting_attn": "fox-tiny", "attention": "transformer-tiny"}
POSITIONS = ("nope", "rope", "selective_rope")
SIZE = {"hidden_size": 256, "num_heads": 2}


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def graph_vs_eager(data: str, mixer: str, position: str, steps: int) -> dict:
    base = dict(preset=MIXERS[mixer], position=position, data=data, max_steps=steps, seq_len=256, global_batch_size=8,
                eval_rows=8, tensorboard=False, checkpoint_every=1000, model=dict(SIZE))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train(TrainConfig(**base, cuda_graph="off"), root / "eager")
        train(TrainConfig(**base, cuda_graph="on"), root / "graph")
        train(TrainConfig(**base, cuda_graph="on"), root / "split", stop_after=steps // 2 + 1)
        train(TrainConfig(**base, cuda_graph="on"), root / "split", resume=True)
        eager, graph, split = (_losses(root / name) for name in ("eager", "graph", "split"))
        weights = {name: load_file(root / name / "model" / "model.safetensors") for name in ("eager", "graph", "split")}
    worst_weight = max(_rel(weights["graph"][k], weights["eager"][k]) for k in weights["eager"])
    return {
        "loss_eager": eager,
        "loss_graph": graph,
        "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(graph, eager)),
        "worst_weight_rel_diff": worst_weight,
        "resume_bitwise": split == graph and all(torch.equal(weights["split"][k], weights["graph"][k]) for k in weights["graph"]),
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--positions", default=",".join(POSITIONS))
    parser.add_argument("--only-loss", action="store_true", help="only the fused loss against float64")
    parser.add_argument("--out", default="out/bench/check_train.json")
    args = parser.parse_args()
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
            for check in (graph_vs_eager, no_host_sync, graphed_generate):
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
