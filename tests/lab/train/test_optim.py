"""The lab's one AdamW constructor."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from srope.lab.train.optim import adamw, build_optimizer

ROOT = Path(__file__).resolve().parents[3]


def test_adamw_takes_tensors_or_groups_and_is_not_fused_on_the_cpu():
    weight, bias = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    plain = adamw([weight, bias], lr=0.1, weight_decay=0.5)
    grouped = adamw([{"params": [weight], "weight_decay": 0.5}, {"params": [bias], "weight_decay": 0.0}], lr=0.1)
    assert [g["weight_decay"] for g in plain.param_groups] == [0.5]
    assert [g["weight_decay"] for g in grouped.param_groups] == [0.5, 0.0]
    assert not plain.defaults["fused"] and not grouped.defaults["fused"]


def test_build_optimizer_keeps_norms_and_biases_undecayed():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    groups = build_optimizer(model, lr=1e-3, weight_decay=0.1).param_groups
    assert groups[0]["names"] == ["0.weight"] and groups[0]["weight_decay"] == 0.1
    assert groups[1]["names"] == ["0.bias", "1.weight", "1.bias"] and groups[1]["weight_decay"] == 0.0


def test_one_place_constructs_adamw():
    calls = [f"{path.relative_to(ROOT)}:{n}" for folder in ("src", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"optim\.AdamW\(", line)]
    assert len(calls) == 1 and calls[0].startswith("src/srope/lab/train/optim.py:"), calls
