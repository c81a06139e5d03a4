"""Atomic, resumable training checkpoints.

``DIR/checkpoints/step_{N:08d}/`` holds the model weights (``model.safetensors``, full,
unsharded), the optimiser state (``optimizer.pt``, full, keyed by parameter name),
``trainer_state.json`` (step, data position, config) and every rank's RNG states. A
checkpoint is written into a ``.tmp`` folder and renamed when complete, so the latest
complete checkpoint survives a kill at any moment. Full state dicts come from
``torch.distributed.checkpoint.state_dict`` and so work for one process, DDP and FSDP2.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from srope.train.distributed import World

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def checkpoint_dir(out: Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step_{step:08d}"


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint under ``out``, or None."""
    folder = Path(out) / "checkpoints"
    done = sorted(p for p in folder.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / "trainer_state.json").exists())
    return done[-1] if done else None


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _dedupe(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors refuses shared storage (tied embeddings): keep one name, record the aliases."""
    seen, kept, aliases = {}, {}, {}
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key], kept[name] = name, tensor.contiguous()
    return kept, aliases


def save_checkpoint(out: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, world: World, keep_last: int = 2) -> Path:
    """Write checkpoint ``step`` atomically (collective: every rank must call it)."""
    final = checkpoint_dir(out, step)
    tmp = final.with_name(final.name + ".tmp")
    model_state, optim_state = get_state_dict(model, optimizer, options=_FULL)
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    world.barrier()
    torch.save(_rng_state(), tmp / f"rng_rank{world.rank}.pt")
    if world.is_main:
        weights, aliases = _dedupe(model_state)
        save_file(weights, tmp / "model.safetensors", metadata={"aliases": json.dumps(aliases)})
        torch.save(optim_state, tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({**state, "step": step, "world_size": world.size}, indent=2))
    world.barrier()
    if world.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted((Path(out) / "checkpoints").glob("step_*"))[:-keep_last]:
            if not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
    world.barrier()
    return final


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict:
    """Restore weights, optimiser and RNG states; return ``trainer_state.json``."""
    path = Path(path)
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", framework="pt") as f:
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    weights = load_file(path / "model.safetensors")
    for name, source in aliases.items():
        weights[name] = weights[source]
    optim_state = torch.load(path / "optimizer.pt", weights_only=False)
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim_state, options=StateDictOptions(full_state_dict=True))
    rng = path / f"rng_rank{world.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / "trainer_state.json").read_text())
