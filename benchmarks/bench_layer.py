"""Layer-level benchmark: every host layer × position encoding at the 370M layer shapes,
forward and forward+backward under bf16 autocast (float32 weights, as in training), and a
breakdown of the GLA + Selective RoPE layer into projections, angle generator, rotation and
kernel.

    python benchmarks/bench_layer.py --out out/bench/layer_h200.json

writes the JSON and a markdown table beside it. ``--dry-run`` runs tiny sizes on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import traceback

import torch

from common import environment, graph_ms, median_ms, position_configs, write_json
from srope.layers import Attention, ForgettingAttention, GatedDeltaNet, GatedLinearAttention
from srope import backend
from srope.ops import gla, selective_rope
from srope.ops.layout import RowLayout

HOSTS = {
    "gla": (GatedLinearAttention, dict(num_heads=4, expand_k=0.5, expand_v=1.0, use_short_conv=True)),
    "gated_deltanet": (GatedDeltaNet, dict(num_heads=8, head_dim=128, expand_v=1.0)),
    "forgetting_attn": (ForgettingAttention, dict(num_heads=16)),
    "attention": (Attention, dict(num_heads=16)),
}
POSITIONS = position_configs(rope={"theta": 500000.0})
# GLA + Selective RoPE once more with the generator and rotation on PyTorch's routes and fla's
# pieces as before (srope.backend "fla"): what srope's kernels save, in the same run.
TORCH = "selective_rope_torch"


def build(host: str, position, hidden: int, dry_run: bool, device):
    cls, options = HOSTS[host]
    if dry_run:
        options = {**options, "num_heads": 2, **({"head_dim": 16} if host == "gated_deltanet" else {})}
    return cls(hidden_size=hidden, position=position, **options).to(device)


def time_layer(layer, x, autocast, dry_run) -> tuple[dict, callable]:
    """The timings, and the timed fwd+bwd step for more rounds (:func:`interleaved_rounds`)."""
    grad = torch.randn_like(x)

    def forward():
        with autocast:
            return layer(x)[0]

    def forward_backward():
        forward().backward(grad)

    fwd = median_ms(lambda: forward(), dry_run=dry_run)
    both = median_ms(forward_backward, dry_run=dry_run, grad_to_none=[x, *layer.parameters()])
    record = {"fwd_ms": fwd, "fwd_bwd_ms": both, "bwd_ms": both - fwd}
    if not dry_run:  # GPU time without the launch overhead (gradients accumulate across replays)
        try:
            record["fwd_bwd_ms_graph"] = graph_ms(forward_backward, replays=20)
        except Exception as error:
            torch.cuda.synchronize()
            record["graph_error"] = "".join(traceback.format_exception_only(error)).strip()[-600:]
    return record, lambda: median_ms(forward_backward, dry_run=dry_run, grad_to_none=[x, *layer.parameters()])


def _with_backend(mode: str, step):
    with backend.use(mode):
        return step()


def interleaved_rounds(timed: list[tuple[dict, callable]], rounds: int) -> None:
    """``rounds`` more eager fwd+bwd timings of every layer of one host, one layer after the
    other in each round: eager times follow the host CPU, which changes from machine to
    machine and minute to minute, so a ratio is only as good as timings taken side by side.
    Each record gets its rounds and their median as ``fwd_bwd_ms``."""
    for _ in range(rounds):
        for record, step in timed:
            record.setdefault("fwd_bwd_ms_rounds", [record["fwd_bwd_ms"]]).append(step())
    for record, _ in timed:
        if "fwd_bwd_ms_rounds" in record:
            record["fwd_bwd_ms"] = statistics.median(record["fwd_bwd_ms_rounds"])


def gla_breakdown(layer, x, autocast, dry_run) -> dict:
    """Forward+backward of each stage of GLA + Selective RoPE on its own, same inputs as inside."""
    pe = layer.position
    with torch.no_grad(), autocast:
        q = layer.q_proj(x).unflatten(-1, (layer.num_heads, layer.head_k_dim))
        k = layer.k_proj(x).unflatten(-1, (layer.num_kv_heads, layer.head_k_dim))
        v = layer.v_proj(x).unflatten(-1, (layer.num_kv_heads, layer.head_v_dim))
        phi, _ = pe.phase_increments(x, RowLayout(*x.shape[:2]))
        g = layer.log_decay(x)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, phi, g)]
    q, k, v, phi, g = leaves
    temperature = pe.temperature(torch.float32, x.device)

    def stage(fn):
        def run():
            outs = fn()
            outs = outs if isinstance(outs, tuple) else (outs,)
            torch.autograd.backward([o for o in outs if o is not None and o.requires_grad], [torch.ones_like(o) for o in outs if o is not None and o.requires_grad])

        return median_ms(run, dry_run=dry_run, grad_to_none=leaves + [x, *layer.parameters()])

    def generator():
        with autocast:
            return pe.phase_increments(x, RowLayout(*x.shape[:2]))[0]

    return {
        "generator_ms": stage(generator),
        "rotation_ms": stage(lambda: selective_rope(q, k, phi, temperature)[:2]),
        "kernel_ms": stage(lambda: gla(q, k, v, g)[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="out/bench/layer.json", help="JSON file (default: out/bench/layer.json)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--hosts", default=",".join(HOSTS))
    parser.add_argument("--rounds", type=int, default=3, help="more eager fwd+bwd rounds per host, its layers interleaved (median)")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    batch, length, hidden = (2, 64, 64) if args.dry_run else (8, 4096, 1024)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=not args.dry_run)
    report = {"environment": environment(), "shape": {"batch": batch, "length": length, "hidden": hidden}, "results": []}
    for host in args.hosts.split(","):
        runs = [*POSITIONS.items()] + ([(TORCH, POSITIONS["selective_rope"])] if host == "gla" else [])
        timed = []
        for name, position in runs:
            torch.manual_seed(0)
            record = {"host": host, "position": name}
            mode = "fla" if name == TORCH else "auto"
            try:
                with backend.use(mode):
                    layer = build(host, position, hidden, args.dry_run, device)
                    x = torch.randn(batch, length, hidden, device=device, requires_grad=True)
                    timings, step = time_layer(layer, x, autocast, args.dry_run)
                    record |= timings
                    timed.append((record, lambda step=step, mode=mode: _with_backend(mode, step)))
                    if host == "gla" and name.startswith("selective_rope"):
                        record |= gla_breakdown(layer, x, autocast, args.dry_run)
                if device == "cuda":
                    record["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
                    torch.cuda.reset_peak_memory_stats()
            except Exception as error:  # recorded, the others still run
                record["error"] = "".join(traceback.format_exception_only(error)).strip()[-600:]
            report["results"].append(record)
            print(record, flush=True)
            write_json(args.out, report)
        try:
            interleaved_rounds([(r, step) for r, step in timed if "error" not in r], args.rounds)
        except Exception as error:  # the single round above stays
            print(f"{host}: interleaved rounds failed: {error}", flush=True)
        write_json(args.out, report)
    for host in {r["host"] for r in report["results"]}:
        for key, suffix in (("fwd_bwd_ms", ""), ("fwd_bwd_ms_graph", "_graph")):
            times = {r["position"]: r.get(key) for r in report["results"] if r["host"] == host and r["position"] in POSITIONS}
            if len(times) == 3 and all(times.values()):
                report.setdefault("ratios", {}).setdefault(host, {}).update({
                    "srope_over_nope" + suffix: times["selective_rope"] / times["nope"],
                    "srope_over_rope" + suffix: times["selective_rope"] / times["rope"],
                })
    write_json(args.out, report)
    lines = ["| host | PE | fwd ms | fwd+bwd ms | fwd+bwd ms, graph | notes |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        note = r.get("error", "")
        if "generator_ms" in r:
            note = f"generator {r['generator_ms']:.2f}, rotation {r['rotation_ms']:.2f}, kernel {r['kernel_ms']:.2f} ms"
        lines.append(f"| {r['host']} | {r['position']} | {r.get('fwd_ms', float('nan')):.2f} | {r.get('fwd_bwd_ms', float('nan')):.2f} "
                     f"| {r.get('fwd_bwd_ms_graph', float('nan')):.2f} | {note} |")
    with open(args.out.replace(".json", ".md"), "w") as f:
        f.write(f"Layer fwd+bwd, B={batch} T={length} hidden={hidden}, bf16 autocast, {report['environment'].get('gpu', 'cpu')}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
