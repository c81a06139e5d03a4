"""Check every host × position encoding as a model on CUDA against the CPU float32 reference.

For each of the 12 pairs, a 2-layer model at the 370M layer geometry (GLA hidden 1024 ×
4 heads; GDN 8 heads of 128; FoX/attention 16 heads of 64) is built once on the CPU and
copied to the GPU. Compared (relative RMS error, as fla's get_err_ratio):

- forward logits and the gradients of all parameters together, float32 (fla's kernels use
  TF32: about 5e-3 is expected) and under bf16 autocast; the three parameters with the
  largest relative errors are listed too (small, cancelling gradients such as the phase
  generator's amplify kernel rounding);
- a packed batch (``cu_seqlens``, 3 documents) against the documents run one by one on CUDA;
- prefill + cached token-by-token decoding against the full forward on CUDA (float32).

    python benchmarks/check_cuda_models.py --out out/bench/models_cuda_h200.json

``--dry-run`` compares the CPU with itself at tiny sizes (plumbing only).
"""

from __future__ import annotations

import argparse
import copy
import traceback

import torch

from common import environment, write_json
from srope.models import SRopeConfig, SRopeForCausalLM
from srope.models.cache import CACHE_FIELD

GEOMETRY = {
    "gla": dict(hidden_size=1024, num_heads=4, use_short_conv=True),
    "gated_deltanet": dict(hidden_size=1024, num_heads=8, head_dim=128),
    "forgetting_attn": dict(hidden_size=1024, num_heads=16),
    "attention": dict(hidden_size=1024, num_heads=16),
}
POSITIONS = {"nope": "nope", "rope": {"type": "rope", "theta": 500000.0}, "selective_rope": {"type": "selective_rope", "bias": True}}
TOL_FP32, TOL_BF16 = 5e-3, 3e-2


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


def check_pair(mixer: str, position, device, dry_run: bool) -> dict:
    geometry = GEOMETRY[mixer] if not dry_run else {"hidden_size": 32, "num_heads": 2}
    config = SRopeConfig(mixer=mixer, position=position, vocab_size=512, num_hidden_layers=2, initializer_range=0.05, **geometry)
    torch.manual_seed(0)
    cpu_model = SRopeForCausalLM(config).float()
    with torch.no_grad():  # trained-like position-encoding weights
        for name, param in cpu_model.named_parameters():
            if ".position." in name:
                param.add_(0.3 * torch.randn_like(param))
    gpu_model = copy.deepcopy(cpu_model).to(device)
    length = 40 if dry_run else 300
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
    limits = {"fp32_logits": TOL_FP32, "fp32_grads": TOL_FP32, "bf16_logits": TOL_BF16, "bf16_grads": TOL_BF16, "packed_vs_separate": TOL_FP32, "decode_vs_full": TOL_FP32}
    out["passed"] = all(out[k] <= v for k, v in limits.items() if k in out)  # NaN fails
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="out/bench/models_cuda_h200.json")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    report = {"environment": environment(), "tolerances": {"fp32": TOL_FP32, "bf16": TOL_BF16}, "results": []}
    for mixer in GEOMETRY:
        for name, position in POSITIONS.items():
            record = {"mixer": mixer, "position": name}
            try:
                record |= check_pair(mixer, position, device, args.dry_run)
            except Exception as error:
                record |= {"passed": False, "error": "".join(traceback.format_exception_only(error)).strip()[-800:]}
            report["results"].append(record)
            print(record, flush=True)
            write_json(args.out, report)
    report["all_passed"] = all(r["passed"] for r in report["results"])
    write_json(args.out, report)
    return 0 if report["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
