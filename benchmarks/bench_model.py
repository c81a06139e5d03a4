"""Model-level benchmark: training tokens/s and peak memory of a preset with each position
encoding (same batch, same run), and decode latency per token after a prefill.

    python benchmarks/bench_model.py --preset gla-370m --out benchmarks/results/model_h200.json

A training step is forward + backward under bf16 autocast (float32 weights) + fused AdamW,
on random token ids; tokens/s is batch·length over the median step time (after warm-up).
Decode: prefill ``--prefill`` tokens (batch 1), then ``--decode`` cached greedy steps; the
median milliseconds per step. ``--dry-run`` runs a tiny preset on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

from common import environment, write_json
from srope.models import SRopeForCausalLM, preset_config
from srope.models.modeling import CACHE_FIELD
from srope.train.optim import build_optimizer

POSITIONS = {"nope": "nope", "rope": {"type": "rope", "theta": 500000.0}, "selective_rope": {"type": "selective_rope"}}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def training_speed(model, batch: int, length: int, steps: int, warmup: int, device, autocast) -> dict:
    optimizer = build_optimizer(model, lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, length + 1), device=device)
    times = []
    for i in range(warmup + steps):
        sync(device)
        start = time.perf_counter()
        with autocast:
            logits = model(ids[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    step = statistics.median(times)
    return {"step_s": step, "tokens_per_s": batch * length / step, "loss": loss.item()}


@torch.no_grad()
def decode_latency(model, prefill: int, steps: int, device, autocast) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (1, prefill), device=device)
    with autocast:
        out = model(ids, use_cache=True)
    cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        with autocast:
            out = model(token, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        cache = getattr(out, CACHE_FIELD)
    return {"decode_ms_per_token": statistics.median(times[2:] or times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gla-370m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/model_h200.json")
    parser.add_argument("--dry-run", action="store_true", help="gla-tiny on the CPU, tiny sizes")
    args = parser.parse_args()
    if args.dry_run:
        args.preset, args.batch, args.length, args.steps, args.warmup, args.prefill, args.decode = "gla-tiny", 2, 32, 2, 1, 16, 4
    device = torch.device("cpu" if args.dry_run else "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    report = {"environment": environment(), "preset": args.preset, "batch": args.batch, "length": args.length, "results": []}
    for name, position in POSITIONS.items():
        record = {"position": name}
        try:
            torch.manual_seed(0)
            model = SRopeForCausalLM(preset_config(args.preset, position=position)).to(device)
            record["parameters"] = sum(p.numel() for p in model.parameters())
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            record |= training_speed(model, args.batch, args.length, args.steps, args.warmup, device, autocast)
            if device.type == "cuda":
                record["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            model.eval()
            record |= decode_latency(model, args.prefill, args.decode, device, autocast)
            del model
        except Exception as error:
            record["error"] = "".join(traceback.format_exception_only(error)).strip()[-600:]
        report["results"].append(record)
        print(record, flush=True)
        write_json(args.out, report)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    by = {r["position"]: r for r in report["results"] if "error" not in r}
    if len(by) == 3:
        report["ratios"] = {
            "train_tokens_per_s_srope_over_nope": by["selective_rope"]["tokens_per_s"] / by["nope"]["tokens_per_s"],
            "decode_ms_srope_over_rope": by["selective_rope"]["decode_ms_per_token"] / by["rope"]["decode_ms_per_token"],
        }
    write_json(args.out, report)
    lines = ["| PE | params | train tok/s | peak GB | decode ms/token |", "|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['position']} | error: {r['error'][:80]} | | | |")
        else:
            lines.append(f"| {r['position']} | {r['parameters'] / 1e6:.1f}M | {r['tokens_per_s']:,.0f} | {r.get('peak_gb', float('nan')):.1f} | {r['decode_ms_per_token']:.2f} |")
    with open(args.out.replace(".json", ".md"), "w") as f:
        f.write(f"{args.preset}, batch {args.batch} x {args.length}, bf16 autocast, {report['environment'].get('gpu', 'cpu')}; decode after {args.prefill} tokens\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
