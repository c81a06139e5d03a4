"""What users run, timed: ``srope train`` itself and ``model.generate``, beside fla's
``GLAForCausalLM`` at the same configuration in the same run.

* ``srope train`` runs as a subprocess, exactly as a user starts it (default flags plus the
  batch shape; ``--mode eager`` adds ``--set cuda_graph=off``, ``--mode compile`` adds
  ``--set compile=true``, ``--mode checkpointing`` ``--set activation_checkpointing=true``); tokens/s is the median over its own ``metrics.jsonl`` after the
  first ``--skip`` steps (autotuning, the graph's warm-up and capture), peak memory its
  ``peak_gib``.
* fla's ``GLAForCausalLM`` (hidden, layers, heads, expand_k/v and short conv of the preset),
  float32 weights, bf16 autocast, fused AdamW, its own loss ``model(input_ids=ids,
  labels=ids).loss``, eager; the same batch shape on random tokens.
* ``model.generate`` (greedy, batch 1, a prompt of ``--prompt`` tokens, ``--new`` tokens),
  ms per new token: srope's model for each position encoding and fla's.

    python benchmarks/bench_train.py --data STORE --out out/bench/train.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from common import environment, train_cli, write_json
from srope.lab.train.optim import adamw


def srope_train(args, position: str, mode: str) -> dict:
    """One ``srope train`` run in a subprocess; its own metrics."""
    command = [sys.executable, "-m", "srope", "train", "--preset", args.preset, "--position", position, "--data", args.data,
               "--max-steps", str(args.steps),
               "--set", f"global_batch_size={args.batch}", "--set", f"micro_batch_size={args.batch}", "--set", f"seq_len={args.length}",
               "--set", f"checkpoint_every={10 * args.steps}", "--set", "eval_rows=8", "--set", "tensorboard=false"]  # fmt: skip
    command += {"default": [], "eager": ["--set", "cuda_graph=off"], "compile": ["--set", "compile=true"],
                "checkpointing": ["--set", "activation_checkpointing=true"]}[mode]
    return {"position": position, "mode": mode} | train_cli(command, timeout=args.timeout, skip=args.skip)


def fla_config(preset: str):
    from fla.models import GLAConfig

    from srope.models import PRESETS

    c = PRESETS[preset].config
    return GLAConfig(hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"], num_heads=c["num_heads"],
                     expand_k=c["expand_k"], expand_v=c["expand_v"], use_short_conv=c["use_short_conv"], vocab_size=c["vocab_size"])  # fmt: skip


def fla_train(args) -> dict:
    """fla's GLA model, eager, its own loss, the same step as srope train's."""
    from fla.models import GLAForCausalLM

    torch.manual_seed(0)
    model = GLAForCausalLM(fla_config(args.preset)).cuda()
    optimizer = adamw(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.length), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    timed = times[args.skip :]
    record = {"model": "fla GLAForCausalLM", "tokens_per_s": args.batch * args.length / statistics.median(timed),
              "step_s": statistics.median(timed), "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss)}  # fmt: skip
    del model, optimizer
    torch.cuda.empty_cache()
    return record


def generate_ms(model, args, vocab: int) -> dict:
    """Greedy ``generate``: ms per new token (prompt's prefill subtracted by timing 1 new token too)."""
    torch.manual_seed(1)
    prompt = torch.randint(3, vocab, (1, args.prompt), device="cuda")
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(new: int) -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kwargs)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt + new, out.shape
        return time.perf_counter() - began

    run(args.new)  # warm-up: autotuning, graph capture
    # interleaved, so that a slow phase of the machine hits both alike
    ones, fulls = zip(*((run(1), run(args.new)) for _ in range(args.generate_repeats)))
    # the median of the pairs' differences: a prefill that varies from call to call (it runs
    # eagerly, host-bound) moves both times of a pair alike
    per_token = statistics.median(1e3 * (full - one) / (args.new - 1) for one, full in zip(ones, fulls))
    return {"generate_ms_per_token": per_token, "generate_s": statistics.median(fulls), "prefill_and_first_s": statistics.median(ones),
            "generate_s_all": [round(t, 5) for t in fulls], "prefill_and_first_s_all": [round(t, 5) for t in ones]}


def decode_kernels(model, args, vocab: int) -> dict:
    """The CUDA kernels of one eager decoding step after the prompt (what a graphed step
    replays): how many, and their summed GPU time. A replayed step of tiny kernels costs
    about their count times the GPU's per-kernel overhead, so this says where ms/token goes."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(1)
    device = next(model.parameters()).device
    prompt = torch.randint(3, vocab, (1, args.prompt), device=device)
    graphs = getattr(model, "decode_graphs", None)
    if graphs is not None:
        model.decode_graphs = False
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(prompt, use_cache=True)
            cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(2):  # warm: autotuning and lazy initialisation
                model(token, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize(device) if device.type == "cuda" else None
            with profile(activities=[ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]) as prof:
                model(token, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize(device) if device.type == "cuda" else None
    finally:
        if graphs is not None:
            model.decode_graphs = graphs
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"decode_kernels": len(kernels), "decode_kernel_ms": sum(e.time_range.elapsed_us() for e in kernels) / 1e3}


def srope_generate(args, position: str) -> dict:
    from srope.models import SRopeForCausalLM, preset_config

    torch.manual_seed(0)
    model = SRopeForCausalLM(preset_config(args.preset, position=position)).cuda().eval()
    record = {"position": position} | generate_ms(model, args, model.config.vocab_size)  # the default: graphed decoding
    record |= {("decode_error" if k == "error" else k): v for k, v in _attempt(decode_kernels, model, args, model.config.vocab_size).items()}
    model.decode_graphs = False
    record |= {f"{k}_eager": v for k, v in generate_ms(model, args, model.config.vocab_size).items()}
    del model
    torch.cuda.empty_cache()
    return record


def fla_generate(args) -> dict:
    from fla.models import GLAForCausalLM

    torch.manual_seed(0)
    model = GLAForCausalLM(fla_config(args.preset)).cuda().eval()
    record = {"model": "fla GLAForCausalLM"} | generate_ms(model, args, model.config.vocab_size)
    record |= {("decode_error" if k == "error" else k): v for k, v in _attempt(decode_kernels, model, args, model.config.vocab_size).items()}
    del model
    torch.cuda.empty_cache()
    return record


def _attempt(fn, *fn_args) -> dict:
    try:
        return fn(*fn_args)
    except Exception as error:
        torch.cuda.synchronize()
        return {"error": "".join(traceback.format_exception_only(error)).strip()[-800:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a prepared token store (srope data prepare prints it)")
    parser.add_argument("--preset", default="gla-370m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--skip", type=int, default=4, help="first steps left out of the median")
    parser.add_argument("--positions", default="nope,selective_rope")
    parser.add_argument("--modes", default="default,eager", help="default (what srope train does), eager (cuda_graph=off), compile, checkpointing (activation checkpointing); '' for none")
    parser.add_argument("--generate-positions", default="nope,rope,selective_rope")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--generate-repeats", type=int, default=7, help="timed generate runs of each length (median)")
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of the training jobs, one of each per round (fla's number moved 14%% between two runs of the same code)")
    parser.add_argument("--timeout", type=int, default=400)
    parser.add_argument("--out", default="out/bench/train.json")
    args = parser.parse_args()
    report = {"environment": environment(), "command": " ".join(sys.argv), "args": vars(args), "train": [], "generate": []}
    if args.repeats < 1 or args.generate_repeats < 1:
        parser.error("--repeats and --generate-repeats must be >= 1")
    train_jobs = [("train", srope_train, (args, p, m)) for m in args.modes.split(",") if m for p in args.positions.split(",") if p]
    if not args.no_fla:
        train_jobs.append(("train", fla_train, (args,)))
    jobs = [(kind, fn, fn_args, round_) for round_ in range(args.repeats) for kind, fn, fn_args in train_jobs]
    if not args.no_generate:
        jobs += [("generate", srope_generate, (args, p), 0) for p in args.generate_positions.split(",")]
        if not args.no_fla:
            jobs.append(("generate", fla_generate, (args,), 0))
    for kind, fn, fn_args, round_ in jobs:
        record = _attempt(fn, *fn_args) | {"round": round_}
        if "error" in record:
            record |= {"job": fn.__name__, "args": [a for a in fn_args if isinstance(a, str)]}
        report[kind].append(record)
        print(json.dumps({k: v for k, v in record.items() if k not in ("loss", "report")}), flush=True)
        write_json(args.out, report)
    lines = ["| train | mode | tokens/s (median of rounds) | min – max | peak GiB | wall s |", "|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in report["train"]:
        groups.setdefault((r.get("position", r.get("model", r.get("job"))), r.get("mode", "eager")), []).append(r)
    for (name, mode), rows in groups.items():
        speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r] or [float("nan")]
        lines.append(f"| {name} | {mode} | {statistics.median(speeds):,.0f} | {min(speeds):,.0f} – {max(speeds):,.0f} "
                     f"| {max(r.get('peak_gib', float('nan')) for r in rows):.1f} | {sum(r.get('wall_s', 0.0) for r in rows):.0f} |")
    lines += ["", "| generate | ms/token | ms/token, decode_graphs off | kernels per decode step | their GPU ms |", "|---|---|---|---|---|"]
    for r in report["generate"]:
        lines.append(f"| {r.get('position', r.get('model', r.get('job')))} | {r.get('generate_ms_per_token', float('nan')):.2f} "
                     f"| {r.get('generate_ms_per_token_eager', float('nan')):.2f} | {r.get('decode_kernels', '—')} "
                     f"| {r.get('decode_kernel_ms', float('nan')):.3f} |")
    table = "\n".join(lines)
    Path(args.out).with_suffix(".md").write_text(f"{report['environment'].get('gpu')}, commit {report['environment']['commit']}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
