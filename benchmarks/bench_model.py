"""Model-level benchmark: training tokens/s and peak memory of a preset with each position
encoding (same batch, same run), and decode latency per token after a prefill.

    python benchmarks/bench_model.py --preset gla-370m --out out/bench/model_h200.json

A training step is forward + backward under bf16 autocast (float32 weights) + fused AdamW,
on random token ids; tokens/s is batch·length over the median step time (after warm-up).
Decode: prefill ``--prefill`` tokens (batch 1), then ``--decode`` cached greedy steps; the
median milliseconds per step. On CUDA both are measured again with the whole step captured
as a CUDA graph (``benchmarks/graphs.py``; ``--no-graphs`` skips it), with the graphed
decode checked against the eager one on the first steps. ``--dry-run`` runs a tiny preset
on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

from common import environment, position_configs, write_json
from graphs import GraphedGreedyDecode, GraphedTrainStep
from srope.models import SRopeForCausalLM, preset_config
from srope.models.cache import CACHE_FIELD, SRopeCache
from srope.lab.train.optim import build_optimizer

POSITIONS = position_configs(rope={"theta": 500000.0})


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


def graphed_training_speed(model, batch: int, length: int, steps: int) -> dict:
    optimizer = build_optimizer(model, lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, length + 1), device="cuda")
    graphed = GraphedTrainStep(model, optimizer, ids)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = graphed.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step = statistics.median(times)
    return {"graph_step_s": step, "graph_tokens_per_s": batch * length / step, "graph_loss": loss.item()}


def _copy_cache(cache: SRopeCache) -> SRopeCache:
    copy = SRopeCache(len(cache))
    copy.layers = [state.map(torch.clone) for state in cache.layers]
    copy.seen_tokens, copy.embedded_prompt = cache.seen_tokens, cache.embedded_prompt
    return copy


@torch.no_grad()
def graphed_decode_latency(model, prefill: int, steps: int, autocast, check_steps: int = 8) -> dict:
    """Greedy decoding after a prefill with the step replayed from a CUDA graph; its first
    ``check_steps`` logits compared with eager decoding from a copy of the same cache."""
    ids = torch.randint(0, model.config.vocab_size, (1, prefill), device="cuda")
    with autocast:
        out = model(ids, use_cache=True)
    cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
    eager_cache, eager_token, eager_logits = _copy_cache(cache), token.clone(), []
    for _ in range(check_steps):
        with autocast:
            step_out = model(eager_token, cache=eager_cache, use_cache=True)
        eager_logits.append(step_out.logits.float())
        eager_token, eager_cache = step_out.logits[:, -1:].argmax(-1), getattr(step_out, CACHE_FIELD)
    graphed = GraphedGreedyDecode(model, cache, token)
    diffs, times = [], []
    for i in range(max(steps, check_steps)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = graphed.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        if i < check_steps:
            diffs.append(float((logits.float() - eager_logits[i]).abs().max()))
    return {"graph_decode_ms_per_token": statistics.median(times[2:] or times),
            "graph_decode_max_logit_diff_vs_eager": max(diffs), "graph_decode_checked_steps": check_steps}


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


def _attempt(name: str, fn, *args) -> dict:
    """``fn(*args)``, or ``{name + "_error": message}`` if it raises (a capture can fail
    where eager mode works; the eager numbers still count)."""
    try:
        return fn(*args)
    except Exception as error:
        torch.cuda.synchronize()
        return {f"{name}_error": "".join(traceback.format_exception_only(error)).strip()[-600:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gla-370m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--out", default="out/bench/model.json", help="JSON file (default: out/bench/model.json)")
    parser.add_argument("--dry-run", action="store_true", help="gla-tiny on the CPU, tiny sizes")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph measurements")
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
            graphs = device.type == "cuda" and not args.no_graphs
            if graphs:
                record |= _attempt("graph_train", graphed_training_speed, model, args.batch, args.length, args.steps)
            model.eval()
            record |= decode_latency(model, args.prefill, args.decode, device, autocast)
            if graphs:
                record |= _attempt("graph_decode", graphed_decode_latency, model, args.prefill, args.decode, autocast)
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
        for key, ratio, a, b in (("graph_tokens_per_s", "graph_train_tokens_per_s_srope_over_nope", "selective_rope", "nope"),
                                 ("graph_decode_ms_per_token", "graph_decode_ms_srope_over_rope", "selective_rope", "rope")):
            if key in by[a] and key in by[b]:
                report["ratios"][ratio] = by[a][key] / by[b][key]
    write_json(args.out, report)
    lines = ["| PE | params | train tok/s | peak GB | decode ms/token | train tok/s, graph | decode ms/token, graph |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['position']} | error: {r['error'][:80]} | | | | | |")
        else:
            lines.append(f"| {r['position']} | {r['parameters'] / 1e6:.1f}M | {r['tokens_per_s']:,.0f} | {r.get('peak_gb', float('nan')):.1f} "
                         f"| {r['decode_ms_per_token']:.2f} | {r.get('graph_tokens_per_s', float('nan')):,.0f} "
                         f"| {r.get('graph_decode_ms_per_token', float('nan')):.3f} |")
    with open(args.out.replace(".json", ".md"), "w") as f:
        f.write(f"{args.preset}, batch {args.batch} x {args.length}, bf16 autocast, {report['environment'].get('gpu', 'cpu')}; decode after {args.prefill} tokens\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
