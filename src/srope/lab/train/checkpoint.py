"""Atomic, resumable training checkpoints.

``DIR/checkpoints/step_{N:08d}/`` holds the model weights (``model.safetensors``, full,
unsharded), the optimiser state (``optimizer.pt``, full, keyed by parameter name),
``trainer_state.json`` (step, data position, config), every rank's RNG states
(``rng_rank{R}.safetensors`` + ``.json``) and, written last, ``manifest.json``: the size and
sha256 of every other file. A checkpoint is written into a ``.tmp`` folder, its files and the
folder are synced to disk, and it is renamed when complete, so the latest complete checkpoint
survives a kill or a power loss at any moment; a write that fails (a full disk) removes the
``.tmp`` folder and raises :class:`CheckpointError`. Full state dicts come from
``torch.distributed.checkpoint.state_dict`` and so work for one process, DDP and FSDP2.

:func:`usable_checkpoint` picks the checkpoint to resume from: the newest whose files match
its manifest, with a warning for each newer one skipped. Nothing is unpickled on load:
``optimizer.pt`` holds only tensors and plain values and is read with
``torch.load(weights_only=True)``, the rest is safetensors and JSON. A file that cannot be
read or does not hold what srope writes raises :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_model_state_dict, set_optimizer_state_dict

from srope.lab.train.distributed import World

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
MANIFEST = "manifest.json"
_REQUIRED = ("model.safetensors", "optimizer.pt", "trainer_state.json")


class CheckpointError(ValueError):
    """A checkpoint cannot be written, or a file of one is missing, unreadable or not what srope writes."""


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


def _complete(out: Path) -> list[Path]:
    """The complete (renamed) checkpoints under ``out``, oldest first."""
    folder = Path(out) / "checkpoints"
    return sorted(p for p in folder.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / "trainer_state.json").exists())


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint under ``out``, or None (not verified: see :func:`usable_checkpoint`)."""
    done = _complete(out)
    return done[-1] if done else None


def usable_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint under ``out`` whose files match its manifest; None when there is
    no checkpoint. Each newer one that does not match is skipped with a warning naming it and
    why; when none matches, CheckpointError lists them all."""
    skipped = []
    for path in reversed(_complete(out)):
        try:
            verify_checkpoint(path)
        except CheckpointError as error:
            skipped.append((path, error))
            continue
        for bad, error in skipped:
            warnings.warn(f"skipping checkpoint {bad}: {error}; resuming from {path}", stacklevel=2)
        return path
    if skipped:
        reasons = "; ".join(str(error) for _, error in skipped)
        raise CheckpointError(f"no usable checkpoint under {Path(out) / 'checkpoints'}: {reasons}; start again in another --out")
    return None


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless every file in ``path``'s manifest has its recorded size and sha256.
    A checkpoint written before manifests existed is accepted with a warning."""
    manifest = Path(path) / MANIFEST
    if not manifest.exists():
        warnings.warn(f"{path}: no {MANIFEST} (written by an older srope): its files are not verified", stacklevel=3)
        return
    listed = _read(manifest, "manifest", lambda p: json.loads(p.read_text()))
    files = listed.get("files") if isinstance(listed, dict) else None
    if not isinstance(files, dict) or not set(_REQUIRED) <= set(files):
        raise CheckpointError(f"{manifest}: not a manifest written by srope (a 'files' object listing {', '.join(_REQUIRED)})")
    for name, entry in files.items():
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in {MANIFEST} but missing")
        if _digest(file) != entry:
            raise CheckpointError(f"{file}: its size or sha256 differs from {MANIFEST} (the file changed after it was written)")


def remove_unfinished(out: Path) -> list[Path]:
    """Remove the ``.tmp`` folders of checkpoints whose writing never finished; return them.
    Only for the one process that writes checkpoints into ``out``."""
    stale = sorted((Path(out) / "checkpoints").glob("step_*.tmp"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _digest(file: Path, sync: bool = False) -> dict:
    """The size and sha256 of ``file``; ``sync`` also flushes it to disk."""
    digest, size = hashlib.sha256(), 0
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
            size += len(block)
        if sync:
            os.fsync(f.fileno())
    return {"sha256": digest.hexdigest(), "bytes": size}


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(folder: Path) -> None:
    """Sync every file of ``folder`` to disk, then write and sync its manifest, then the folder."""
    files = {p.name: _digest(p, sync=True) for p in sorted(folder.iterdir())}
    with (folder / MANIFEST).open("w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _sync_folder(folder)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the sealed ``tmp`` to ``final`` and make the rename itself durable."""
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    _sync_folder(final.parent)


@contextlib.contextmanager
def _writing(final: Path, tmp: Path):
    """A failed write (a full disk: OSError from Python and safetensors, RuntimeError from
    torch.save) removes ``tmp`` and becomes one CheckpointError that says where to go on from."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as error:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(final.parent.parent)
        raise CheckpointError(
            f"{final}: cannot write the checkpoint ({type(error).__name__}: {' '.join(str(error).split())[:200]}); "
            f"free space on the disk (or fix the cause) and continue with --resume, from {previous or 'step 0'}"
        ) from error


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
    with _writing(final, tmp):
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
            _seal(tmp)
            _publish(tmp, final)
    if world.is_main:
        for old in _complete(out)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    world.barrier()
    return final


_KINDS = {int: "an integer", dict: "a JSON object", list: "a list", (int, float): "a number"}


def _check_state(state, file: Path, fields: dict) -> None:
    """``state`` is an object with a non-negative integer ``step`` and each of ``fields`` (name: type)."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found {type(state).__name__}; the file was changed or not written by srope")
    for name, kind in {"step": int, **fields}.items():
        value = state.get(name)
        if name not in state:
            problem = f"{name!r} is missing"
        elif isinstance(value, bool) or not isinstance(value, kind) or (name == "step" and value < 0):
            problem = f"{name!r} must be {'a non-negative integer' if name == 'step' else _KINDS.get(kind, kind)}, found {json.dumps(value)[:60]}"
        else:
            continue
        raise CheckpointError(f"{file}: {problem}; the file was changed or not written by srope")


def _weights(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` with the tied names its ``aliases`` metadata records."""
    from safetensors import safe_open

    def read(file: Path):
        with safe_open(file, framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        return load_file(file), aliases

    weights, aliases = _read(file, "model weights", read)
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise CheckpointError(f"{file}: its 'aliases' metadata must map tensor names to tensor names; the file was changed or not written by srope")
    missing = sorted(set(aliases.values()) - set(weights))
    if missing:
        raise CheckpointError(f"{file}: its 'aliases' metadata names tensors the file does not hold ({', '.join(missing)}); "
                              "the file was changed or not written by srope")  # fmt: skip
    return weights | {name: weights[source] for name, source in aliases.items()}


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World, *, strict_optimizer: bool = True,
                    fields: dict | None = None) -> dict:  # fmt: skip
    """Restore weights, optimiser and RNG states; return ``trainer_state.json``, checked to
    hold a step and each of ``fields`` (name: type). Verify ``path`` first
    (:func:`usable_checkpoint`): this reads the files as they are.

    ``strict_optimizer=False`` accepts a parameter without optimiser state: AdamW keeps none
    for a weight that never had a gradient (an output head that a task leaves unused)."""
    path = Path(path)
    state = _read(path / "trainer_state.json", "trainer state", lambda p: json.loads(p.read_text()))
    _check_state(state, path / "trainer_state.json", fields or {})
    weights = _weights(path / "model.safetensors")
    optim_state = _read(path / "optimizer.pt", "optimizer state", lambda p: torch.load(p, weights_only=True))
    try:
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
        set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=True, strict=strict_optimizer))
    except (KeyError, RuntimeError, ValueError) as error:
        raise CheckpointError(f"{path}: the checkpoint does not fit this model and optimiser ({' '.join(str(error).split())[:300]})") from error
    _load_rng_state(path / f"rng_rank{world.rank}")
    return state
