"""Atomic, resumable training checkpoints.

``DIR/checkpoints/step_{N:08d}/`` holds the model weights (``model.safetensors``, full,
unsharded), the optimiser state (``optimizer.pt``, full, keyed by parameter name),
``trainer_state.json`` (step, data position, config) and every rank's RNG states
(``rng_rank{R}.safetensors`` + ``.json``). A checkpoint is written into a ``.tmp`` folder and
renamed when complete, so the latest complete checkpoint survives a kill at any moment.
Full state dicts come from ``torch.distributed.checkpoint.state_dict`` and so work for one
process, DDP and FSDP2.

Nothing is unpickled on load: ``optimizer.pt`` holds only tensors and plain values and is
read with ``torch.load(weights_only=True)``, the rest is safetensors and JSON. A file that
cannot be read (truncated, tampered with, or not written by srope) raises
:class:`CheckpointError` naming it.
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_model_state_dict, set_optimizer_state_dict

from srope.lab.train.distributed import World

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class CheckpointError(ValueError):
    """A checkpoint file is missing or unreadable."""


def _read(path: Path, what: str, reader):
    """``reader(path)``, with any failure reported as a CheckpointError that names the file."""
    try:
        return reader(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: the checkpoint's {what} is missing; resume from another checkpoint or start again") from None
    except Exception as error:  # safetensors, torch.load and json each fail their own way on a bad file
        raise CheckpointError(
            f"{path}: cannot read the checkpoint's {what} ({type(error).__name__}: {' '.join(str(error).split())[:200]}); "
            "the file is truncated, was changed, or was not written by srope train"
        ) from error


def checkpoint_dir(out: Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step_{step:08d}"


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint under ``out``, or None."""
    folder = Path(out) / "checkpoints"
    done = sorted(p for p in folder.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / "trainer_state.json").exists())
    return done[-1] if done else None


def _save_rng_state(stem: Path) -> None:
    """This process's RNG states as ``stem.safetensors`` (tensors) and ``stem.json`` (the rest)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    tensors = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64))}
    if torch.cuda.is_available():
        tensors |= {f"cuda_{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())}
    save_file(tensors, stem.with_suffix(".safetensors"))
    rest = {"numpy": [kind, int(pos), int(has_gauss), float(cached_gaussian)], "python": [version, list(python_state), gauss_next]}
    stem.with_suffix(".json").write_text(json.dumps(rest))


def _load_rng_state(stem: Path) -> None:
    if not stem.with_suffix(".safetensors").exists() and not stem.with_suffix(".json").exists():
        return  # a rank the run did not have (resumed on more processes): it keeps its fresh state
    tensors = _read(stem.with_suffix(".safetensors"), "RNG state", load_file)
    rest = _read(stem.with_suffix(".json"), "RNG state", lambda p: json.loads(p.read_text()))
    try:
        kind, pos, has_gauss, cached_gaussian = rest["numpy"]
        version, python_state, gauss_next = rest["python"]
        numpy_state = (kind, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached_gaussian)
        cuda = [tensors[f"cuda_{i}"] for i in range(sum(k.startswith("cuda_") for k in tensors))]
        torch.set_rng_state(tensors["torch"])
        np.random.set_state(numpy_state)
        random.setstate((version, tuple(python_state), gauss_next))
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"{stem}.safetensors/.json: not an RNG state written by srope train ({error})") from error
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


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
    _save_rng_state(tmp / f"rng_rank{world.rank}")
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


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World, *, strict_optimizer: bool = True) -> dict:
    """Restore weights, optimiser and RNG states; return ``trainer_state.json``.

    ``strict_optimizer=False`` accepts a parameter without optimiser state: AdamW keeps none
    for a weight that never had a gradient (an output head that a task leaves unused)."""
    path = Path(path)
    from safetensors import safe_open

    def weights_and_aliases(file: Path):
        with safe_open(file, framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        return load_file(file), aliases

    state = _read(path / "trainer_state.json", "trainer state", lambda p: json.loads(p.read_text()))
    weights, aliases = _read(path / "model.safetensors", "model weights", weights_and_aliases)
    for name, source in aliases.items():
        weights[name] = weights[source]
    optim_state = _read(path / "optimizer.pt", "optimizer state", lambda p: torch.load(p, weights_only=True))
    try:
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
        set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=True, strict=strict_optimizer))
    except (KeyError, RuntimeError, ValueError) as error:
        raise CheckpointError(f"{path}: the checkpoint does not fit this model and optimiser ({' '.join(str(error).split())[:300]})") from error
    _load_rng_state(path / f"rng_rank{world.rank}")
    return state
