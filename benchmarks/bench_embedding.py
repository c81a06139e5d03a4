"""What the token embedding's deterministic weight gradient costs (``srope.models.embedding``):
forward + backward of ``srope.models.embedding.Embedding`` against ``nn.Embedding`` (PyTorch's
atomic-add backward), eager and replayed from a CUDA graph, at the shapes srope's runs use:

* ``gla-370m``: ``srope train --preset gla-370m``'s step, 8 x 4096 tokens, 32,000 x 1024;
* ``st-gla-s2``: GLA S2 at the authors' recipe, 1024 x 129 tokens of a handful of ids, width 384
  (every row's sum has ~33,000 terms: where atomics contend most);
* ``mqar-512``: MQAR at sequence 512, batch 128, vocabulary 8,192, width 256.

Beside each: the HBM floor of the backward (read the output gradient and the ids, write the
weight gradient) at the copy rate measured in the same run, and whether the deterministic
weight gradient repeats bitwise over ``--repeats`` calls (the atomic one's spread is printed).

    python benchmarks/bench_embedding.py --out out/bench/embedding.json [--dry-run]
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import environment, graph_ms, median_ms, write_json
from torch import nn

from srope.models.embedding import Embedding

SHAPES = {  # name: (vocabulary, width, batch, length)
    "gla-370m": (32_000, 1024, 8, 4096),
    "st-gla-s2": (4, 384, 1024, 129),  # S2: two group elements, BOS and PAD
    "mqar-512": (8_192, 256, 128, 512),
}
DRY = {"gla-370m": (64, 16, 2, 32), "st-gla-s2": (4, 8, 4, 9), "mqar-512": (32, 8, 2, 16)}


def copy_rate(device: str) -> float | None:
    """Bytes a second of a device-to-device copy (read + write) of 1 GiB, None on the CPU."""
    if device != "cuda":
        return None
    src = torch.empty(1 << 28, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def measure(shape: tuple[int, int, int, int], args, rate: float | None) -> dict:
    vocab, width, batch, length = shape
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (batch, length), device=device, generator=gen)
    grad = torch.randn(batch, length, width, device=device, generator=gen)
    row = {"shape": {"vocab": vocab, "width": width, "batch": batch, "length": length}}
    for label, cls in (("nn.Embedding", nn.Embedding), ("srope Embedding", Embedding)):
        torch.manual_seed(0)
        module = cls(vocab, width).to(device)

        def step(module=module):
            module.weight.grad = None
            module(ids).backward(grad)

        timing = {"eager_ms": median_ms(step, dry_run=args.dry_run)}
        if device == "cuda":
            timing["graph_ms"] = graph_ms(step)
        grads = []
        for _ in range(args.repeats):
            step()
            grads.append(module.weight.grad.clone())
        timing["repeats_bitwise"] = all(torch.equal(grads[0], g) for g in grads[1:])
        timing["spread_between_repeats"] = max(float((grads[0] - g).abs().max()) for g in grads)
        row[label] = timing
    # the reads of the output gradient (float32) and ids (int64), the write of the weight gradient
    floor_bytes = batch * length * (width * 4 + 8) + vocab * width * 4
    row["floor_bytes"] = floor_bytes
    if rate:
        row["floor_ms"] = floor_bytes / rate * 1e3
    for key in ("eager_ms", "graph_ms"):
        if key in row["srope Embedding"]:
            row[f"{key}_ratio"] = row["srope Embedding"][key] / row["nn.Embedding"][key]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=5, help="backward calls compared bitwise")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    parser.add_argument("--out", default="out/bench/embedding.json")
    args = parser.parse_args()
    names = [n for n in args.shapes.split(",") if n]
    unknown = sorted(set(names) - set(SHAPES))
    if unknown or not names:
        parser.error(f"--shapes: expected names among {', '.join(SHAPES)}, got {args.shapes!r}")
    if args.repeats < 2:
        parser.error(f"--repeats: expected at least 2 (a comparison), got {args.repeats}")
    table = DRY if args.dry_run else SHAPES
    rate = copy_rate("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    rows = {}
    for name in names:
        rows[name] = measure(table[name], args, rate)
        r = rows[name]
        print(f"{name}: nn.Embedding {r['nn.Embedding']['eager_ms']:.3f} ms, srope {r['srope Embedding']['eager_ms']:.3f} ms eager"
              + (f"; graph {r['nn.Embedding']['graph_ms']:.3f} / {r['srope Embedding']['graph_ms']:.3f} ms" if "graph_ms" in r["nn.Embedding"] else "")
              + (f"; floor {r['floor_ms']:.3f} ms" if "floor_ms" in r else "")
              + f"; bitwise over repeats: nn {r['nn.Embedding']['repeats_bitwise']}, srope {r['srope Embedding']['repeats_bitwise']}"
              + f" (nn spread {r['nn.Embedding']['spread_between_repeats']:.2e})", flush=True)
    write_json(args.out, {"environment": environment(), "copy_bytes_per_s": rate, "shapes": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
