"""``srope demo``: an end-to-end smoke run of the op and the position-encoding modules.

It checks, on fresh random inputs, the three facts the library rests on and prints a
table: the RoPE trick (gated linear attention on rotated q/k with pair-tied decay equals
the complex Λ_t R_t recurrence), RoPE as the special case φ ≡ 1, and that prefill plus
token-by-token decoding equals one full pass for every position encoding.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from srope.modules import build_position_encoding
from srope.ops import reference, selective_rope


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def run_demo(out: str = "out/demo", device: str = "cpu", seed: int = 0) -> dict:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible")
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    batch, length, heads, pairs, hidden = 2, 64, 2, 8, 32
    q, k, v = rand(batch, length, heads, 2 * pairs), rand(batch, length, heads, 2 * pairs), rand(batch, length, heads, 4)
    phi, temperature = rand(batch, length, heads, pairs), rand(pairs).abs()
    log_decay = -rand(batch, length, heads, pairs).abs()
    q_rot, k_rot, _ = selective_rope(q, k, phi, temperature)
    real, _ = reference.gated_linear_attention_recurrence(q_rot, k_rot, v, torch.cat([log_decay, log_decay], -1))
    complex_out = reference.complex_rotation_recurrence(q, k, v, temperature * phi, log_decay.exp())
    checks = {"rope_trick_rel_err": _rel(real, complex_out)}

    ones = torch.ones_like(phi)
    rope_temp = reference.rope_inverse_frequencies(2 * pairs, 10000.0).to(device)
    as_srope = selective_rope(q, k, ones, rope_temp, offset=-torch.ones(batch, heads, pairs, dtype=torch.float64, device=device))[0]
    rope_module = build_position_encoding("rope", hidden_size=hidden, num_heads=heads, head_dim=2 * pairs)
    checks["rope_special_case_rel_err"] = _rel(rope_module(q, k, None)[0], as_srope)

    x = rand(batch, length, hidden).float()
    for kind in ("nope", "rope", "selective_rope"):
        module = build_position_encoding(kind, hidden_size=hidden, num_heads=heads, head_dim=2 * pairs).to(device)
        full_q, _, _ = module(q.float(), k.float(), x)
        parts, state = [], None
        for t0, t1 in [(0, 40)] + [(t, t + 1) for t in range(40, length)]:
            out_q, _, state = module(q[:, t0:t1].float(), k[:, t0:t1].float(), x[:, t0:t1], state=state, use_cache=True)
            parts.append(out_q)
        checks[f"decode_vs_prefill_{kind}_rel_err"] = _rel(torch.cat(parts, 1), full_q)

    width = max(len(name) for name in checks)
    print(f"srope demo (smoke run, device={device}, seed={seed})")
    for name, value in checks.items():
        print(f"  {name:<{width}}  {value:.2e}")
    result = {"task": "smoke", "device": device, "seed": seed, "seconds": round(time.perf_counter() - start, 3), "checks": checks}
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {path / 'results.json'}")
    failed = {name: value for name, value in checks.items() if not value < 1e-5}
    if failed:
        raise SystemExit(f"checks failed: {failed}")
    return result
