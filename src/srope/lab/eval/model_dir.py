"""Find and load a trained model folder: ``run/model`` (weights, config, tokenizer) and the
run's ``train_config.json`` beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from srope.lab.train.corpus import read_json

AUTOCAST_DTYPES = ("auto", "float32", "bfloat16")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The folder holding ``config.json``: ``path`` itself, or ``path/model`` for a run folder."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"model folder {os.fspath(path)!r} does not exist: expected a model folder (RUN/model) or a run folder of `srope train`")
    if (folder / "config.json").is_file():
        return folder
    if (folder / "model" / "config.json").is_file():
        return folder / "model"
    raise ValueError(f"{os.fspath(path)!r} is not a model folder: expected config.json in it or in its model/ subfolder (a finished `srope train` run)")


def find_train_config(model_dir: Path) -> dict | None:
    """The run's ``train_config.json`` (in the model folder or the run folder above it), or None."""
    for folder in (model_dir, model_dir.parent):
        file = folder / "train_config.json"
        if file.is_file():
            return read_json(file, "the run's settings, written by `srope train`")
    return None


def resolve_device(device: str) -> torch.device:
    if not isinstance(device, str):
        raise TypeError(f"device must be a string ('auto', 'cpu', 'cuda', 'cuda:N'), got {type(device).__name__}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        where = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from err
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but no CUDA GPU is visible")
    return where


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``dtype``: ``auto`` = bfloat16 on CUDA, none (float32) elsewhere.

    Weights always stay in float32 (as trained), so fixed spectra and phases are not quantised.
    """
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype must be one of {AUTOCAST_DTYPES}, got {dtype!r}")
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def check_weights(model_dir: Path) -> list[Path]:
    """The weight files of ``model_dir``, each checked to be readable; a missing or damaged one is
    an error that names it (transformers' own errors name neither the file nor the cause)."""
    from safetensors import SafetensorError, safe_open

    found = [model_dir / name for name in WEIGHT_FILES if (model_dir / name).is_file()]
    if not found:
        raise FileNotFoundError(
            f"no model weights in {model_dir}: expected model.safetensors (written by `srope train` when a run ends, "
            "or by save_pretrained); an unfinished run has only checkpoints"
        )
    files = []
    for file in found:
        if file.name.endswith(".index.json"):
            index = read_json(file, "a sharded checkpoint's index (weight_map: name -> file)")
            if not isinstance(index.get("weight_map"), dict):
                raise ValueError(f"{file} has no weight_map; expected a sharded checkpoint's index (weight_map: name -> file)")
            for shard in sorted(set(index["weight_map"].values())):
                if not (model_dir / shard).is_file():
                    raise FileNotFoundError(f"{model_dir / shard} is missing: {file.name} lists it as a shard of the weights")
                files.append(model_dir / shard)
        else:
            files.append(file)
    for file in files:
        if file.suffix != ".safetensors":
            continue
        try:
            with safe_open(os.fspath(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as err:
            raise ValueError(
                f"{file} is not a readable safetensors file ({err}; {file.stat().st_size:,} bytes): expected the complete "
                "weights saved by `srope train` or save_pretrained; a copy cut short looks like this, so copy or export it again"
            ) from err
    return files


def read_model_config(model_dir: Path) -> dict:
    """``model_dir/config.json``, checked to describe an srope model (``model_type`` "srope"):
    another library's config would load another library's model, which srope cannot score."""
    file = model_dir / "config.json"
    config = read_json(file, "the model's configuration, written by save_pretrained")
    if config.get("model_type") != "srope":
        found = f"has model_type {config['model_type']!r}, not 'srope'" if "model_type" in config else "has no model_type (expected 'srope')"
        raise ValueError(f"{file} {found}: srope scores models that `srope train` (or srope.models' save_pretrained) wrote")
    return config


def load_model(model_dir: Path, device: torch.device):
    """``AutoModelForCausalLM.from_pretrained`` in float32, in eval mode, on ``device`` (no network).

    A folder whose weights are missing, damaged or do not match its ``config.json`` is a
    ValueError/FileNotFoundError that names the file, never a model with random weights.
    """
    import srope.models  # noqa: F401  (registers model_type "srope" with the Auto classes)
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    read_model_config(model_dir)
    files = check_weights(model_dir)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a small model loads at once; an error stays one line
    try:
        # mismatched shapes are reported in `info` (and refused below) rather than raised as a RuntimeError
        model, info = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, local_files_only=True, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except (OSError, SafetensorError, ValueError) as err:
        names = ", ".join(os.fspath(file) for file in files)
        raise ValueError(f"could not load the model in {model_dir} from {model_dir / 'config.json'} and {names}: {err}") from err
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    mismatched = [f"{key} {list(saved)} in the weights, {list(expected)} by the config" for key, saved, expected in info.get("mismatched_keys") or []]
    for kind, keys in (("missing keys", info.get("missing_keys")), ("unexpected keys", info.get("unexpected_keys")), ("shapes", mismatched)):
        keys = sorted(map(str, keys or []))
        if keys:
            shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
            raise ValueError(
                f"the weights in {', '.join(os.fspath(file) for file in files)} do not match {model_dir / 'config.json'}: "
                f"{kind}: {shown}; expected the files of one save_pretrained"
            )
    return model.to(device).eval()


def check_model(model_dir: Path) -> None:
    """Refuse what :func:`load_model` refuses, for a caller whose own loader would accept it
    (lm-eval's HFLM loads another library's model, or random weights for missing ones): the
    model is loaded once on the CPU and dropped, since only loading it tells its weights match."""
    load_model(model_dir, torch.device("cpu"))


def has_tokenizer(model_dir: Path) -> bool:
    return (model_dir / "tokenizer_config.json").is_file() or (model_dir / "tokenizer.json").is_file()
