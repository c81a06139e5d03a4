"""torch.compile of whole models: graph breaks, and compiled training steps against eager.

For every host × position encoding (a 2-layer model; tiny on the CPU, the 370M layer
geometry of check_cuda.py on CUDA under bf16 autocast):

- ``torch._dynamo.explain`` of the loss on a dense batch: graphs, graph breaks and, per
  reason, the innermost srope frame where it happened;
- the loss and every parameter's gradient from ``torch.compile`` (backend ``--backend``;
  ``fullgraph=True`` where explain found no break) against eager (relative error of all
  gradients together), the graphs it compiled, the host syncs traced into them (tensors
  read as Python numbers) and the first compiled call's seconds (``compile_seconds``:
  compiling the forward and backward, and running them once); on CUDA beside it the scale
  of bf16 autocast's own error, eager under autocast against eager float32
  (``eager_bf16_vs_fp32``, with ``--bf16-scale``);
- with ``--layouts dense,padded,packed``, the same for a left-padded and a packed batch
  (``cu_seqlens``: eager sizes its per-document rows from it, compiled code uses the
  batch's length, a static shape).

    python benchmarks/check_compile.py --out FILE [--device cuda] [--backend inductor] [--layouts dense,padded]
        [--mixers gla,attention] [--positions selective_rope] [--no-explain]

On the CPU (``--device cpu --backend aot_eager``) it is the compile test of
``tests/models/test_compile.py``.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback

import torch
from torch._dynamo.testing import CompileCounterWithBackend

from common import environment, position_configs, write_json
from srope.models import SRopeConfig, SRopeForCausalLM
from srope.registry import mixers

MIXERS = tuple(mixers)
POSITIONS = position_configs(selective_rope={"bias": True})
TINY = dict(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=61, initializer_range=0.2)
GEOMETRY = {  # as check_cuda.py
    "gla": dict(hidden_size=1024, num_heads=4),
    "gated_deltanet": dict(hidden_size=1024, num_heads=8, head_dim=128),
    "forgetting_attn": dict(hidden_size=1024, num_heads=16),
    "attention": dict(hidden_size=1024, num_heads=16),
}


def build(mixer: str, position: str, device: str, seed: int = 0) -> SRopeForCausalLM:
    torch.manual_seed(seed)
    options = dict(mixer=mixer, position=POSITIONS[position], **TINY)
    if device != "cpu":
        options |= dict(GEOMETRY[mixer], vocab_size=1024, initializer_range=0.05)  # as check_cuda.py
    if mixer in ("gla", "gated_deltanet"):
        options["use_short_conv"] = True
    return SRopeForCausalLM(SRopeConfig(**options)).to(device).train()


def batch(model: SRopeForCausalLM, layout: str, device: str) -> tuple[torch.Tensor, dict]:
    """Token ids and the model's layout arguments: dense [2, T], left-padded, or packed [1, 2T]."""
    length = 12 if device == "cpu" else 512
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, length), generator=generator).to(device)
    if layout == "padded":
        mask = torch.ones(2, length, dtype=torch.long, device=device)
        mask[1, : length // 3] = 0
        return ids, {"attention_mask": mask}
    if layout == "packed":
        return ids.reshape(1, -1), {"cu_seqlens": torch.tensor([0, length // 2, 2 * length], dtype=torch.int32, device=device)}
    return ids, {}


def _loss_fn(model, kwargs, device, autocast=True):
    def loss(ids):
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast and device == "cuda"):
            return model(input_ids=ids, labels=ids, **kwargs).loss
    return loss


def graph_breaks(model, ids, kwargs, device) -> dict:
    """Graphs, breaks, and the reasons with the innermost srope frame of each."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_loss_fn(model, kwargs, device))(ids)
    reasons = collections.Counter()
    for reason in explained.break_reasons:
        frames = [f"{frame.filename.split('src/')[-1]}:{frame.lineno}" for frame in reason.user_stack or () if "srope" in frame.filename]
        reasons[(str(reason.reason).split("\n")[0][:160], frames[-1] if frames else None)] += 1
    return {"graphs": explained.graph_count, "breaks": explained.graph_break_count,
            "reasons": [{"reason": text, "where": where, "count": count} for (text, where), count in reasons.items()]}


def compiled_against_eager(model, ids, kwargs, device, backend, fullgraph, bf16_scale=False) -> dict:
    """Relative errors of the compiled loss and gradients against eager: all parameters
    together, and the worst single parameter (the embedding's gradient dominates the first)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    loss = _loss_fn(model, kwargs, device)
    want = loss(ids)
    want_grads = torch.autograd.grad(want, params)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    start = time.perf_counter()
    got = torch.compile(loss, backend=counter, fullgraph=fullgraph)(ids)
    got_grads = torch.autograd.grad(got, params)
    seconds = time.perf_counter() - start  # the first call: compiling the forward and backward, and running them once
    record = {"fullgraph": fullgraph, "compiled_graphs": counter.frame_count, "host_syncs": _host_syncs(counter.graphs),
              "compile_seconds": round(seconds, 1),
              **_errors(got, got_grads, want, want_grads, named)}
    if device == "cuda" and bf16_scale:  # the scale of bf16 autocast's own error: eager under autocast against eager float32
        full = _loss_fn(model, kwargs, device, autocast=False)(ids)
        record["eager_bf16_vs_fp32"] = _errors(want, want_grads, full, torch.autograd.grad(full, params), named)
    return record


def _host_syncs(graphs) -> int:
    """Tensor-to-Python scalar reads traced into the graphs. fullgraph=True does not refuse
    them: it keeps a data-dependent size as an unbacked symbol, a device-to-host copy at run
    time."""
    return sum(node.op == "call_method" and node.target in ("item", "tolist")
               or node.op == "call_function" and node.target is torch.ops.aten._local_scalar_dense.default
               for graph in graphs for node in graph.graph.nodes)


def _errors(got, got_grads, want, want_grads, named) -> dict:
    flat = lambda grads: torch.cat([g.float().flatten() for g in grads])
    got, want = got.detach().float(), want.detach().float()
    each = {name: float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
            for (name, _), a, b in zip(named, got_grads, want_grads)}
    worst = max(each, key=each.get)
    return {"loss_error": float((got - want).abs() / want.abs()),
            "grad_error": float((flat(got_grads) - flat(want_grads)).norm() / flat(want_grads).norm()),
            "worst_param_error": each[worst], "worst_param": worst}


def check(mixer, position, device, backend, layouts=("dense",), bf16_scale=False, explain=True) -> dict:
    """Per layout: the breaks, and the compiled step against eager. ``explain=False`` skips
    explain's extra trace and compiles with ``fullgraph=True``, which raises at any break."""
    model = build(mixer, position, device)
    record = {"mixer": mixer, "position": position}
    for layout in layouts:
        ids, kwargs = batch(model, layout, device)
        record[layout] = breaks = graph_breaks(model, ids, kwargs, device) if explain else {}
        fullgraph = not explain or breaks["breaks"] == 0
        breaks.update(compiled_against_eager(model, ids, kwargs, device, backend, fullgraph, bf16_scale))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--layouts", default="dense", help="of dense, padded, packed")
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--positions", default=",".join(POSITIONS))
    parser.add_argument("--no-explain", action="store_true", help="skip explain's trace; compile with fullgraph=True (raises at a break)")
    parser.add_argument("--bf16-scale", action="store_true",
                        help="on CUDA also eager float32 (fla's float32 kernels autotune: minutes on a cold cache)")
    args = parser.parse_args()
    report = {**environment(), "device": args.device, "backend": args.backend, "results": []}
    for mixer in args.mixers.split(","):
        for position in args.positions.split(","):
            try:
                record = check(mixer, position, args.device, args.backend, tuple(args.layouts.split(",")), args.bf16_scale,
                               explain=not args.no_explain)
            except Exception as error:  # recorded, and the other pairs still run
                record = {"mixer": mixer, "position": position, "error": repr(error)[:500], "trace": traceback.format_exc()[-2000:]}
            print(record, flush=True)
            report["results"].append(record)
            write_json(args.out, report)


if __name__ == "__main__":
    main()
