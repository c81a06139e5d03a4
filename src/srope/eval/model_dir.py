"""Find and load a trained model folder: ``run/model`` (weights, config, tokenizer) and the
run's ``train_config.json`` beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

AUTOCAST_DTYPES = ("auto", "float32", "bfloat16")


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The folder holding ``config.json``: ``path`` itself, or ``path/model`` for a run folder."""
    folder = Path(path).expanduser()
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
            return json.loads(file.read_text())
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


def load_model(model_dir: Path, device: torch.device):
    """``AutoModelForCausalLM.from_pretrained`` in float32, in eval mode, on ``device`` (no network)."""
    import srope.models  # noqa: F401  (registers model_type "srope" with the Auto classes)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    return model.to(device).eval()


def has_tokenizer(model_dir: Path) -> bool:
    return (model_dir / "tokenizer_config.json").is_file() or (model_dir / "tokenizer.json").is_file()
