"""Scoring the demo's models: predictions, sequence accuracy and its curve over length, and
the demo's targets."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from srope.lab.demo.config import GROUP, POSITIONS
from srope.lab.tasks import state_tracking
from srope.lab.tasks.groups import get_group


@torch.no_grad()
def predict(model: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: torch.device, bf16: bool = False) -> torch.Tensor:
    """Argmax predictions ``[N, T]`` (on the CPU) of ``model`` for token ids ``inputs [N, T]``."""
    model.eval()
    vocab = state_tracking.vocab_size(get_group(GROUP))
    preds = []
    for start in range(0, len(inputs), batch_size):
        x = torch.as_tensor(inputs[start : start + batch_size].astype(np.int64), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logits = model(x).logits
        preds.append(logits[..., :vocab].argmax(-1).cpu())
    return torch.cat(preds)


def score(preds: torch.Tensor, targets: np.ndarray) -> dict[str, Any]:
    """Sequence accuracy, token accuracy and the per-length curve of predictions vs targets.

    ``curve[t - 1]`` is the fraction of rows whose first ``t`` elements (after BOS) and BOS
    are right, ``t = 1 .. L``.
    """
    targets_t = torch.as_tensor(targets.astype(np.int64))
    curve = state_tracking.cumulative_accuracy(preds, targets_t)
    return {
        "seq_acc": state_tracking.sequence_accuracy(preds, targets_t),
        "token_acc": float((preds == targets_t).double().mean()),
        "curve": [float(v) for v in curve[1:]],
    }


def check_targets(results: dict) -> dict[str, bool]:
    """The demo's claims: Selective RoPE >= 0.99 at the training length and >= 0.9 at
    ``eval_len``; NoPE and RoPE <= 0.1 at both."""
    acc = {kind: results["results"][kind]["seq_acc"] for kind in POSITIONS}
    return {
        "selective_rope_learns": acc["selective_rope"]["train"] >= 0.99,
        "selective_rope_extrapolates": acc["selective_rope"]["eval"] >= 0.9,
        "nope_fails": max(acc["nope"].values()) <= 0.1,
        "rope_fails": max(acc["rope"].values()) <= 0.1,
    }
